"""Aggregators: how client updates become the new global state."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Literal

import torch

from fedskew.core.errors import FedskewError
from fedskew.core.params import Options, check, minimums


def weighted_mean(
    items: Sequence[dict[str, torch.Tensor]], weights: Sequence[float]
) -> dict[str, torch.Tensor]:
    """Per-key weighted mean of tensor dicts (FedAvg, McMahan et al. 2017, with weights |D_k|).

    Floating tensors are averaged in float64 and cast back, in the given order, so the result does not
    depend on float32 summation order. Integer tensors (BatchNorm's ``num_batches_tracked``) take the
    maximum, which is what a counter means after averaging.

    The floating tensors of each item are joined into one vector first (:func:`flatten`), so a client
    costs a few operations whatever the model (on a GPU: a few kernels, not a few a tensor); each element
    is the same sum of the same products as tensor by tensor, so the result is the same, bit for bit.
    """
    return _mean_and_norms(items, weights, None)[0]


def _mean_and_norms(
    items: Sequence[dict[str, torch.Tensor]], weights: Sequence[float], reference: dict[str, torch.Tensor] | None
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """:func:`weighted_mean`, and with a ``reference`` also :func:`update_norms`, each item joined once."""
    if not items:
        raise FedskewError("cannot aggregate: no client replied this round")
    total = float(sum(weights))
    if total <= 0:
        raise FedskewError(f"cannot aggregate: weights sum to {total}")
    first = items[0]
    keys = float_keys(first)
    out: dict[str, torch.Tensor] = {}
    norms: list[float] = [0.0] * len(items) if reference is not None else []
    if keys:
        wide = _wide(first[keys[0]])
        acc = torch.zeros(sum(first[k].numel() for k in keys), dtype=wide, device=first[keys[0]].device)
        start = flatten(reference, keys, wide) if reference is not None else None
        squares = []
        for item, w in zip(items, weights, strict=True):
            flat = flatten(item, keys, wide)
            if start is not None:
                squares.append((flat - start).pow_(2).sum())
            acc.add_(flat, alpha=float(w) / total)
        out = unflatten(acc, first, keys)
        if squares:
            norms = [math.sqrt(v) for v in torch.stack(squares).tolist()]
    for key in first:
        if key not in out:
            out[key] = torch.stack([item[key] for item in items]).amax(dim=0)
    return {key: out[key] for key in first}, norms


def float_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """The keys of ``state``'s floating-point tensors, in its order."""
    return [k for k, v in state.items() if v.is_floating_point()]


def flatten(state: dict[str, torch.Tensor], keys: Sequence[str], dtype: torch.dtype) -> torch.Tensor:
    """The tensors ``keys`` of ``state`` joined into one vector of ``dtype``, in order (exact where
    ``dtype`` is at least as wide as each of them)."""
    return torch.cat([state[k].reshape(-1) for k in keys]).to(dtype)


def unflatten(flat: torch.Tensor, like: dict[str, torch.Tensor], keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """:func:`flatten` undone: ``flat`` cut into the shapes and dtypes of ``like[keys]``."""
    parts = flat.split([like[k].numel() for k in keys])
    return {k: part.view(like[k].shape).to(like[k].dtype) for k, part in zip(keys, parts, strict=True)}


class Aggregation(Options):
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

    at_least = minimums(clip_norm=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        # A half-open range and a range with a gap: no declaration says them.
        check(0 <= self.trim < 0.5, "trim", self.trim, "in [0, 0.5)")
        check(self.max_norm_ratio == 0 or self.max_norm_ratio >= 1, "max_norm_ratio", self.max_norm_ratio,
              ">= 1, or 0 for no bound")

    def sum_only_refusal(self) -> str | None:
        """What in these settings needs every client's update on its own, which secure aggregation hides (it reveals
        only their weighted sum), as the rest of a sentence about the method, with the override that lifts it; None
        for FedAvg's weighted mean."""
        needs = "which needs every update on its own; SecAgg+ reveals only their sum"
        if self.rule != "mean":
            return (f"combines the updates by aggregation.rule = {self.rule!r}, {needs}: set "
                    "algorithm.aggregation.rule=mean")
        if self.clip_norm:
            return (f"clips each update to aggregation.clip_norm = {self.clip_norm:g}, {needs}: set "
                    "algorithm.aggregation.clip_norm=0")
        if self.max_norm_ratio:
            return (f"bounds each update by aggregation.max_norm_ratio = {self.max_norm_ratio:g} x the round's median "
                    f"norm, {needs}: set algorithm.aggregation.max_norm_ratio=0")
        return None


def update_norms(items: Sequence[dict[str, torch.Tensor]], reference: dict[str, torch.Tensor]) -> list[float]:
    """L2 norm of each item's floating tensors minus ``reference``'s (the update a client sent), summed in
    float64 (float32 on MPS); one read of the device for all items."""
    keys = float_keys(items[0]) if items else []
    if not keys:
        return [0.0] * len(items)
    wide = _wide(items[0][keys[0]])
    start = flatten(reference, keys, wide)
    squares = torch.stack([(flatten(item, keys, wide) - start).pow_(2).sum() for item in items])
    return [math.sqrt(v) for v in squares.tolist()]


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
    bounded = cfg.max_norm_ratio > 0 and len(items) >= 3
    norms: list[float] | None = None
    if cfg.rule == "mean" and bounded and not cfg.clip_norm:
        # The common case: the mean of all and the norms in one pass; redone below if one is rejected.
        mean, norms = _mean_and_norms(items, weights, reference)
        if not _outliers(norms, cfg.max_norm_ratio):
            return mean, []
    if norms is None:
        norms = update_norms(items, reference) if bounded or cfg.clip_norm else []
    rejected = _outliers(norms, cfg.max_norm_ratio) if bounded else []
    keep = [i for i in range(len(items)) if i not in {j for j, _ in rejected}]
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


def _outliers(norms: list[float], ratio: float) -> list[tuple[int, str]]:
    """``(index, reason)`` of each norm above ``ratio`` times the median norm."""
    median = statistics.median(norms)
    bound = ratio * median
    return [(i, f"update norm {n:.4g} exceeds {ratio:g} x the round's median {median:.4g}")
            for i, n in enumerate(norms) if median > 0 and n > bound]


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
