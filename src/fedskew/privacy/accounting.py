"""Epsilon from the mechanisms a run applied: a thin layer over Opacus's privacy accountants (``rdp``:
Rényi DP of the sampled Gaussian mechanism, Mironov 2017 / Mironov, Talwar & Zhang 2019; ``prv``: the
privacy-loss-random-variable accountant, Gopi, Lee & Wutschitz 2021). The accounting is Opacus's; fedskew
only records which mechanism ran how often, keeps that history in the run's checkpoint, and asks for
epsilon. Needs ``pip install opacus`` (``fedskew[privacy]``).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, Literal

from fedskew.core.errors import ConfigError

Kind = Literal["rdp", "prv"]

MISSING_OPACUS = (
    "differential privacy needs Opacus's accountants, which are not installed: pip install opacus (from a clone: "
    "pip install -e '.[privacy]')"
)


def require_opacus() -> None:
    """Refuse in one line, before anything runs, where Opacus is missing."""
    if importlib.util.find_spec("opacus") is None:
        raise ConfigError(MISSING_OPACUS)


def _opacus_accountant(kind: Kind) -> Any:
    require_opacus()
    from opacus.accountants import PRVAccountant, RDPAccountant

    return {"rdp": RDPAccountant, "prv": PRVAccountant}[kind]()


class Accountant:
    """The privacy spent so far: a history of (noise multiplier, sampling rate, steps), composed by Opacus.

    ``step(z, q, n)`` records ``n`` releases of the sampled Gaussian mechanism with noise multiplier ``z``
    (noise std / sensitivity) where each contribution is included with probability ``q`` (Poisson
    sampling; ``q = 1`` for a release that uses every contribution). ``epsilon(delta)`` is the run's
    (epsilon, delta) guarantee so far; ``state()`` / ``Accountant.from_state`` carry it through a
    checkpoint exactly.
    """

    def __init__(self, kind: Kind = "rdp", history: list[tuple[float, float, int]] | None = None) -> None:
        if kind not in ("rdp", "prv"):
            raise ConfigError(f"privacy.accountant must be one of 'rdp', 'prv', got {kind!r}")
        self.kind: Kind = kind
        self.history: list[tuple[float, float, int]] = [tuple(h) for h in history or []]  # type: ignore[misc]

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` releases with this noise multiplier and sampling rate (merged with the last entry
        when they match, as Opacus does)."""
        if steps <= 0:
            return
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if noise_multiplier <= 0:
            raise ValueError(f"noise_multiplier must be > 0 to account for it, got {noise_multiplier}")
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            z, q, n = self.history[-1]
            self.history[-1] = (z, q, n + steps)
        else:
            self.history.append((float(noise_multiplier), float(sample_rate), int(steps)))

    @property
    def steps(self) -> int:
        """Releases recorded so far."""
        return sum(n for _, _, n in self.history)

    def epsilon(self, delta: float) -> float:
        """The epsilon of the releases so far at this delta (0 before any).

        ``rdp``: Opacus's ``RDPAccountant.get_epsilon``, computed as it does (the RDP of each history entry at
        Opacus's default orders, summed, then converted), with each (noise multiplier, sampling rate)'s RDP of
        one step computed once per process: a run asks for epsilon every round, for every client in local mode.
        """
        if not self.history:
            return 0.0
        if self.kind == "rdp":
            require_opacus()
            from opacus.accountants import RDPAccountant
            from opacus.accountants.analysis import rdp as analysis

            rdp = sum([_rdp_of_one_step(q, z) * n for z, q, n in self.history])
            eps, _ = analysis.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
            return float(eps)
        accountant = _opacus_accountant(self.kind)
        accountant.history = list(self.history)
        return float(accountant.get_epsilon(delta=delta))

    def copy(self) -> Accountant:
        return Accountant(self.kind, list(self.history))

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the kind and the history (plain lists, exact floats)."""
        return {"kind": self.kind, "history": [list(h) for h in self.history]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Accountant:
        return cls(state["kind"], [(float(z), float(q), int(n)) for z, q, n in state["history"]])


@functools.lru_cache(maxsize=1024)
def _rdp_of_one_step(sample_rate: float, noise_multiplier: float) -> Any:
    """The RDP of one sampled Gaussian step at Opacus's default orders (``compute_rdp`` with ``steps=1``, which
    scales linearly in the steps: Opacus's own ``compute_rdp(steps=n)`` is this times ``n``)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as analysis

    rdp = analysis.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1,
                               orders=RDPAccountant.DEFAULT_ALPHAS)
    rdp.setflags(write=False)
    return rdp


def noise_for_epsilon(target_epsilon: float, delta: float, sample_rate: float, steps: int, kind: Kind = "rdp") -> float:
    """The smallest noise multiplier (to Opacus's tolerance, 0.01 in epsilon) whose ``steps`` releases at
    ``sample_rate`` stay within ``(target_epsilon, delta)``: what ``on_target = "calibrate"`` derives before
    the run."""
    require_opacus()
    from opacus.accountants.utils import get_noise_multiplier

    return float(get_noise_multiplier(
        target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate, steps=steps, accountant=kind,
    ))
