"""Registered federated methods, one module each. Importing this package registers them all."""

from fedskew.algorithms import (
    centralized,
    fedavg,
    fedbn,
    feddyn,
    fedgen,
    fednova,
    fedopt,
    fedprox,
    moon,
    scaffold,
)

__all__ = [
    "centralized", "fedavg", "fedbn", "feddyn", "fedgen", "fednova", "fedopt", "fedprox", "moon", "scaffold",
]
