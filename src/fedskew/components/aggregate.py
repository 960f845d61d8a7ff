"""Aggregators: how client updates become the new global state."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from fedskew.core.errors import FedskewError
from fedskew.core.params import check


def weighted_mean(
    items: Sequence[dict[str, torch.Tensor]], weights: Sequence[float]
) -> dict[str, torch.Tensor]:
    """Per-key weighted mean of tensor dicts (FedAvg, McMahan et al. 2017, with weights |D_k|).

    Floating tensors are averaged in float64 and cast back, in the given order, so the result does not
    depend on float32 summation order. Integer tensors (BatchNorm's ``num_batches_tracked``) take the
    maximum, which is what a counter means after averaging.
    """
    if not items:
        raise FedskewError("cannot aggregate: no client replied this round")
    total = float(sum(weights))
    if total <= 0:
        raise FedskewError(f"cannot aggregate: weights sum to {total}")
    out: dict[str, torch.Tensor] = {}
    for key, first in items[0].items():
        if first.is_floating_point():
            wide = torch.float32 if first.device.type == "mps" else torch.float64  # MPS has no float64
            acc = torch.zeros(first.shape, dtype=wide, device=first.device)
            for item, w in zip(items, weights, strict=True):
                acc.add_(item[key].to(wide), alpha=float(w) / total)
            out[key] = acc.to(first.dtype)
        else:
            out[key] = torch.stack([item[key] for item in items]).amax(dim=0)
    return out


@dataclass
class Aggregation:
    """``[algorithm.aggregation]``: how an averaging method combines the clients' models.

    Attributes
    ----------
    rule
        ``mean``: FedAvg's mean weighted by the samples each client trained on; ``median``: the
        coordinate-wise median (Yin et al., ICML 2018); ``trimmed_mean``: the coordinate-wise mean
        after cutting the ``trim`` fraction of largest and smallest values (Yin et al.). The robust
        rules are unweighted: a client's claimed sample count cannot buy it influence.
    trim
        Fraction cut at each end by ``trimmed_mean`` (at least one value when ``trim * n >= 1``).
    clip_norm
        Scale every update (client model minus global model) down to this L2 norm before combining
        (norm clipping); 0: no clipping.
    max_norm_ratio
        Reject an update whose norm exceeds this multiple of the round's median update norm (on by
        default, generous: honest non-IID updates in this project's runs stay well inside it, see
        docs/reliability.md); 0: no bound. Needs at least three updates to judge.
    """

    rule: Literal["mean", "median", "trimmed_mean"] = "mean"
    trim: float = 0.1
    clip_norm: float = 0.0
    max_norm_ratio: float = 10.0

    def __post_init__(self) -> None:
        check(0 <= self.trim < 0.5, "trim", self.trim, "in [0, 0.5)")
        check(self.clip_norm >= 0, "clip_norm", self.clip_norm, ">= 0 (0: no clipping)")
        check(self.max_norm_ratio == 0 or self.max_norm_ratio >= 1, "max_norm_ratio", self.max_norm_ratio,
              ">= 1, or 0 for no bound")


def update_norms(items: Sequence[dict[str, torch.Tensor]], reference: dict[str, torch.Tensor]) -> list[float]:
    """L2 norm of each item's floating tensors minus ``reference``'s (the update a client sent)."""
    keys = [k for k, v in items[0].items() if v.is_floating_point()] if items else []
    return [
        math.sqrt(sum(float((item[k].to(_wide(item[k])) - reference[k].to(_wide(item[k]))).pow(2).sum()) for k in keys))
        for item in items
    ]


def robust_average(
    items: Sequence[dict[str, torch.Tensor]],
    weights: Sequence[float],
    reference: dict[str, torch.Tensor],
    cfg: Aggregation,
) -> tuple[dict[str, torch.Tensor], list[tuple[int, str]]]:
    """Combine client models by ``cfg``; returns the new state and ``(index, reason)`` of each item rejected.

    With the default settings and no outlier this is exactly :func:`weighted_mean` (same arithmetic,
    so results are unchanged). ``reference`` is the global model the clients started from.
    """
    norms = update_norms(items, reference) if (cfg.max_norm_ratio > 0 and len(items) >= 3) or cfg.clip_norm else []
    rejected: list[tuple[int, str]] = []
    keep = list(range(len(items)))
    if cfg.max_norm_ratio > 0 and len(items) >= 3:
        median = statistics.median(norms)
        bound = cfg.max_norm_ratio * median
        for i, n in enumerate(norms):
            if median > 0 and n > bound:
                rejected.append((i, f"update norm {n:.4g} exceeds {cfg.max_norm_ratio:g} x the round's median "
                                    f"{median:.4g}"))
        keep = [i for i in keep if i not in {j for j, _ in rejected}]
    if not keep:
        raise FedskewError("cannot aggregate: every update was rejected")
    kept = [items[i] for i in keep]
    if cfg.clip_norm:
        kept = [_clipped(items[i], reference, norms[i], cfg.clip_norm) for i in keep]
    if cfg.rule == "mean":
        return weighted_mean(kept, [weights[i] for i in keep]), rejected
    out: dict[str, torch.Tensor] = {}
    for key, first in kept[0].items():
        if not first.is_floating_point():
            out[key] = torch.stack([item[key] for item in kept]).amax(dim=0)
            continue
        stack = torch.stack([item[key].to(_wide(item[key])) for item in kept]).sort(dim=0).values
        n = stack.shape[0]
        if cfg.rule == "median":
            value = 0.5 * (stack[(n - 1) // 2] + stack[n // 2])
        else:
            cut = int(cfg.trim * n)
            value = stack[cut : n - cut].mean(dim=0)
        out[key] = value.to(first.dtype)
    return out, rejected


def _clipped(
    item: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], norm: float, bound: float
) -> dict[str, torch.Tensor]:
    """``item`` with its update scaled down to norm ``bound`` (unchanged if already within)."""
    if norm <= bound:
        return item
    scale = bound / norm
    return {
        k: (reference[k] + (v - reference[k]) * scale) if v.is_floating_point() else v for k, v in item.items()
    }


def _wide(t: torch.Tensor) -> torch.dtype:
    """float64 for exact sums, except on MPS, which has no float64."""
    return torch.float32 if t.device.type == "mps" else torch.float64
