"""The batched runner (``clients_in_parallel``) on CUDA against the sequential runner (issue 34).

Skipped without CUDA (tests/gpu/conftest.py). On a GPU machine: ``python -m pytest tests/gpu -m gpu``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.components import batched
from fedskew.config.schema import typed_config
from fedskew.engine.federation import Federation, build_federation
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.spies import spy_calls

pytestmark = pytest.mark.gpu


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return spy_calls(monkeypatch, batched, "train_batched")


def _config(name: str, **over: Any) -> dict[str, Any]:
    algorithm = {"name": name, "clients_per_round": 4, "batch_size": 16, "lr": 0.05, "momentum": 0.9,
                 "weight_decay": 1e-3, "local_epochs": 2, **({"mu": 0.1} if name == "fedprox" else {})}
    cfg = tiny_config(rounds=2, checkpoint_every=0, device="cuda:0", workers=1, algorithm=algorithm, **over,
                      partition={"name": "dirichlet", "num_clients": 6, "alpha": 0.3, "min_size": 5})
    cfg["model"] = {"name": "cnn"}
    return cfg


def _final(cfg: dict[str, Any], path: Path, fed: Federation | None = None) -> dict[str, torch.Tensor]:
    loop = RoundLoop(typed_config(cfg), path, progress=False, federation=fed)
    loop.run()
    return {k: v.detach().double().cpu() for k, v in loop.server.model.state_dict().items()}


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_batched_equals_sequential_on_cuda_float32(
    tmp_path: Path, no_tf32: None, spy: list[int], name: str
) -> None:
    sequential = _final(_config(name), tmp_path / "s")
    together = _final(_config(name, clients_in_parallel="auto"), tmp_path / "b")  # auto: all on one GPU
    assert spy and all(n == 4 for n in spy)
    assert _diff(sequential, together) <= 1e-5


@pytest.mark.parametrize("layered", [True, False])
def test_batched_equals_sequential_on_cuda_float64(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spy: list[int], layered: bool
) -> None:
    monkeypatch.setattr(batched, "USE_LAYERED", layered)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        cfg = _config("fedavg")
        config = typed_config(cfg)
        fed = build_federation(config.dataset, config.partition, config.model, 0)
        fed = dataclasses.replace(fed, x=fed.x.double(), x_test=fed.x_test.double())
        sequential = _final(cfg, tmp_path / "s", fed)
        together = _final(_config("fedavg", clients_in_parallel=4), tmp_path / "b", fed)
    finally:
        torch.set_default_dtype(before)
    assert spy
    assert _diff(sequential, together) <= 1e-9
