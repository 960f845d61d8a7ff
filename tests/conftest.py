"""Shared fixtures: tiny federations that run in seconds on one thread."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import torch

torch.set_num_threads(1)


def shared_datasets() -> Path | None:
    """The folder of real dataset copies, if this machine has one."""
    env = os.environ.get("FEDSKEW_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "datasets")
    for c in candidates:
        if c.is_dir():
            return c
    return None


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
                from fedskew.algorithms.base import ALGORITHMS

                fields = {f.name for f in dataclasses.fields(ALGORITHMS.get(v["name"]).Params)}
                base = {key: value for key, value in base.items() if key in fields}
            cfg[k] = {**base, **v}
        else:
            cfg[k] = v
    return cfg


@pytest.fixture
def tiny() -> dict[str, Any]:
    return tiny_config()
