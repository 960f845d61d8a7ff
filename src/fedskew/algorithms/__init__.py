"""Registered federated methods, one module each. Importing this package registers them all."""

from fedskew.algorithms import centralized, fedavg

__all__ = ["centralized", "fedavg"]
