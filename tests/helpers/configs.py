"""Resolved run configs of the tests: the tiny federation, and the tiny federation for any algorithm."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import pytest

from fedskew.algorithms.base import ALGORITHMS
from fedskew.config import typed_config
from fedskew.engine.federation import Federation, build_federation


def tiny_config(**over: Any) -> dict[str, Any]:
    """A resolved single-run config on the synthetic dataset (about a second a round)."""
    cfg: dict[str, Any] = {
        "name": "tiny",
        "rounds": 3,
        "seed": 0,
        "workers": 1,
        "eval_every": 1,
        "checkpoint_every": 1,
        "target_accuracy": 0.5,
        "at_rounds": [2],
        "label": "tiny",
        "dataset": {"name": "synthetic", "num_train": 400, "num_test": 200, "num_classes": 4, "image_size": 8,
                    "channels": 1},
        "partition": {"name": "dirichlet", "num_clients": 6, "alpha": 0.5, "min_size": 5},
        "model": {"name": "mlp", "hidden": [32]},
        "algorithm": {"name": "fedavg", "clients_per_round": 3, "batch_size": 16, "lr": 0.1},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            base = cfg[k]
            if k == "algorithm" and v.get("name", base["name"]) != base["name"]:
                # As a config file's variant does: keep the base settings the new algorithm also has.
                fields = {f.name for f in dataclasses.fields(ALGORITHMS.get(v["name"]).Params)}
                base = {key: value for key, value in base.items() if key in fields}
            cfg[k] = {**base, **v}
        else:
            cfg[k] = v
    return cfg


# A small ConvNet with BatchNorm, so methods that treat normalisation layers specially (FedBN) or must
# handle buffers (SCAFFOLD's integer batch counter, server optimisers) are exercised.
MODEL: dict[str, Any] = {"name": "convnet", "net_width": 8, "net_depth": 2, "net_norm": "batchnorm"}

# Algorithm-table overrides for methods that cannot run on their defaults here. Keep it small: the
# point of tests/algorithms/test_all_algorithms.py is that every method runs with its paper defaults.
# The condensation methods run with their paper defaults too (about 100-220 s for two rounds here:
# K = 500 gradient-matching iterations, 1000 distribution-matching steps, 500 server epochs), so
# here they run with the same code paths scaled down.
_CONDENSE: dict[str, Any] = {"condense_iterations": 3, "ipc": 2}
SPECIAL: dict[str, dict[str, Any]] = {
    "feddc": {"condense_iterations": 3, "server": {"epochs": 2}},
    "feddc_plus": {"condense_iterations": 3, "server": {"epochs": 2}},
    "feddm": {**_CONDENSE, "server": {"epochs": 2, "batch_size": 16, "lr": 0.1}},
    "fedaf": {**_CONDENSE, "server": {"epochs": 2, "batch_size": 16, "lr": 0.1}},
}


LABEL_SKEW = ["fedlc", "fedrs", "fedntd", "fedrod", "ccvr", "feddecorr", "fedetf", "feddc_drift"]
"""Issue 48's label-skew family: each runs two rounds on every engine (tests/engine/test_label_skew_engines.py,
tests/engine/test_ray.py, tests/engine/test_flower.py, the batched runner's every-method test) and resumes
byte-identical (tests/algorithms/test_all_algorithms.py)."""


SLOW_METHODS = frozenset({"apfl", "cim", "hfldd", "pfedme"})
"""Methods whose tiny runs take several seconds where most take under one (measured on this project's 2-core
machine under pytest-xdist): in the tests that take every method, they are marked ``slow``."""


def methods(names: Iterable[str]) -> list[Any]:
    """``names`` as ``parametrize`` values, those in :data:`SLOW_METHODS` marked ``slow`` (the fast tier,
    ``pytest -m "not slow"``, leaves them out; the whole suite runs them)."""
    return [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_METHODS else name for name in names]


def config_for(name: str, **over: Any) -> dict[str, Any]:
    """The tiny config for algorithm ``name``: the tiny algorithm settings it has, plus ``SPECIAL``."""
    cfg = tiny_config(**over)
    fields = {f.name for f in dataclasses.fields(ALGORITHMS.get(name).Params)}
    shared = {k: v for k, v in cfg["algorithm"].items() if k in fields}
    cfg["algorithm"] = {"name": name, **shared, **SPECIAL.get(name, {})}
    cfg["model"] = dict(MODEL)
    return cfg


def runnable_config(name: str, **over: Any) -> dict[str, Any]:
    """:func:`config_for`, plus the clients' own test splits a method without a global model (``local``) is
    measured on: the config with which every method runs (tests/gpu runs them so on CUDA)."""
    cfg = config_for(name, **over)
    if not ALGORITHMS.get(name).has_global_model:
        cfg["partition"]["client_test_fraction"] = 0.25
    return cfg


def federation_from(cfg: dict[str, Any], seed: int = 0) -> Federation:
    """The federation of config ``cfg`` (its dataset, partition and model, typed) with root seed ``seed``."""
    typed = typed_config(cfg)
    return build_federation(typed.dataset, typed.partition, typed.model, seed)
