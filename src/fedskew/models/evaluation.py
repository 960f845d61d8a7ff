"""Evaluation of a model on a labelled set, in fixed-size chunks.

Chunks have a fixed size independent of the number of workers, and each is evaluated on one thread,
so the sums are bit-identical however the chunks are spread over processes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedskew.core.device import current_compute
from fedskew.models.layout import as_model_format, is_channels_last

EVAL_CHUNK = 250
"""Test-set chunk of the engine's evaluation: single-thread inference is fastest at this batch here
(docs/performance.md). Fixed, so sums do not depend on how chunks are spread over workers."""


@dataclass
class EvalCounts:
    """Sufficient statistics of an evaluation; chunks add up."""

    correct: np.ndarray  # (L,) int64 correct predictions per true class
    total: np.ndarray  # (L,) int64 samples per true class
    loss_sum: float

    def __add__(self, other: EvalCounts) -> EvalCounts:
        return EvalCounts(self.correct + other.correct, self.total + other.total, self.loss_sum + other.loss_sum)

    @property
    def accuracy(self) -> float:
        return float(self.correct.sum() / max(int(self.total.sum()), 1))

    @property
    def loss(self) -> float:
        return self.loss_sum / max(int(self.total.sum()), 1)

    def per_class(self) -> list[float | None]:
        return [float(c / t) if t > 0 else None for c, t in zip(self.correct, self.total, strict=True)]


def evaluate_chunk(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> EvalCounts:
    """Counts for one chunk (inference mode, eval-mode layers)."""
    return _to_host([_chunk_on_device(model, x, y, torch.arange(num_classes, device=y.device))])[0]


def _chunk_on_device(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, classes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's summed loss and its correct and total counts per class, left on the device (no host sync:
    the counts compare the labels with every class instead of ``bincount``, whose output size needs one)."""
    was_training = model.training
    model.eval()
    with torch.inference_mode(), current_compute().precision().autocast():
        logits = model(as_model_format(x, is_channels_last(model)))
        loss_sum = F.cross_entropy(logits.float(), y, reduction="sum")
        pred = logits.argmax(dim=1)
        of_class = y[:, None] == classes[None, :]
        correct = (of_class & (pred == y)[:, None]).sum(dim=0)
        total = of_class.sum(dim=0)
    if was_training:
        model.train()
    return loss_sum, correct, total


def _to_host(chunks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[EvalCounts]:
    """The chunks' counts on the host, in two copies for all of them (the losses, the counts)."""
    losses = torch.stack([c[0] for c in chunks]).cpu().tolist()
    counts = torch.stack([torch.stack(c[1:]) for c in chunks]).cpu().numpy().astype(np.int64)
    return [EvalCounts(c[0], c[1], float(loss)) for loss, c in zip(losses, counts, strict=True)]


def chunk_bounds(n: int, chunk: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(n)`` in pieces of ``chunk``."""
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)]


def evaluate_model(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, chunk: int = EVAL_CHUNK
) -> EvalCounts:
    """Counts over the whole set, chunk by chunk, summed in order (read from the device once, at the end)."""
    out = EvalCounts(np.zeros(num_classes, np.int64), np.zeros(num_classes, np.int64), 0.0)
    classes = torch.arange(num_classes, device=y.device)
    parts = [_chunk_on_device(model, x[s:e], y[s:e], classes) for s, e in chunk_bounds(int(y.shape[0]), chunk)]
    for counts in _to_host(parts) if parts else []:
        out = out + counts
    return out
