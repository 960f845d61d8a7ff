"""Private condensation in the aggregation-free methods (``[privacy]`` with ``mode = "condensation"``).

FedDM's and FedAF's clients condense by distribution matching against privately released class means
(:mod:`fedskew.condense.private_dm`); FedAF's class logits V_k (and the soft labels R_k = softmax(V_k / tau)
derived from them) are released the same way: each real image's logits clipped to ``knowledge_clip``
(``privacy.clip`` by default), the class sums released with N(0, (noise_multiplier * clip)^2) noise and
divided by the class counts (docs/private_condensation.md).

Each client keeps its own accountant (:class:`~fedskew.privacy.accounting.Accountant`, Opacus's) in its
client state: per round it records the matching's ``condense_iterations`` sampled Gaussian releases (at the
largest of its classes' sampling rates) and, for FedAF, one release of V_k over all its images (rate 1). A
``train`` reply says the client's epsilon so far (:data:`EPSILON`); the server keeps every client's latest
and records ``epsilon`` (the largest: the run's guarantee, per client) and ``client_epsilon`` (the list) in
the round's metrics. With ``privacy.target_epsilon`` a client whose next release would exceed it releases
nothing more: it uploads nothing (:data:`WITHHELD`) and the server keeps training on its last set.

How the table reaches a method: :func:`with_private_condensation` (called where the run's typed config is
built) hangs the ``[privacy]`` table on the algorithm's parameters, outside their fields, so that the
recorded config and every non-private run stay as they were; workers get it with the parameters.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from fedskew.algorithms.base import ALGORITHMS, ClientContext, ModelSpec, Replies, ServerContext
from fedskew.condense.distribution_matching import couples_batch
from fedskew.condense.private_dm import COUPLED, class_sample_rates
from fedskew.core.errors import ConfigError
from fedskew.core.seeding import seeded_init
from fedskew.privacy.accounting import Accountant, require_opacus
from fedskew.privacy.mechanisms import add_gaussian_noise, clip_rows, noise_stream
from fedskew.privacy.params import PrivacyParams

EPSILON = "epsilon"
"""Reply scalar of a ``train`` reply (the client's epsilon so far, at ``privacy.delta``) and round metric (the
largest over the clients)."""
CLIENT_EPSILON = "client_epsilon"
"""Round metric: every client's epsilon so far, by client id (0.0 for a client that has released nothing)."""
WITHHELD = "dp_withheld"
"""Reply scalar: 1.0 where the client's budget (``privacy.target_epsilon``) stopped it releasing; round metric:
how many clients did so this round."""
ACCOUNTANT = "dp_accountant"
"""Client-state key of the client's accountant (its :meth:`Accountant.state`)."""
_ATTRIBUTE = "_private_condensation"

MODE = 'privacy.mode = "condensation"'
REFUSALS = {
    "hfldd": f"{MODE} does not cover hfldd: besides its KIP-distilled images, HFLDD's clients upload soft labels "
             "of a model pre-trained on their raw data and its headers train on raw data (FedAvg), so private "
             "distillation alone would bound nothing (docs/private_condensation.md)",
    "feddc": f"{MODE} does not cover feddc: its clients upload model updates trained on raw data along with "
             "their condensed sets (use privacy.mode = \"sample\" or \"local\")",
}
REFUSALS["feddc_plus"] = REFUSALS["feddc"].replace("feddc:", "feddc_plus:")


def private_condensation(params: Any) -> PrivacyParams | None:
    """The ``[privacy]`` table hung on a method's parameters by :func:`with_private_condensation`, or None."""
    return getattr(params, "__dict__", {}).get(_ATTRIBUTE)


def with_private_condensation(algorithm: Any, privacy: PrivacyParams) -> Any:
    """The ``[algorithm]`` component (name, typed params) of a run whose ``[privacy]`` table has
    ``mode = "condensation"``: its params, copied, carry the table (:func:`private_condensation`). Refuses in
    one line a method without a private condensation, and the table's settings this mode cannot honour."""
    if privacy.mode != "condensation":
        return algorithm
    name = algorithm.name
    cls = ALGORITHMS.get(name)
    if not getattr(cls, "private_condensation", False):
        raise ConfigError(REFUSALS.get(name, f"{MODE} privatises the condensed uploads of feddm and fedaf; {name} "
                                             "has none (use privacy.mode = \"central\", \"local\" or \"sample\")"))
    if privacy.noise_multiplier <= 0:
        raise ConfigError(f"{MODE} needs privacy.noise_multiplier > 0, got {privacy.noise_multiplier!r}")
    if privacy.on_target == "calibrate":
        raise ConfigError(f'{MODE} takes privacy.on_target = "stop" (each client stops releasing at the budget); '
                          '"calibrate" needs every client\'s sampling rate and rounds before the run')
    require_opacus()
    cls.check_private(algorithm.params, privacy)  # type: ignore[attr-defined]  # an AggregationFree
    params = copy.copy(algorithm.params)
    object.__setattr__(params, _ATTRIBUTE, privacy)
    return dataclasses.replace(algorithm, params=params)


def check_private_model(spec: ModelSpec, seed: int) -> None:
    """Refuse (one line) a model whose embedding of one image depends on the rest of its batch."""
    if couples_batch(seeded_init(spec.build, seed, "privacy-check").train()):
        raise ConfigError(COUPLED)


def dm_sample_rate(y: torch.Tensor, real_batch: int, rate: float | None = None) -> float:
    """The rate a client's matching steps are accounted at: the largest of its classes' Poisson rates
    (:func:`~fedskew.condense.private_dm.class_sample_rates`)."""
    counts = torch.bincount(y.cpu())
    return max(class_sample_rates([int(n) for n in counts[counts > 0]], real_batch, rate))


class ClientBudget:
    """A client's accountant, kept in its state (:data:`ACCOUNTANT`), and its budget."""

    def __init__(self, privacy: PrivacyParams, state: dict[str, Any]) -> None:
        self.privacy, self.state = privacy, state
        saved = state.get(ACCOUNTANT)
        self.accountant = Accountant.from_state(saved) if saved is not None else Accountant(privacy.accountant)

    def affordable(self, releases: list[tuple[float, int]]) -> bool:
        """Whether ``releases`` ((sampling rate, steps) each, at the table's noise multiplier) keep the client
        within ``privacy.target_epsilon`` (always, without one)."""
        if self.privacy.target_epsilon is None:
            return True
        trial = Accountant.from_state(self.accountant.state())
        for rate, steps in releases:
            trial.step(self.privacy.noise_multiplier, rate, steps)
        return trial.epsilon(self.privacy.delta) <= self.privacy.target_epsilon

    def spend(self, releases: list[tuple[float, int]]) -> None:
        """Record ``releases`` and keep the accountant in the client's state."""
        for rate, steps in releases:
            self.accountant.step(self.privacy.noise_multiplier, rate, steps)
        self.state[ACCOUNTANT] = self.accountant.state()

    @property
    def epsilon(self) -> float:
        """The client's epsilon so far at ``privacy.delta`` (0.0 before any release)."""
        return self.accountant.epsilon(self.privacy.delta)


def client_noise(privacy: PrivacyParams, client: ClientContext, purpose: str) -> torch.Generator:
    """The generator a private client draws ``purpose``'s noise from: its own stream for it
    (``client.generator(purpose)``), or a secret one with ``privacy.noise_seed = "secret"``."""
    return noise_stream(privacy.noise_seed, client.fed.seed, "client", client.cid, client.round, purpose)


def private_class_sums(
    rows: torch.Tensor, y: torch.Tensor, num_classes: int, clip: float, noise_multiplier: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The classes present in ``y`` and the noisy means of their clipped ``rows``: each row clipped to
    ``clip``, the class sums (float64) released with N(0, (noise_multiplier * clip)^2) noise, divided by the
    class counts (public). Float32 rows out, one per present class, in increasing label order."""
    counts = torch.bincount(y, minlength=num_classes)
    classes = torch.nonzero(counts > 0).flatten()
    sums = torch.zeros((num_classes, rows.shape[1]), dtype=torch.float64, device=rows.device)
    sums = sums.index_add(0, y, clip_rows(rows.double(), clip))[classes]
    (noisy,) = add_gaussian_noise([sums], noise_multiplier * clip, generator)
    return classes, (noisy / counts[classes].to(noisy.dtype)[:, None]).float().contiguous()


def uploads(replies: Replies) -> Replies:
    """The replies that released something (not :data:`WITHHELD`)."""
    return [(cid, m) for cid, m in replies if not m.metrics.get(WITHHELD)]


def record_epsilons(server: ServerContext, replies: Replies, num_clients: int) -> None:
    """Keep each replying client's epsilon in the server state and put ``epsilon`` (the largest so far; also as
    ``epsilon_max``), ``epsilon_mean`` (over all clients), ``client_epsilon`` and ``dp_withheld`` in the round's
    metrics."""
    eps = list(server.state.get(CLIENT_EPSILON, [0.0] * num_clients))
    for cid, m in replies:
        if EPSILON in m.metrics:
            eps[cid] = float(m.metrics[EPSILON])
    server.state[CLIENT_EPSILON] = eps
    # The keys the client-level modes' records use (epsilon, epsilon_max, epsilon_mean), and every client's.
    server.metrics[EPSILON] = server.metrics["epsilon_max"] = max(eps)
    server.metrics["epsilon_mean"] = sum(eps) / len(eps)
    server.metrics[CLIENT_EPSILON] = list(eps)
    server.metrics[WITHHELD] = sum(1 for _, m in replies if m.metrics.get(WITHHELD))


def condensation_summary(privacy: PrivacyParams, records: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary.json``'s privacy keys of a ``privacy.mode = "condensation"`` run, from its last round's record:
    ``epsilon`` (the largest client's) and a ``privacy`` table (the mechanism's settings, ``epsilon_max``,
    ``epsilon_mean`` and every client's ``client_epsilon``), as the other modes' summaries hold them."""
    last = records[-1] if records else {}
    eps = float(last.get(EPSILON, 0.0))
    table: dict[str, Any] = {
        "mode": "condensation", "epsilon": eps, "delta": privacy.delta, "accountant": privacy.accountant,
        "noise_multiplier": privacy.noise_multiplier, "calibrated": False, "clip": privacy.clip,
        "target_epsilon": privacy.target_epsilon, "epsilon_max": eps,
        "epsilon_mean": float(last.get("epsilon_mean", 0.0)), CLIENT_EPSILON: list(last.get(CLIENT_EPSILON, [])),
    }
    return {"epsilon": eps, "privacy": table}
