"""Several worker processes on one GPU (``workers_per_device``): the metrics of one worker.

Skipped without CUDA (tests/gpu/conftest.py). On a GPU machine: ``python -m pytest tests/gpu``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedskew.config import dump
from fedskew.engine import workers as workers_module
from fedskew.engine.round_loop import RoundLoop
from fedskew.engine.workers import WorkerPool
from tests.algorithms.test_all_algorithms import config_for

pytestmark = pytest.mark.gpu


def _run(cfg: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(cfg, path, progress=False).run()
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_workers_per_device_gives_the_metrics_of_one_worker_on_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """``workers = 0`` on cuda:0 with ``deterministic = true``: one process (inline), then 2 and 3 sharing the
    GPU (the round has 3 jobs); the records are equal."""
    sizes: list[int] = []

    class Spied(WorkerPool):
        def __init__(self, fed: Any, size: int, *args: Any) -> None:
            sizes.append(size)
            super().__init__(fed, size, *args)

    monkeypatch.setattr(workers_module, "WorkerPool", Spied)
    runs = [
        _run(config_for(name, rounds=2, device="cuda:0", deterministic=True, workers=0, workers_per_device=k),
             tmp_path / f"k{k}")
        for k in (1, 2, 3)
    ]
    assert sizes == [2, 3]
    assert runs[0] == runs[1] == runs[2]
