"""The switches that cut a training step's kernel launches (issue 34, point 3): ``sgd_impl``, ``compile`` and
``tf32``, off by default, beside ``amp``. Their refusals, their effect on CPU results, and that they reach local
training. CUDA-only effects run in tests/gpu/test_lean_steps_gpu.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import fedskew.core.device as device_module
from fedskew.components.trainer import LocalConfig, train_local
from fedskew.config import dump, resolve, typed_config
from fedskew.config.schema import full_config
from fedskew.core.device import Compute, tf32_matmul, use_compute
from fedskew.core.errors import ConfigError
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.runs import run_metrics


@pytest.mark.parametrize(("key", "value", "message"), [
    ("sgd_impl", "fast", "sgd_impl must be one of 'default', 'foreach', 'fused', got 'fast'"),
    ("compile", "max-autotune", "compile must be one of 'off', 'default', 'reduce-overhead', got 'max-autotune'"),
    ("tf32", "yes", "tf32 must be"),
])
def test_bad_words_are_refused_in_one_line(key: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve({}, {key: value})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusals are for machines without CUDA")
@pytest.mark.parametrize(("over", "message"), [
    ({"tf32": True}, "tf32 = true needs a CUDA device"),
    ({"compile": "reduce-overhead"}, "compile 'reduce-overhead' records CUDA graphs and needs a CUDA device"),
])
def test_cuda_only_switches_are_refused_on_the_cpu_before_a_round(tmp_path: Path, over: dict[str, Any],
                                                                  message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        RoundLoop(typed_config(tiny_config(rounds=1, device="cpu", **over)), tmp_path / "r", progress=False)
    assert "\n" not in str(err.value) and not (tmp_path / "r" / "metrics.jsonl").exists()


def test_the_switches_are_recorded_with_their_defaults() -> None:
    recorded = full_config(tiny_config())
    assert (recorded["sgd_impl"], recorded["compile"], recorded["tf32"]) == ("default", "off", False)


def test_foreach_sgd_leaves_cpu_metrics_byte_identical_and_fused_close(tmp_path: Path) -> None:
    plain = run_metrics(tmp_path)
    assert run_metrics(tmp_path, sgd_impl="foreach") == plain
    fused = run_metrics(tmp_path, sgd_impl="fused")
    for a, b in zip(plain, fused, strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-4 and abs(a["accuracy"] - b["accuracy"]) <= 0.01


def test_the_sgd_implementation_reaches_local_training(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    real = torch.optim.SGD

    def spy(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
        made.append({k: kwargs.get(k) for k in ("foreach", "fused")})
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "SGD", spy)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    for impl in ("default", "foreach", "fused"):
        with use_compute(Compute(sgd_impl=impl)):
            train_local(torch.nn.Linear(4, 3), x, y, LocalConfig(epochs=1, batch_size=4, lr=0.1), torch.Generator())
    assert made == [{"foreach": None, "fused": None}, {"foreach": True, "fused": None},
                    {"foreach": None, "fused": True}]


def test_compile_sends_the_forward_pass_through_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plumbing, with torch.compile replaced by a spy that runs the function as it is (inductor's own
    effect is measured by benchmarks/step_options.py and run for real by the slow test below)."""
    asked: list[dict[str, Any]] = []
    calls: list[int] = []

    def spy(fn: Any, **kwargs: Any) -> Any:
        asked.append(kwargs)

        def counted(*args: Any) -> Any:
            calls.append(1)
            return fn(*args)

        return counted

    monkeypatch.setattr(device_module.torch, "compile", spy)
    device_module.compiled_forward.cache_clear()
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    eager, compiled = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    compiled.load_state_dict(eager.state_dict())
    two, one = LocalConfig(epochs=2, batch_size=8, lr=0.1), LocalConfig(epochs=1, batch_size=8, lr=0.1)
    a = train_local(eager, x, y, two, torch.Generator().manual_seed(0))
    try:
        with use_compute(Compute(compile="default")):
            b = train_local(compiled, x, y, two, torch.Generator().manual_seed(0))
            assert torch.equal(eager.weight, compiled.weight) and a.mean_loss == b.mean_loss
            train_local(compiled, x, y, one, torch.Generator().manual_seed(0))
    finally:
        device_module.compiled_forward.cache_clear()
    assert asked == [{"mode": None, "dynamic": False}]  # compiled once per mode and process
    assert len(calls) == b.steps + 3 == 9


@pytest.mark.slow
def test_compile_with_inductor_trains_like_eager_on_the_cpu() -> None:
    """torch.compile for real (about 40 s of compiling on a small CPU): same steps, weights equal up to rounding."""
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 3))
    compiled = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                   torch.nn.Linear(144, 3))
    compiled.load_state_dict(eager.state_dict())
    x, y = torch.randn(40, 1, 8, 8), torch.randint(0, 3, (40,))
    cfg = LocalConfig(epochs=2, batch_size=16, lr=0.1, momentum=0.9)
    a = train_local(eager, x, y, cfg, torch.Generator().manual_seed(0))
    with use_compute(Compute(compile="default")):
        b = train_local(compiled, x, y, cfg, torch.Generator().manual_seed(0))
    assert a.steps == b.steps == 6 and b.mean_loss == pytest.approx(a.mean_loss, rel=1e-5)
    for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6)


def test_a_flower_node_runs_what_its_device_can() -> None:
    everything = Compute("cuda:0", sgd_impl="fused", compile="reduce-overhead", tf32=True)
    on_cpu = everything.on_device(torch.device("cpu"))
    assert (on_cpu.device, on_cpu.sgd_impl, on_cpu.compile, on_cpu.tf32) == ("cpu", "fused", "default", False)
    assert everything.on_device(torch.device("mps")).sgd_impl == "foreach"
    on_cpu.check()  # runnable there


def test_tf32_is_switched_for_the_block_only() -> None:
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    with tf32_matmul(True):
        assert matmul.fp32_precision == "tf32"
    assert matmul.fp32_precision == before
    with tf32_matmul(False):
        assert matmul.fp32_precision == before


def test_a_resume_may_turn_the_switches_on_or_off(tmp_path: Path) -> None:
    from fedskew.engine.experiment import resume_run

    cfg = tiny_config(rounds=2, checkpoint_every=1, sgd_impl="fused")
    path = tmp_path / "r"
    path.mkdir()
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), path, progress=False).run()
    res = resume_run(path, {"rounds": 3, "sgd_impl": "foreach", "compile": "off"}, data_dir=None, progress=False)
    assert [r["round"] for r in res.records] == [1, 2, 3]
    assert "sgd_impl = \"foreach\"" in (path / "config.toml").read_text()
