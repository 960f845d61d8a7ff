"""Federated methods, one module each, and the protocol they implement (:mod:`.base`).

Importing this package (or anything in it, such as :mod:`fedskew.algorithms.base`) registers every
built-in method in :data:`ALGORITHMS`, so a lookup by name never depends on an import made elsewhere.
"""

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
    local,
    moon,
    scaffold,
)
from fedskew.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientContext,
    FederationInfo,
    ModelSpec,
    Replies,
    ServerContext,
    register_algorithm,
)

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClientContext",
    "FederationInfo",
    "ModelSpec",
    "Replies",
    "ServerContext",
    "centralized",
    "cim",
    "fedaf",
    "fedavg",
    "fedbn",
    "feddc",
    "feddm",
    "feddyn",
    "fedgen",
    "fednova",
    "fedopt",
    "fedprox",
    "fedseq",
    "hfldd",
    "local",
    "moon",
    "register_algorithm",
    "scaffold",
]
