"""Memory layout of models and their inputs.

Convolutional models train and infer faster in the channels-last memory format on the CPUs fedskew
is measured on (docs/performance.md). A converted model is flagged, so every place that feeds it a
batch (local training, evaluation, condensation) can put the batch in the same format.
"""

from __future__ import annotations

import torch
from torch import nn

CHANNELS_LAST_FLAG = "fedskew_channels_last"


def use_channels_last(model: nn.Module) -> nn.Module:
    """Put a convolutional model in the channels-last memory format (in place; others unchanged).

    On this CPU class a single-threaded conv training step at batch 32 runs about a third faster,
    and inference about 80% faster, in channels-last (see docs/performance.md). The model is flagged,
    so training and evaluation feed it channels-last batches.
    """
    if any(p.dim() == 4 for p in model.parameters()):
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        setattr(model, CHANNELS_LAST_FLAG, True)
    return model


def is_channels_last(model: nn.Module) -> bool:
    """Whether :func:`use_channels_last` converted this model."""
    return bool(getattr(model, CHANNELS_LAST_FLAG, False))


def as_model_format(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``x`` in the memory format of the model it is fed to."""
    if channels_last and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def shuffled_batches(
    n: int, batch_size: int, generator: torch.Generator, device: torch.device | None = None
) -> list[torch.Tensor]:
    """One epoch of shuffled index batches (the last one may be smaller).

    The order is drawn on the CPU from ``generator`` (the same draw on every device) and, with ``device``,
    moved there once for the whole epoch: the batches are views of that one copy, so a training step
    makes no host-to-device copy of its indices.
    """
    perm = torch.randperm(n, generator=generator)
    if device is not None:
        perm = perm.to(device, non_blocking=True)  # staged at once, no wait for the device (core/device.py)
    return list(perm.split(batch_size))
