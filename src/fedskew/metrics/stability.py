"""Round-to-round stability and convergence summaries of an accuracy curve.

FedDC (Kim & Choi, 2022) measures how much a federated model swings between rounds with three numbers
it calls "round variance": the largest drop between consecutive rounds, the mean drop and the mean
rise (Table 1, e.g. FedAvg "(-21.71) -5.59 / 5.65" in percentage points). Here they are computed on
accuracies as fractions, so -21.71 points is -0.2171; the report converts to points for display.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DIRECTION_KEYS = ("bytes_server_to_client", "bytes_client_to_server", "bytes_client_to_client")


@dataclass(frozen=True)
class Stability:
    """FedDC's round variance of one accuracy curve (fractions of accuracy).

    Attributes
    ----------
    max_drop
        The most negative change between consecutive rounds, or 0.0 if accuracy never fell. Negative,
        as the paper prints it, so that a larger magnitude reads as worse.
    mean_drop
        Mean of the negative changes only, or 0.0 if there are none. Averaging over drops alone (not
        over all rounds) is what makes it comparable between methods that fall rarely but deeply.
    mean_rise
        Mean of the positive changes only, or 0.0 if there are none.
    """

    max_drop: float
    mean_drop: float
    mean_rise: float


def round_stability(acc: Sequence[float]) -> Stability:
    """Largest drop, mean drop and mean rise of the consecutive differences ``a_t - a_{t-1}``.

    Differences of exactly zero count as neither drop nor rise. A curve with fewer than two points has
    no differences and is reported as perfectly stable (all zeros).
    """
    d = np.diff(np.asarray(acc, dtype=np.float64))
    drops = d[d < 0]
    rises = d[d > 0]
    max_drop = float(drops.min()) if drops.size else 0.0
    # A float mean of equal drops can round one ulp below their minimum: keep max <= mean <= 0.
    mean_drop = min(max(float(drops.mean()), max_drop), 0.0) if drops.size else 0.0
    return Stability(max_drop=max_drop, mean_drop=mean_drop, mean_rise=float(rises.mean()) if rises.size else 0.0)


def _first_reaching(acc: Sequence[float], target: float) -> int | None:
    """Index of the first accuracy ``>= target``, or None."""
    for i, a in enumerate(acc):
        if a >= target:
            return i
    return None


def rounds_to_target(acc: Sequence[float], target: float, rounds: Sequence[int] | None = None) -> int | None:
    """The first round whose accuracy reaches ``target`` (``>=``), or None if none does.

    Parameters
    ----------
    acc
        Accuracy per evaluated round, in round order.
    target
        Accuracy to reach, in the same unit as ``acc``.
    rounds
        Round number of each entry of ``acc``. Needed when evaluation skips rounds; by default entry
        ``i`` is round ``i + 1``.
    """
    if rounds is not None and len(rounds) != len(acc):
        raise ValueError(f"acc has {len(acc)} entries but rounds has {len(rounds)}")
    i = _first_reaching(acc, target)
    if i is None:
        return None
    return int(rounds[i]) if rounds is not None else i + 1


def value_at_target(acc: Sequence[float], cumulative: Sequence[float], target: float) -> float | None:
    """``cumulative`` at the first round whose accuracy reaches ``target``, or None.

    Used for "cost to reach X% accuracy" comparisons (HFLDD Tables II/III): pass cumulative bytes,
    seconds or samples aligned with ``acc``.
    """
    if len(cumulative) != len(acc):
        raise ValueError(f"acc has {len(acc)} entries but cumulative has {len(cumulative)}")
    i = _first_reaching(acc, target)
    return None if i is None else float(cumulative[i])


def accuracy_at(acc: Sequence[float], rounds: Sequence[int], at: Sequence[int]) -> dict[int, float | None]:
    """Accuracy at each requested round (FedDC reports rounds 100 and 500); None if not recorded."""
    if len(rounds) != len(acc):
        raise ValueError(f"acc has {len(acc)} entries but rounds has {len(rounds)}")
    by_round = {int(r): float(a) for r, a in zip(rounds, acc, strict=True)}
    return {int(r): by_round.get(int(r)) for r in at}


def summarize_run(
    records: list[dict[str, Any]], target: float | None = None, at_rounds: Sequence[int] = ()
) -> dict[str, Any]:
    """Reduce a run's per-round records to the numbers compared across methods.

    Parameters
    ----------
    records
        One dict per round with keys ``round``, ``accuracy`` and ``class_variance`` (None in rounds
        not evaluated), ``bytes_server_to_client``, ``bytes_client_to_server`` and optionally
        ``bytes_client_to_client`` (default 0). The accuracy figures come from the evaluated rounds, the
        byte totals from all. Sorted by round here, so callers may pass them in any order.
    target
        Accuracy (fraction) for ``rounds_to_target`` and ``bytes_to_target``; None skips both.
    at_rounds
        Rounds at which to report the accuracy.

    Returns
    -------
    dict
        JSON-ready: ``final_accuracy``, ``best_accuracy``, ``best_round``, ``max_drop``, ``mean_drop``,
        ``mean_rise`` (all None when no round has an accuracy), ``mean_class_variance`` (None if no round
        has one), the three byte totals,
        ``rounds_to_target``, ``bytes_to_target`` (all directions, cumulative up to and including that
        round), ``accuracy_at`` (``{str(round): accuracy or None}``; string keys because JSON needs
        them) and ``rounds`` (the number of records).
    """
    if not records:
        raise ValueError("cannot summarise a run without records")
    recs = sorted(records, key=lambda r: int(r["round"]))
    per_round = {k: [int(r.get(k, 0)) for r in recs] for k in DIRECTION_KEYS}
    cumulative = dict(zip(
        [int(r["round"]) for r in recs],
        np.cumsum(np.sum([per_round[k] for k in DIRECTION_KEYS], axis=0)).tolist(), strict=True,
    ))
    evaluated = [r for r in recs if r.get("accuracy") is not None]
    rounds = [int(r["round"]) for r in evaluated]
    acc = [float(r["accuracy"]) for r in evaluated]
    variances = [float(r["class_variance"]) for r in evaluated if r.get("class_variance") is not None]
    summary: dict[str, Any] = dict.fromkeys(
        ("final_accuracy", "best_accuracy", "best_round", "max_drop", "mean_drop", "mean_rise")
    )
    reached = None
    if acc:  # a method without a global model (``local``) has none
        best = int(np.argmax(acc))
        stab = round_stability(acc)
        reached = None if target is None else rounds_to_target(acc, target, rounds)
        summary.update(
            final_accuracy=acc[-1], best_accuracy=acc[best], best_round=rounds[best],
            max_drop=stab.max_drop, mean_drop=stab.mean_drop, mean_rise=stab.mean_rise,
        )
    summary["mean_class_variance"] = float(np.mean(variances)) if variances else None
    summary.update({k: sum(v) for k, v in per_round.items()})
    summary["rounds_to_target"] = reached
    summary["bytes_to_target"] = None if reached is None else int(cumulative[reached])
    summary["accuracy_at"] = {str(r): a for r, a in accuracy_at(acc, rounds, at_rounds).items()}
    summary["rounds"] = len(recs)
    return summary
