"""Registered federated methods, one module each. Importing this package registers them all."""

from fedskew.algorithms import (
    centralized,
    cim,
    fedaf,
    fedavg,
    fedbn,
    feddc,
    feddm,
    feddyn,
    fedgen,
    fednova,
    fedopt,
    fedprox,
    fedseq,
    hfldd,
    moon,
    scaffold,
)

__all__ = [
    "centralized", "cim", "fedaf", "fedavg", "fedbn", "feddc", "feddm", "feddyn", "fedgen", "fednova",
    "fedopt", "fedprox", "fedseq", "hfldd", "moon", "scaffold",
]
