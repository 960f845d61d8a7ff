"""The batched runner (``clients_in_parallel``) against the sequential one: whole runs in float64 (issue 34)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.algorithms.base import ALGORITHMS
from fedskew.components import batched
from fedskew.config.schema import typed_config, validate
from fedskew.core.device import Compute
from fedskew.core.errors import ConfigError
from fedskew.engine.batched_runner import BatchedClients, clients_in_parallel
from fedskew.engine.federation import build_federation
from fedskew.engine.local import local_engine
from fedskew.engine.round_loop import RoundLoop
from fedskew.engine.runner import EngineContext
from fedskew.engine.workers import Workers
from tests.helpers.batched import federation64, final_model, max_diff
from tests.helpers.configs import config_for, methods, tiny_config
from tests.helpers.spies import spy_calls

TOL = 1e-9


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The step counts of the clients of every batched training."""
    return spy_calls(monkeypatch, batched, "train_batched", lambda requests: [len(r.batches) for r in requests])


def _config(**over: Any) -> dict[str, Any]:
    """The small CNN (layered forward), 4 clients a round of unequal sizes, batch 16: the batch shrinks."""
    model = over.pop("model", {"name": "cnn"})
    algorithm = {"name": "fedavg", "clients_per_round": 4, "batch_size": 16, "lr": 0.05, "momentum": 0.9,
                 "weight_decay": 1e-3, "local_epochs": 2, **over.pop("algorithm", {})}
    cfg = tiny_config(rounds=2, checkpoint_every=0, algorithm=algorithm, **over,
                      partition={"name": "dirichlet", "num_clients": 6, "alpha": 0.3, "min_size": 5})
    cfg["model"] = model
    return cfg


@pytest.mark.parametrize("algorithm", [
    {"name": "fedavg"},
    {"name": "fedprox", "mu": 0.1},
    {"name": "ditto", "lam": 0.5},  # two trainings a job: the jobs meet the runner twice
    {"name": "fedrep", "head_epochs": 2},  # two trainings a job, each with frozen parameters
])
def test_batched_equals_sequential_in_float64(
    tmp_path: Path, float64: None, spy: list[list[int]], algorithm: dict[str, Any]
) -> None:
    seq_cfg = _config(algorithm=algorithm)
    fed = federation64(seq_cfg)
    sequential = final_model(seq_cfg, tmp_path / "seq", fed)
    assert not spy
    together = final_model(_config(algorithm=algorithm, clients_in_parallel=4), tmp_path / "bat", fed)
    assert next(iter(together.values())).dtype == torch.float64
    assert max_diff(sequential, together) <= TOL
    assert spy, "nothing was batched"
    assert all(len(steps) == 4 for steps in spy)  # every round's clients together
    assert any(len(set(steps)) > 1 for steps in spy)  # of unequal step counts: clients leave the batch


def test_two_at_a_time_equals_sequential(tmp_path: Path, float64: None, spy: list[list[int]]) -> None:
    fed = federation64(_config())
    sequential = final_model(_config(), tmp_path / "seq", fed)
    pairs = final_model(_config(clients_in_parallel=2), tmp_path / "bat", fed)
    assert max_diff(sequential, pairs) <= TOL
    assert spy and all(len(steps) == 2 for steps in spy)


def test_vmap_forward_equals_sequential(tmp_path: Path, float64: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batched, "USE_LAYERED", False)
    fed = federation64(_config())
    assert max_diff(final_model(_config(), tmp_path / "s", fed),
                     final_model(_config(clients_in_parallel=4), tmp_path / "b", fed)) <= TOL


@pytest.mark.parametrize("over", [
    {"algorithm": {"name": "scaffold", "momentum": 0.0}},  # its gradient hook cannot batch
    {"algorithm": {"name": "fedlc"}},  # its logit adjustment cannot batch
    {"algorithm": {"name": "fedrs"}},
    {"model": {"name": "convnet", "net_width": 8, "net_depth": 1, "net_norm": "batchnorm"}},  # running statistics
])
def test_what_cannot_batch_runs_as_sequential(
    tmp_path: Path, spy: list[list[int]], caplog: pytest.LogCaptureFixture, over: dict[str, Any]
) -> None:
    """Float32: a training that falls back is the sequential runner's, bit for bit."""
    sequential = final_model(_config(**over), tmp_path / "seq")
    with caplog.at_level(logging.WARNING, logger="fedskew.engine.batched_runner"):
        fallback = final_model(_config(clients_in_parallel=4, **over), tmp_path / "bat")
    assert max_diff(sequential, fallback) == 0.0
    assert not spy
    said = [r.message for r in caplog.records if "clients_in_parallel" in r.message]
    assert len(said) == 1 and "one at a time" in said[0]  # once, not once a client or a round


def _context(**over: Any) -> EngineContext:
    cfg = tiny_config(**over)
    config = typed_config(cfg)
    fed = build_federation(config.dataset, config.partition, config.model, 0)
    return EngineContext(fed, config.algorithm.name, config.algorithm.params, config, Compute("cpu"))


def test_default_and_auto_on_a_cpu_are_the_sequential_runner() -> None:
    assert typed_config(tiny_config()).run.clients_in_parallel == 1
    for width in (1, "auto"):
        ctx = _context(clients_in_parallel=width)
        assert clients_in_parallel(ctx) == 1
        runner = local_engine(ctx)
        assert isinstance(runner, Workers)
        runner.close()
    runner = local_engine(_context(clients_in_parallel=3))
    assert isinstance(runner, BatchedClients) and runner.width == 3


def test_auto_on_one_gpu_batches_the_whole_round() -> None:
    """The choice only (this machine has no GPU): one CUDA device in one process batches every client."""
    ctx = _context(clients_in_parallel="auto")
    one = dataclasses.replace(ctx, compute=Compute("cuda:0", workers=("cuda:0",)))
    assert clients_in_parallel(one) == 0  # 0: every client of a round at once
    two = dataclasses.replace(ctx, compute=Compute("cuda:0", workers=("cuda:0", "cuda:1")))
    assert clients_in_parallel(two) == 1  # several GPUs: one worker process each, as today


@pytest.mark.parametrize(("name", "width"), [("feddm", 1), ("fedaf", 1), ("feddc", 1), ("hfldd", 0), ("fedprox", 0)])
def test_auto_keeps_the_sequential_runner_for_methods_whose_client_work_does_not_batch(name: str, width: int) -> None:
    """On one GPU, ``"auto"`` batches a method's clients only where their work batches: FedDM's and FedAF's
    distribution matching and FedDC's gradient matching run one client at a time in a batched runner, so they
    keep the sequential runner (its worker processes); HFLDD's KIP and FedProx's training batch."""
    cfg = config_for(name, clients_in_parallel="auto")
    config = typed_config(cfg)
    fed = build_federation(config.dataset, config.partition, config.model, 0)
    ctx = EngineContext(fed, config.algorithm.name, config.algorithm.params, config,
                        Compute("cuda:0", workers=("cuda:0",)))
    assert clients_in_parallel(ctx) == width


def test_a_failing_batch_fails_the_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(requests: Any) -> Any:
        raise RuntimeError("out of memory in the batched step")

    monkeypatch.setattr(batched, "train_batched", broken)
    with pytest.raises(RuntimeError, match="out of memory in the batched step"):
        final_model(_config(clients_in_parallel=4), tmp_path / "b")


@pytest.mark.parametrize(("over", "words"), [
    ({"clients_in_parallel": 0}, "clients_in_parallel must be \"auto\" or an integer in [1,"),
    ({"clients_in_parallel": -2}, "got -2"),
    ({"clients_in_parallel": "many"}, "got 'many'"),
    ({"clients_in_parallel": 1.5}, "clients_in_parallel"),
    ({"clients_in_parallel": True}, "clients_in_parallel"),
    ({"clients_in_parallel": 4, "workers": 2}, "set workers = 1"),
    ({"clients_in_parallel": 4, "engine": "ray"}, "engine = 'ray'"),
])
def test_bad_values_are_refused_in_one_line(over: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(tiny_config(**over))
    message = str(err.value)
    assert words in message and "\n" not in message


@pytest.mark.parametrize("name", methods(ALGORITHMS.names()))
def test_every_method_under_the_batched_runner(tmp_path: Path, name: str) -> None:
    """Every method's client half under the batched runner (float32, a model without running statistics):
    the sequential runner's global model up to float rounding, whatever of it batches."""
    def config(width: int) -> dict[str, Any]:
        cfg = config_for(name, rounds=2, clients_in_parallel=width)
        cfg["model"] = {"name": "cnn"}
        if not ALGORITHMS.get(name).has_global_model:
            cfg["partition"]["client_test_fraction"] = 0.25
        return cfg

    assert max_diff(final_model(config(1), tmp_path / "s"), final_model(config(3), tmp_path / "b")) <= 1e-4


def test_evaluation_several_chunks_a_pass_equals_chunk_by_chunk() -> None:
    from fedskew.engine.batched_runner import evaluate_together
    from fedskew.models import create_model
    from fedskew.models.evaluation import chunk_bounds, evaluate_chunk

    torch.manual_seed(0)
    model = create_model("cnn", in_channels=1, num_classes=4, image_size=8).double()
    x, y = torch.randn(1030, 1, 8, 8, dtype=torch.float64), torch.randint(0, 4, (1030,))
    for bounds in (chunk_bounds(1030, 250), [(0, 100), (100, 130), (130, 500), (700, 1030)]):
        one_by_one = [evaluate_chunk(model, x[s:e], y[s:e], 4) for s, e in bounds]
        together = evaluate_together(model, x, y, 4, bounds, span=600)
        assert len(together) == len(bounds)
        for a, b in zip(one_by_one, together, strict=True):
            assert (a.correct == b.correct).all() and (a.total == b.total).all()
            assert a.loss_sum == pytest.approx(b.loss_sum, rel=1e-6)  # the losses are float32


def test_a_resume_may_switch_to_batched_clients(tmp_path: Path, spy: list[list[int]]) -> None:
    from fedskew.config import dump
    from fedskew.engine.experiment import resume_run

    cfg = {**_config(), "checkpoint_every": 1}  # 2 rounds
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), tmp_path / "r", progress=False).run()
    assert not spy
    res = resume_run(tmp_path / "r", {"rounds": 3, "clients_in_parallel": 4}, data_dir=None, progress=False)
    assert [r["round"] for r in res.records] == [1, 2, 3]
    assert spy  # round 3 trained batched
