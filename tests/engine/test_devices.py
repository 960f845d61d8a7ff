"""Devices, mixed precision and worker counts, as far as a CPU-only machine can check them.

The CUDA paths run in tests/gpu/ (skipped without CUDA); here: the device words, the one-line
refusals, bf16 autocast on the CPU, device-free checkpoints, and how many workers ``workers = 0`` means.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedskew.config import dump, resolve, typed_config
from fedskew.core.device import (
    Compute,
    Precision,
    available_devices,
    current_compute,
    resolve_device,
    to_device,
    use_compute,
    worker_devices,
)
from fedskew.core.errors import ConfigError
from fedskew.engine import pool_size as pool_module
from fedskew.engine.pool_size import default_workers, usable_cores
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config

NO_CUDA = not torch.cuda.is_available()


def _run(cfg: dict, path: Path) -> list[dict]:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_cpu_auto_and_default_give_the_same_metrics(tmp_path: Path) -> None:
    default = _run(tiny_config(rounds=2), tmp_path / "default")
    assert _run(tiny_config(rounds=2, device="cpu"), tmp_path / "cpu") == default
    if NO_CUDA and "mps" not in available_devices():
        assert resolve_device("auto") == torch.device("cpu")
        assert _run(tiny_config(rounds=2, device="auto"), tmp_path / "auto") == default


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA: the refusal is for machines without it")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", "mps"])
@pytest.mark.slow
def test_an_absent_device_is_refused_in_one_line_before_any_folder(tmp_path: Path, device: str) -> None:
    if device == "mps" and "mps" in available_devices():
        pytest.skip("this machine has MPS")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "fedskew.cli", "run", f"device={device}", "rounds=1", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"fedskew: error: device {device!r} is not available on this machine"
                     + (" (no CUDA device)" if device != "mps" else "") + "; available: cpu"]
    assert "Traceback" not in proc.stderr and not out.exists()


def test_bad_device_words_and_fp16_without_cuda_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"^device must be one of auto, cpu, cuda, cuda:N, mps, got 'gpu'$"):
        resolve({}, {"device": "gpu"})
    with pytest.raises(ConfigError, match=r"^amp must be one of 'off', 'bf16', 'fp16', got 'fp8'$"):
        resolve({}, {"amp": "fp8"})
    if NO_CUDA:
        with pytest.raises(ConfigError, match=r"amp 'fp16' needs a CUDA device"):
            Precision(torch.device("cpu"), "fp16")


def test_bf16_runs_on_the_cpu_and_keeps_float32_weights_and_wire(tmp_path: Path) -> None:
    records = _run(tiny_config(rounds=2, amp="bf16"), tmp_path / "bf16")
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in records)
    fp32 = _run(tiny_config(rounds=2), tmp_path / "fp32")
    # Same bytes on the wire: mixed precision never changes what is sent.
    assert [r["bytes_client_to_server"] for r in records] == [r["bytes_client_to_server"] for r in fp32]
    model = torch.load(tmp_path / "bf16" / "model.pt", weights_only=True)
    assert all(t.dtype == torch.float32 for t in model.values() if t.is_floating_point())


def test_bf16_autocast_reaches_the_trainer() -> None:
    seen: list[torch.dtype] = []
    layer = torch.nn.Linear(4, 3)
    layer.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    from fedskew.components.trainer import LocalConfig, train_local

    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with use_compute(Compute("cpu", "bf16")):
        train_local(layer, x, y, LocalConfig(epochs=1, batch_size=8, lr=0.1), torch.Generator().manual_seed(0))
    train_local(layer, x, y, LocalConfig(epochs=1, batch_size=8, lr=0.1), torch.Generator().manual_seed(0))
    assert seen == [torch.bfloat16, torch.float32]
    assert layer.weight.dtype == torch.float32


def test_a_run_leaves_the_callers_deterministic_setting_and_warn_only_as_they_were() -> None:
    """A caller's ``use_deterministic_algorithms(True, warn_only=True)`` survives blocks that ask for determinism
    and blocks that do not (the old code switched it off and on again, and so reset ``warn_only``)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        for deterministic in (False, True):
            with use_compute(Compute("cpu", deterministic=deterministic)):
                assert torch.are_deterministic_algorithms_enabled()
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_compute_is_scoped_and_precision_off_is_plain_sgd() -> None:
    assert current_compute() == Compute()
    with use_compute(Compute("cpu", "bf16", deterministic=True)):
        assert current_compute().amp == "bf16" and torch.are_deterministic_algorithms_enabled()
    assert current_compute() == Compute() and not torch.are_deterministic_algorithms_enabled()
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, 3)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    a(x).sum().backward()
    opt_a.step()
    p = Precision(torch.device("cpu"), "off")
    p.backward(b(x).sum())
    p.step(opt_b)
    assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_checkpoints_and_model_files_are_device_free(tmp_path: Path) -> None:
    _run(tiny_config(rounds=2, algorithm={"name": "scaffold", "momentum": 0.0}), tmp_path / "r")
    ck = torch.load(tmp_path / "r" / "checkpoints" / "last.pt", weights_only=True)
    tensors = [t for t in _tensors(ck)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


def test_to_device_moves_nested_tensors_and_keeps_the_rest() -> None:
    state = {"a": torch.ones(2), "b": [torch.zeros(1), 3, "x"], "c": (torch.ones(1),)}
    moved = to_device(state, torch.device("cpu"))
    assert moved["b"][1:] == [3, "x"] and torch.equal(moved["a"], state["a"]) and isinstance(moved["c"], tuple)


def test_workers_zero_means_every_usable_core(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_workers(["cpu"]) == usable_cores() >= 1
    monkeypatch.setattr(pool_module.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(pool_module, "_cgroup_cpu_quota", lambda: None)
    monkeypatch.setattr(pool_module, "available_memory", lambda: None)
    assert default_workers(["cpu"]) == 64  # not capped at 2 any more
    monkeypatch.setattr(pool_module, "_cgroup_cpu_quota", lambda: 6)
    assert default_workers(["cpu"]) == 6  # a container's CPU quota wins over the affinity mask
    if NO_CUDA and "mps" not in available_devices():
        assert worker_devices("auto") == ["cpu"] and worker_devices("cpu") == ["cpu"]


def test_cgroup_quota_is_read_from_cpu_max(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = pool_module.Path

    def fake(path: str) -> Path:
        mapped = {"/sys/fs/cgroup/cpu.max": tmp_path / "cpu.max"}
        return mapped.get(path, real(tmp_path / "absent"))

    monkeypatch.setattr(pool_module, "Path", fake)
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert pool_module._cgroup_cpu_quota() == 3
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert pool_module._cgroup_cpu_quota() is None


def test_a_resume_may_move_the_run_to_another_device(tmp_path: Path) -> None:
    from fedskew.engine.experiment import resume_run

    full = _run(tiny_config(rounds=3, checkpoint_every=1), tmp_path / "full")
    _run(tiny_config(rounds=2, checkpoint_every=1), tmp_path / "part")
    res = resume_run(tmp_path / "part", {"rounds": 3, "device": "cpu"}, data_dir=None, progress=False)
    assert res.records == full
    with pytest.raises(ConfigError, match=r"--resume accepts only the overrides rounds, workers, workers_per_device, "
                       r"server_threads, checkpoint_every, device, amp, sgd_impl, compile, tf32, clients_in_parallel, "
                       r"logging, report, privacy.target_epsilon, not 'seed'"):
        resume_run(tmp_path / "part", {"seed": 1}, data_dir=None, progress=False)


def test_a_resume_may_change_the_precision_and_records_it(tmp_path: Path) -> None:
    from fedskew.config import read_config
    from fedskew.engine.experiment import resume_run

    _run(tiny_config(rounds=2, checkpoint_every=1), tmp_path / "part")
    res = resume_run(tmp_path / "part", {"rounds": 3, "amp": "bf16"}, data_dir=None, progress=False)
    assert [r["round"] for r in res.records] == [1, 2, 3]
    assert read_config(tmp_path / "part" / "config.toml")["amp"] == "bf16"
