"""Metrics: accuracy, per-class accuracy, class variance, round stability and the byte ledger."""

from fedskew.metrics.classification import (
    accuracy,
    class_variance,
    client_distribution,
    confusion_counts,
    per_class_accuracy,
)
from fedskew.metrics.ledger import Ledger
from fedskew.metrics.stability import (
    Stability,
    accuracy_at,
    round_stability,
    rounds_to_target,
    summarize_run,
    value_at_target,
)

__all__ = [
    "Ledger",
    "Stability",
    "accuracy",
    "accuracy_at",
    "class_variance",
    "client_distribution",
    "confusion_counts",
    "per_class_accuracy",
    "round_stability",
    "rounds_to_target",
    "summarize_run",
    "value_at_target",
]
