"""Classification metrics computed from predicted and true labels.

These work on plain numpy arrays so that the engine, the Flower bridge and offline analysis share one
implementation, and so that no metric depends on torch's nondeterministic reductions. Accuracies are
fractions in [0, 1]; the report converts them to percent for display.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def confusion_counts(preds: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Count (true label, predicted label) pairs.

    Parameters
    ----------
    preds, labels
        1-D integer arrays of equal length with values in ``[0, num_classes)``.
    num_classes
        Number of classes L. Passed explicitly because a test set (or a round's predictions) may miss
        some classes, and the matrix must still be L x L to be comparable across rounds.

    Returns
    -------
    numpy.ndarray
        ``(L, L)`` int64 matrix ``C`` with ``C[i, j]`` the number of samples of true class ``i``
        predicted as class ``j``: row sums are class supports, the diagonal is the correct counts.

    Raises
    ------
    ValueError
        If the shapes differ, the arrays are not 1-D, or a value lies outside ``[0, num_classes)``.
    """
    p = np.asarray(preds)
    y = np.asarray(labels)
    if p.ndim != 1 or y.ndim != 1 or p.shape != y.shape:
        raise ValueError(f"preds and labels must be 1-D of equal length, got {p.shape} and {y.shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    p = p.astype(np.int64, copy=False)
    y = y.astype(np.int64, copy=False)
    for name, arr in (("preds", p), ("labels", y)):
        if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
            raise ValueError(f"{name} must lie in [0, {num_classes}), got [{arr.min()}, {arr.max()}]")
    flat = np.bincount(y * num_classes + p, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes).astype(np.int64, copy=False)


def accuracy(preds: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy: the fraction of samples whose prediction equals the label.

    Raises
    ------
    ValueError
        If the arrays differ in shape or are empty (accuracy of nothing is undefined, and returning 0
        would silently look like a broken model).
    """
    p = np.asarray(preds)
    y = np.asarray(labels)
    if p.shape != y.shape:
        raise ValueError(f"preds and labels differ in shape: {p.shape} vs {y.shape}")
    if y.size == 0:
        raise ValueError("accuracy of an empty set is undefined")
    return float(np.count_nonzero(p == y)) / y.size


def per_class_accuracy(preds: np.ndarray, labels: np.ndarray, num_classes: int) -> list[float | None]:
    """Accuracy (recall) of each class, as fractions.

    Returns
    -------
    list of float or None
        Entry ``c`` is the fraction of class-``c`` samples predicted correctly, or ``None`` when class
        ``c`` does not occur in ``labels``: an absent class has no accuracy, and using 0 would inflate
        the class variance.
    """
    counts = confusion_counts(preds, labels, num_classes)
    support = counts.sum(axis=1)
    correct = np.diag(counts)
    return [float(correct[c]) / int(support[c]) if support[c] else None for c in range(num_classes)]


def class_variance(per_class: Sequence[float | None]) -> float:
    """Population variance of the per-class accuracies, ignoring absent classes.

    This is FedDC's "class variance" for one round: how far the classes' accuracies spread around
    their mean. A model that is good on average but fails on the classes under-represented in this
    round's clients has a high class variance. The unit is that of the inputs squared (fractions here).

    Raises
    ------
    ValueError
        If no class has an accuracy.
    """
    values = np.array([v for v in per_class if v is not None], dtype=np.float64)
    if values.size == 0:
        raise ValueError("class variance needs at least one class with an accuracy")
    return float(np.var(values))


WORST_FRACTION = 0.1
"""The share of clients in the "worst 10%" figure of :func:`client_distribution`."""


def client_distribution(accuracies: Sequence[float | None]) -> dict[str, float | None]:
    """Summary of per-client accuracies (clients without a test split given as None are left out).

    Returns ``mean``, ``std`` (population std over the clients), ``worst10`` (the mean of the lowest
    ``ceil(10%)`` of the clients' accuracies, at least one client: the fairness figure of q-FFL and
    Ditto) and ``best``; all None when no client has an accuracy.
    """
    values = np.sort(np.array([v for v in accuracies if v is not None], dtype=np.float64))
    if values.size == 0:
        return {"mean": None, "std": None, "worst10": None, "best": None}
    k = max(1, math.ceil(WORST_FRACTION * values.size))
    return {
        "mean": float(values.mean()),
        "std": float(values.std()),
        "worst10": float(values[:k].mean()),
        "best": float(values[-1]),
    }
