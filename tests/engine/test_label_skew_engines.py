"""Issue 48's label-skew family on the worker pool: two rounds with two worker processes give the metrics of
one process, byte for byte (the Ray cluster, Flower and the batched runner: their own test files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedskew.algorithms.base import ALGORITHMS
from tests.helpers.configs import LABEL_SKEW, config_for
from tests.helpers.runs import run_records


def _metrics(cfg: dict[str, Any], path: Path) -> bytes:
    run_records(cfg, path)
    return (path / "metrics.jsonl").read_bytes()


def test_the_family_is_registered_with_its_papers() -> None:
    for name in LABEL_SKEW:
        assert ALGORITHMS.get(name).paper, name


READINGS: dict[str, dict[str, Any]] = {
    # FedDC drift with its authors' shard scaling (the partition's shard sizes) and clipped steps
    "feddc_drift:shard": {"scaling": "shard", "max_grad_norm": 10.0},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", [*LABEL_SKEW, *READINGS])
def test_two_worker_processes_give_the_metrics_of_one(tmp_path: Path, name: str) -> None:
    def config(workers: int) -> dict[str, Any]:
        cfg = config_for(name.split(":")[0], rounds=2, workers=workers)
        cfg["algorithm"].update(READINGS.get(name, {}))
        cfg["partition"]["client_test_fraction"] = 0.25  # the personal accuracies of FedRoD and FedETF too
        return cfg

    one = _metrics(config(1), tmp_path / "one")
    two = _metrics(config(2), tmp_path / "two")
    assert two == one
    records = [json.loads(line) for line in one.decode().splitlines()]
    assert [r["round"] for r in records] == [1, 2]
    assert all(r["accuracy"] is not None and r["rejected"] == [] and len(r["clients"]) == 3 for r in records)
    if name in ("fedrod", "fedetf"):  # personalised: each client's own model on its test split
        assert all(r["personal_accuracy_mean"] is not None for r in records)
