"""A private run's server side (:class:`RunPrivacy`): what the round loop asks of ``[privacy]`` at its one exchange
point (:meth:`fedskew.engine.round_loop.RoundLoop.exchange`, which every engine's replies pass: the sequential
runner, the worker pool, Ray, a Flower deployment's ServerApp), the accounting, the budget, and what the run's
records, summary and checkpoint keep of it.

- ``central``: the upload task's replies become the noised mean of the clipped updates
  (:func:`~fedskew.privacy.central.noised_mean`); one accountant for the run, one sampled Gaussian release a
  round at sampling rate q = m / N (m = clients per round, N = clients).
- ``local`` and ``sample``: the upload requests tell the clients their mechanism (:mod:`fedskew.privacy.client`);
  one accountant per client: ``local`` charges each client asked to train one Gaussian release (q = 1),
  ``sample`` the DP-SGD steps its reply reports at their sampling rate.

Each round's record gets ``epsilon`` (``local``/``sample``: the largest client's, with ``epsilon_max`` and
``epsilon_mean`` over all clients) and, with adaptive clipping, ``privacy_clip`` (the clip the round used).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fedskew.core.errors import ConfigError, FedskewError
from fedskew.core.message import Message
from fedskew.privacy.accounting import Accountant, noise_for_epsilon
from fedskew.privacy.central import noised_mean
from fedskew.privacy.checks import clients_per_round_of, count_noise, spent_at_once, update_noise_multiplier
from fedskew.privacy.client import DP_SAMPLE_RATE, DP_STEPS, request_config
from fedskew.privacy.mechanisms import next_clip, noise_stream, noisy_fraction_below
from fedskew.privacy.params import PrivacyParams
from fedskew.privacy.uploads import Upload

if TYPE_CHECKING:
    from fedskew.algorithms.base import Algorithm
    from fedskew.config.schema import RunConfig

Replies = list[tuple[int, Message]]
Release = tuple[float, int]  # (sampling rate, steps) of one client's round
CLIENT_MODES = ("local", "sample")


class RunPrivacy:
    """The ``[privacy]`` mechanism of one run (``central``, ``local`` or ``sample``), its accountants and budget."""

    def __init__(self, params: PrivacyParams, upload: Upload, num_clients: int, m: int, rounds: int, seed: int) -> None:
        self.params, self.upload, self.mode = params, upload, params.mode
        self.num_clients, self.m, self.rounds, self.seed = num_clients, m, rounds, seed
        self.q = m / num_clients
        self.noise_multiplier = params.noise_multiplier
        self.calibrated = False
        self.clip = params.clip
        self.accountant = Accountant(params.accountant)  # central
        self.clients: dict[int, Accountant] = {}  # local and sample
        self.largest: Release | None = None  # sample: the largest release a client reported so far
        self.stopped: dict[str, Any] | None = None
        self._round = -1  # the round whose upload was privatised (one a round)
        self._clip_used = self.clip
        self._cache: dict[tuple[tuple[float, float, int], ...], float] = {}

    @staticmethod
    def of(config: RunConfig, algorithm: Algorithm, num_clients: int) -> RunPrivacy | None:
        """The run's mechanism (None: ``privacy.mode = "off"``; the config's checks refused the rest)."""
        p = config.privacy
        if p.mode not in ("central", *CLIENT_MODES) or not isinstance(algorithm.upload, Upload):
            return None
        m = clients_per_round_of(algorithm.params, num_clients)
        return RunPrivacy(p, algorithm.upload, num_clients, m, config.run.rounds, config.run.seed)

    # ---- before the first round -----------------------------------------------------------------------------
    def begin(self) -> None:
        """A fresh run: with ``on_target = "calibrate"``, derive the noise multiplier that spends
        ``target_epsilon`` over the planned rounds (central: q = m/N a round; local: q = 1 every round, the most a
        client can take part); then check adaptive clipping's split of it."""
        p = self.params
        if p.on_target == "calibrate" and p.target_epsilon is not None:
            q = self.q if self.mode == "central" else 1.0
            self.noise_multiplier = noise_for_epsilon(p.target_epsilon, p.delta, q, self.rounds, p.accountant)
            self.calibrated = True
        update_noise_multiplier(p, self.noise_multiplier, self.m)

    # ---- the exchange ---------------------------------------------------------------------------------------
    def requests(self, task: str, messages: list[tuple[int, Message]]) -> list[tuple[int, Message]]:
        """The upload task's requests with the clients' mechanism in their config (``local``, ``sample``); one
        message sent to several clients stays one message."""
        if self.mode not in CLIENT_MODES or task != self.upload.task:
            return messages
        extra = request_config(self.mode, self.clip, self.noise_multiplier, self.params.noise_seed)
        wrapped: dict[int, Message] = {}
        out = []
        for cid, msg in messages:
            if id(msg) not in wrapped:
                wrapped[id(msg)] = Message(msg.arrays, {**msg.config, **extra}, msg.metrics)
            out.append((cid, wrapped[id(msg)]))
        return out

    def reply_scalars(self, task: str) -> dict[str, tuple[float, float | None]]:
        """The metrics a ``sample`` upload reply must carry, with their ranges."""
        if self.mode == "sample" and task == self.upload.task:
            return {DP_STEPS: (0.0, None), DP_SAMPLE_RATE: (0.0, 1.0)}
        return {}

    def received(self, task: str, rnd: int, asked: list[int], requests: Mapping[int, Message],
                 replies: Replies) -> Replies:
        """The replies the method gets: ``central`` privatises the upload; every mode charges its accountants."""
        if task != self.upload.task:
            return replies
        if self._round == rnd:
            raise FedskewError(f"round {rnd}: the method exchanged its upload task {task!r} twice; [privacy] "
                               "accounts one upload a round")
        self._round = rnd
        z = self.noise_multiplier
        if self.mode == "central":
            self._clip_used = self.clip
            m, p = self.m, self.params
            g = noise_stream(p.noise_seed, self.seed, "privacy", rnd, "server")
            std = update_noise_multiplier(p, z, m) * self.clip
            replies, norms = noised_mean(self.upload, requests, replies, self.clip, std, m, g)
            if p.adaptive_clip:
                below = noisy_fraction_below(norms, self.clip, count_noise(p, m), g, total=m)
                self.clip = next_clip(self.clip, below, p.target_quantile, p.clip_lr)
            self.accountant.step(z, self.q)
        elif self.mode == "local":
            for cid in asked:  # every client asked to train released its noised update, whether it arrived or not
                self._client(cid).step(z, 1.0)
        else:
            got = {cid: (float(msg.metrics[DP_SAMPLE_RATE]), int(msg.metrics[DP_STEPS])) for cid, msg in replies}
            for q, steps in got.values():  # the largest rate and the most steps any client reported
                low = self.largest or (0.0, 0)
                self.largest = (max(low[0], q), max(low[1], steps))
            for cid in asked:  # a client whose reply did not arrive is charged the largest release seen
                q, steps = got.get(cid) or self.largest or (0.0, 0)
                if q > 0 and steps > 0:
                    self._client(cid).step(z, q, steps)
        return replies

    def _client(self, cid: int) -> Accountant:
        return self.clients.setdefault(cid, Accountant(self.params.accountant))

    # ---- epsilon ---------------------------------------------------------------------------------------------
    def _epsilon(self, accountant: Accountant) -> float:
        key = tuple(accountant.history)
        if key not in self._cache:
            self._cache[key] = accountant.epsilon(self.params.delta)
        return self._cache[key]

    def epsilons(self) -> list[float]:
        """Every client's epsilon so far (``local``, ``sample``; 0 for a client never asked)."""
        return [self._epsilon(self.clients[c]) if c in self.clients else 0.0 for c in range(self.num_clients)]

    def epsilon(self) -> float:
        """The run's epsilon so far: central's, or the largest client's."""
        if self.mode == "central":
            return self._epsilon(self.accountant)
        return max(self.epsilons(), default=0.0)

    def record(self) -> dict[str, Any]:
        """The round record's privacy keys (after the round's upload)."""
        if self.mode == "central":
            rec: dict[str, Any] = {"epsilon": self.epsilon()}
            if self.params.adaptive_clip:
                rec["privacy_clip"] = self._clip_used
            return rec
        eps = self.epsilons()
        return {"epsilon": max(eps, default=0.0), "epsilon_max": max(eps, default=0.0),
                "epsilon_mean": sum(eps) / len(eps) if eps else 0.0}

    def next_epsilon(self) -> float | None:
        """The epsilon the next round would reach (None: not known yet: ``sample`` before any client reported)."""
        z = self.noise_multiplier
        if self.mode == "central":
            ahead = self.accountant.copy()
            ahead.step(z, self.q)
            return self._epsilon(ahead)
        release = (1.0, 1) if self.mode == "local" else self.largest
        if release is None or release[0] <= 0 or release[1] <= 0:
            return None
        worst = 0.0
        for accountant in [*self.clients.values(), Accountant(self.params.accountant)]:  # and a client's first
            ahead = accountant.copy()
            ahead.step(z, *release)
            worst = max(worst, self._epsilon(ahead))
        return worst

    # ---- the budget ------------------------------------------------------------------------------------------
    def stops_before(self, rnd: int) -> str | None:
        """The line that ends the run before round ``rnd`` when it would exceed ``target_epsilon`` (None: it goes
        on); a fresh run whose first round would exceed it is refused in one line."""
        target = self.params.target_epsilon
        if target is None:
            return None
        ahead = self.next_epsilon()
        if ahead is None or ahead <= target:
            return None
        now = self.epsilon()
        if rnd == 1:  # the config's check refuses this before anything runs where it can (central, local)
            raise ConfigError(spent_at_once(target, ahead))
        self.stopped = {"reason": "privacy budget", "round": rnd - 1, "rounds": self.rounds, "epsilon": now,
                        "next_epsilon": ahead, "target_epsilon": target}
        return (f"privacy budget reached: epsilon {now:.2f} after round {rnd - 1} of {self.rounds}; the next round "
                f"would reach {ahead:.2f} > target_epsilon {target:g}")

    # ---- what the run keeps ----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """``summary.json``'s privacy keys: ``epsilon`` (final), a ``privacy`` table, and ``stopped`` when the
        budget ended the run."""
        p = self.params
        table: dict[str, Any] = {
            "mode": self.mode, "epsilon": self.epsilon(), "delta": p.delta, "accountant": p.accountant,
            "noise_multiplier": self.noise_multiplier, "calibrated": self.calibrated, "clip": self.clip,
            "target_epsilon": p.target_epsilon, "clients_per_round": self.m,
        }
        if self.mode == "central":
            table["sample_rate"] = self.q
            table["sampling"] = "fixed-size uniform without replacement; epsilon assumes Poisson sampling at this rate"
            # The bound that needs no sampling assumption: every round's release counted in full (q = 1).
            unsampled = Accountant(p.accountant, [(z, 1.0, n) for z, _, n in self.accountant.history])
            table["epsilon_without_sampling"] = self._epsilon(unsampled)
            if p.adaptive_clip:
                table["update_noise_multiplier"] = update_noise_multiplier(p, self.noise_multiplier, self.m)
        else:
            eps = self.epsilons()
            table["epsilon_max"] = max(eps, default=0.0)
            table["epsilon_mean"] = sum(eps) / len(eps) if eps else 0.0
        out: dict[str, Any] = {"epsilon": table["epsilon"], "privacy": table}
        if self.stopped is not None:
            out["stopped"] = dict(self.stopped)
        return out

    def state(self) -> dict[str, Any]:
        """What the checkpoint keeps: the noise multiplier (a calibrated one is not derived again), the clip, the
        accountants (every release so far) and the round of the last upload."""
        return {
            "noise_multiplier": self.noise_multiplier, "calibrated": self.calibrated, "clip": self.clip,
            "accountant": self.accountant.state(),
            "clients": {str(cid): a.state() for cid, a in sorted(self.clients.items())},
            "largest": list(self.largest) if self.largest is not None else [],
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.noise_multiplier = float(state["noise_multiplier"])
        self.calibrated = bool(state["calibrated"])
        self.clip = float(state["clip"])
        self._clip_used = self.clip
        self.accountant = Accountant.from_state(state["accountant"])
        self.clients = {int(cid): Accountant.from_state(s) for cid, s in state["clients"].items()}
        largest = state["largest"]
        self.largest = (float(largest[0]), int(largest[1])) if largest else None
        if not math.isfinite(self.noise_multiplier) or self.noise_multiplier <= 0:
            raise FedskewError(f"the checkpoint's privacy state has noise multiplier {self.noise_multiplier}")
