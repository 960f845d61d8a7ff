"""Aggregators: how client updates become the new global state."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedskew.core.errors import FedskewError


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
