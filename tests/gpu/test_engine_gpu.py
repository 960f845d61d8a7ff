"""Every method on CUDA, deterministic repeatability, GPU <-> CPU resume, several GPUs.

Skipped without CUDA (tests/gpu/conftest.py). On a GPU machine: ``python -m pytest tests/gpu``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedskew.algorithms.base import ALGORITHMS
from fedskew.engine.experiment import resume_run
from tests.helpers.configs import config_for, runnable_config
from tests.helpers.runs import run_records

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_every_method_runs_two_rounds_on_cuda(tmp_path: Path, name: str) -> None:
    # `local` has no global model: it is measured on the clients' own test splits (runnable_config gives them).
    records = run_records(runnable_config(name, rounds=2, device="cuda:0", workers=1), tmp_path / name)
    score = "accuracy" if ALGORITHMS.get(name).has_global_model else "personal_accuracy_mean"
    assert len(records) == 2 and all(0.0 <= r[score] <= 1.0 for r in records)
    assert all(r["rejected"] == [] for r in records)
    model = torch.load(tmp_path / name / "model.pt", weights_only=True)
    assert all(t.device.type == "cpu" for t in model.values())


@pytest.mark.parametrize("name", ["fedavg", "scaffold", "feddm"])
def test_deterministic_runs_repeat_exactly(tmp_path: Path, name: str) -> None:
    cfg = config_for(name, rounds=2, device="cuda:0", deterministic=True, workers=1)
    assert run_records(cfg, tmp_path / "a") == run_records(cfg, tmp_path / "b")


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_on_cuda(tmp_path: Path, amp: str) -> None:
    records = run_records(config_for("fedavg", rounds=2, device="cuda:0", amp=amp, workers=1), tmp_path / amp)
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in records)


@pytest.mark.parametrize(("first", "then"), [("cuda:0", "cpu"), ("cpu", "cuda:0")])
def test_resume_moves_between_gpu_and_cpu(tmp_path: Path, first: str, then: str) -> None:
    cfg = config_for("scaffold", rounds=3, device=first, workers=1, checkpoint_every=1)
    part = dict(cfg, rounds=2)
    run_records(part, tmp_path / "r")
    res = resume_run(tmp_path / "r", {"rounds": 3, "device": then}, data_dir=None, progress=False)
    assert len(res.records) == 3 and res.records[-1]["round"] == 3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_several_gpus_give_the_metrics_of_one_when_deterministic(tmp_path: Path) -> None:
    one = config_for("fedavg", rounds=2, device="cuda:0", deterministic=True, workers=1)
    many = config_for("fedavg", rounds=2, device="cuda", deterministic=True, workers=torch.cuda.device_count())
    assert run_records(one, tmp_path / "one") == run_records(many, tmp_path / "many")
