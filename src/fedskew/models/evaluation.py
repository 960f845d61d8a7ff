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
    was_training = model.training
    model.eval()
    with torch.inference_mode(), current_compute().precision().autocast():
        logits = model(as_model_format(x, is_channels_last(model)))
        loss_sum = float(F.cross_entropy(logits.float(), y, reduction="sum"))
        pred = logits.argmax(dim=1)
    if was_training:
        model.train()
    yn = y.cpu().numpy()
    correct = np.bincount(yn[pred.cpu().numpy() == yn], minlength=num_classes).astype(np.int64)
    total = np.bincount(yn, minlength=num_classes).astype(np.int64)
    return EvalCounts(correct, total, loss_sum)


def chunk_bounds(n: int, chunk: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(n)`` in pieces of ``chunk``."""
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)]


def evaluate_model(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, chunk: int = EVAL_CHUNK
) -> EvalCounts:
    """Counts over the whole set, chunk by chunk, summed in order."""
    out = EvalCounts(np.zeros(num_classes, np.int64), np.zeros(num_classes, np.int64), 0.0)
    for s, e in chunk_bounds(int(y.shape[0]), chunk):
        out = out + evaluate_chunk(model, x[s:e], y[s:e], num_classes)
    return out
