"""Several worker processes on one GPU (``workers_per_device``): the metrics of one worker.

Skipped without CUDA (tests/gpu/conftest.py). On a GPU machine: ``python -m pytest tests/gpu``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.configs import config_for
from tests.helpers.runs import run_records
from tests.helpers.spies import spy_pools

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_workers_per_device_gives_the_metrics_of_one_worker_on_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """``workers = 0`` on cuda:0 with ``deterministic = true``: one process (inline), then 2 and 3 sharing the
    GPU (the round has 3 jobs); the records are equal."""
    sizes = spy_pools(monkeypatch)
    runs = [
        run_records(
            config_for(name, rounds=2, device="cuda:0", deterministic=True, workers=0, workers_per_device=k),
            tmp_path / f"k{k}",
        )
        for k in (1, 2, 3)
    ]
    assert sizes == [2, 3]
    assert runs[0] == runs[1] == runs[2]
