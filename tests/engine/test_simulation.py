"""The simulator: determinism across workers, resume, the ledger, and the run folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.config import dump, typed_config
from fedskew.core.errors import ConfigError
from fedskew.engine.experiment import resume_run
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import config_for, federation_from, tiny_config


def _run(cfg: dict, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return path


def test_run_folder_and_schema(tmp_path: Path) -> None:
    d = _run(tiny_config(), tmp_path / "r")
    for f in ("config.toml", "metrics.jsonl", "summary.json", "checkpoints/last.pt", "model.pt"):
        assert (d / f).exists(), f
    recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in recs] == [1, 2, 3]
    for r in recs:
        for k in ("accuracy", "loss", "per_class_accuracy", "class_variance", "bytes_server_to_client",
                  "bytes_client_to_server", "clients", "samples"):
            assert k in r
        assert len(r["clients"]) == 3 and len(r["per_class_accuracy"]) == 4
        assert 0.0 <= r["accuracy"] <= 1.0
    s = json.loads((d / "summary.json").read_text())
    for k in ("algorithm", "rounds", "final_accuracy", "best_accuracy", "max_drop", "mean_drop", "mean_rise",
              "mean_class_variance", "bytes_server_to_client", "bytes_client_to_server"):
        assert k in s
    assert s["rounds"] == 3 and s["final_accuracy"] == recs[-1]["accuracy"]


def test_fedavg_ledger_counts_one_model_each_way(tmp_path: Path) -> None:
    cfg = tiny_config()
    d = _run(cfg, tmp_path / "r")
    sim = RoundLoop(typed_config(cfg), tmp_path / "x", progress=False)
    model_bytes = sum(t.numel() * t.element_size() for t in sim.server.model.state_dict().values())
    for line in (d / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        assert r["bytes_server_to_client"] == 3 * model_bytes
        assert r["bytes_client_to_server"] == 3 * model_bytes


def test_fedavg_learns(tmp_path: Path) -> None:
    d = _run(tiny_config(rounds=8), tmp_path / "r")
    s = json.loads((d / "summary.json").read_text())
    assert s["best_accuracy"] > 0.6  # 4 classes: chance is 0.25


@pytest.mark.slow
def test_identical_metrics_for_one_and_two_workers(tmp_path: Path) -> None:
    a = _run(tiny_config(workers=1), tmp_path / "w1")
    b = _run(tiny_config(workers=2), tmp_path / "w2")
    c = _run(tiny_config(workers=1), tmp_path / "w1b")
    ma = (a / "metrics.jsonl").read_bytes()
    assert ma == (b / "metrics.jsonl").read_bytes()
    assert ma == (c / "metrics.jsonl").read_bytes()


def test_centralized_uploads_data_once(tmp_path: Path) -> None:
    d = _run(tiny_config(algorithm={"name": "centralized", "lr": 0.1}), tmp_path / "c")
    recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    # All 400 training images (float32 8x8) plus int64 labels, charged to round 1 only.
    assert recs[0]["bytes_client_to_server"] == 400 * 64 * 4 + 400 * 8
    assert all(r["bytes_client_to_server"] == 0 for r in recs[1:])


@pytest.mark.parametrize("algo", [{"name": "fedavg"}, {"name": "centralized"}])
def test_resume_equals_uninterrupted(tmp_path: Path, algo: dict) -> None:
    full = _run(tiny_config(rounds=4, algorithm=algo), tmp_path / "full")
    part = _run(tiny_config(rounds=2, algorithm=algo), tmp_path / "part")
    resume_run(part, {"rounds": 4}, data_dir=None, progress=False)
    assert (part / "metrics.jsonl").read_bytes() == (full / "metrics.jsonl").read_bytes()
    assert (part / "model.pt").read_bytes() != b""


def test_train_fraction_shrinks_every_client_and_keeps_the_test_set(tmp_path: Path) -> None:

    cfg = tiny_config()
    full = federation_from(cfg, 0)
    half = federation_from({**cfg, "dataset": {**cfg["dataset"], "train_fraction": 0.5}}, 0)
    assert len(half.y) == len(full.y) // 2
    assert half.counts.sum() == len(half.y) and half.counts.shape == full.counts.shape
    assert torch.equal(half.x_test, full.x_test)
    sim = RoundLoop(typed_config(tiny_config(dataset={"train_fraction": 0.5}, rounds=1)), tmp_path / "run")
    sim.run()
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])["samples"] <= len(half.y)


def test_normalize_false_feeds_raw_pixels_in_unit_range() -> None:
    """dataset.normalize = false: x / 255 (NIID-Bench's inputs), mean 0 and std 1 in the federation's info;
    the standardised inputs are the same pixels, (x / 255 - mean) / std."""
    cfg = tiny_config()
    std_fed = federation_from(cfg, 0)
    raw_fed = federation_from({**cfg, "dataset": {**cfg["dataset"], "normalize": False}}, 0)
    channels = len(std_fed.info.mean)
    assert raw_fed.info.mean == (0.0,) * channels and raw_fed.info.std == (1.0,) * channels
    assert float(raw_fed.x.min()) >= 0.0 and float(raw_fed.x.max()) <= 1.0
    assert float(raw_fed.x_test.min()) >= 0.0 and float(raw_fed.x_test.max()) <= 1.0
    shape = (1, channels, 1, 1)
    mean, std = torch.tensor(std_fed.info.mean).view(shape), torch.tensor(std_fed.info.std).view(shape)
    assert torch.allclose(std_fed.x * std + mean, raw_fed.x, atol=1e-5)
    assert torch.equal(std_fed.y, raw_fed.y)


def test_normalize_must_be_a_boolean() -> None:
    from fedskew.config import validate
    from fedskew.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"dataset.normalize") as err:
        validate(tiny_config(dataset={"normalize": "no"}))
    assert "\n" not in str(err.value)


def test_train_fraction_out_of_range_is_a_config_error() -> None:
    from fedskew.config import validate
    from fedskew.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"dataset.train_fraction must be <= 1, got 2"):
        validate(tiny_config(dataset={"train_fraction": 2}))


def test_resume_of_an_experiment_folder_names_its_runs(tmp_path: Path) -> None:
    """--resume given the --out folder (holding run folders) says which runs are inside it."""
    from fedskew.core.errors import FedskewError

    for name in ("FedAvg-seed0", "FedAvg-seed1"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(dump(tiny_config()))
    with pytest.raises(FedskewError, match=r"experiment folder.*FedAvg-seed0, FedAvg-seed1"):
        resume_run(tmp_path, {}, data_dir=None, progress=False)
    with pytest.raises(FedskewError, match="does not exist"):
        resume_run(tmp_path / "missing", {}, data_dir=None, progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FedskewError, match=r"no config\.toml"):
        resume_run(tmp_path / "empty", {}, data_dir=None, progress=False)


@pytest.mark.parametrize("threads", [0, 2])
def test_server_threads_is_the_server_halfs_thread_count(tmp_path: Path, threads: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``server_threads`` sets the intra-op threads of the server half (FedDM's training on the condensed sets runs
    in it), 0 leaves the process's own; client work keeps its one thread; the setting is restored after each
    round; a thread count below 0 is refused in one line."""
    before = torch.get_num_threads()
    sim = RoundLoop(typed_config(config_for("feddm", rounds=2, server_threads=threads)), tmp_path / "r", progress=False)
    seen: list[tuple[str, int]] = []
    server_round, client_step = sim.algorithm.round, type(sim.algorithm).client_step

    def spy_round(server: Any) -> None:
        seen.append(("server", torch.get_num_threads()))
        server_round(server)

    def spy_client(*args: Any, **kwargs: Any) -> Any:
        seen.append(("client", torch.get_num_threads()))
        return client_step(*args, **kwargs)

    sim.algorithm.round = spy_round  # type: ignore[method-assign]
    monkeypatch.setattr(type(sim.algorithm), "client_step", spy_client)  # the inline runner's own instance too
    sim.run()
    assert [n for kind, n in seen if kind == "server"] == [threads or before] * 2
    assert {n for kind, n in seen if kind == "client"} == {1}
    assert torch.get_num_threads() == before
    with pytest.raises(ConfigError, match="server_threads") as err:
        typed_config(config_for("feddm", server_threads=-1))
    assert "\n" not in str(err.value)
