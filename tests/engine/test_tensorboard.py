"""TensorBoard logs (``[logging] tensorboard = true``): what a run writes, read back with TensorBoard's
own reader; resumed runs log each round once; the config's errors."""

from __future__ import annotations

import io
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedskew.cli import main
from fedskew.config import dump, parse_overrides, set_dotted, typed_config, validate
from fedskew.config.schema import DEFAULTS
from fedskew.core.errors import ConfigError, FedskewError
from fedskew.engine.experiment import resume_run
from fedskew.engine.round_loop import RoundLoop
from fedskew.engine.tensorboard import TENSORBOARD_DIR, image_grid, tensorboard_tag
from tests.helpers.configs import tiny_config

FEDDM: dict[str, Any] = {"name": "feddm", "condense_iterations": 3, "ipc": 2,
                         "server": {"epochs": 2, "batch_size": 16, "lr": 0.1}}
MISSING = ("logging.tensorboard = true needs TensorBoard, which is not installed: pip install tensorboard (from a "
           "clone: pip install -e '.[tensorboard]')")


def _config(tensorboard: bool, **over: Any) -> dict[str, Any]:
    cfg = tiny_config(checkpoint_every=1, logging={"tensorboard": tensorboard}, **over)
    cfg["dataset"] = {"name": "digits"}
    return cfg


def _run(cfg: dict[str, Any], path: Path, **kwargs: Any) -> RoundLoop:
    path.mkdir(parents=True)
    (path / "config.toml").write_text(dump(cfg))
    sim = RoundLoop(typed_config(cfg), path, progress=False, **kwargs)
    sim.run()
    return sim


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _events(run: Path, purge: bool = True) -> EventAccumulator:
    acc = EventAccumulator(str(run / TENSORBOARD_DIR), size_guidance={"scalars": 0, "images": 0},
                           purge_orphaned_data=purge)
    return acc.Reload()


def _scalars(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_a_run_logs_its_records_per_class_accuracy_and_images(tmp_path: Path) -> None:
    sim = _run(_config(True, rounds=2, algorithm=FEDDM), tmp_path / "on")
    run = tmp_path / "on"
    recs = _records(run)
    acc = _events(run)
    # Every numeric value of every record, at step = round, as float32 (what a TensorBoard scalar holds).
    numeric = [k for k, v in recs[0].items() if k != "round" and isinstance(v, int | float)]
    assert {"accuracy", "loss", "class_variance", "bytes_server_to_client", "samples", "synthetic_images",
            "server_loss"} <= set(numeric)
    for key in numeric:
        assert _scalars(acc, tensorboard_tag(key)) == [(r["round"], float(np.float32(r[key]))) for r in recs], key
    # Grouped in sections; the lists as counts; the run's settings in the hyper-parameters view.
    assert {tensorboard_tag(k) for k in ("accuracy", "bytes_server_to_client", "samples", "server_loss")} == {
        "eval/accuracy", "comm/bytes_server_to_client", "clients/samples", "algorithm/server_loss"}
    assert _scalars(acc, "clients/took_part") == [(r["round"], float(len(r["clients"]))) for r in recs]
    assert _scalars(acc, "clients/rejected") == [(r["round"], float(len(r["rejected"]))) for r in recs]
    assert not [t for t in acc.Tags()["scalars"] if "/" not in t]
    plugin = acc.PluginTagToContent("hparams")
    assert plugin and any(b"algorithm.name" in content for content in plugin.values())
    names = sim.fed.class_names
    assert names == [str(k) for k in range(10)]
    assert {t for t in acc.Tags()["scalars"] if t.startswith("per_class/")} == {f"per_class/{n}" for n in names}
    for k, name in enumerate(names):
        assert _scalars(acc, f"per_class/{name}") == [(r["round"], float(np.float32(r["per_class_accuracy"][k])))
                                                      for r in recs]
    assert not {"round", "clients", "failed", "rejected", "per_class_accuracy"} & set(acc.Tags()["scalars"])
    # The synthetic sets each round uploaded, as the grid of the artifact the round saved (PNG: lossless).
    images = acc.Images("images/synthetic")
    assert [e.step for e in images] == [1, 2]
    for event in images:
        art = load_file(str(run / "artifacts" / "synthetic" / f"round_{event.step:04d}.safetensors"))
        shown = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)).convert("RGB"))
        assert np.array_equal(shown, np.repeat(image_grid(art["images"], art["labels"]), 3, axis=2))

    # Off: the same metrics.jsonl, byte for byte, and no event files.
    _run(_config(False, rounds=2, algorithm=FEDDM), tmp_path / "off")
    assert (tmp_path / "off" / "metrics.jsonl").read_bytes() == (run / "metrics.jsonl").read_bytes()
    assert not (tmp_path / "off" / TENSORBOARD_DIR).exists()


def test_image_grid_has_a_row_per_class_and_a_limit() -> None:
    images = torch.arange(6, dtype=torch.uint8).view(6, 1, 1, 1).expand(6, 1, 32, 32).contiguous()
    labels = torch.tensor([2, 0, 2, 2, 0, 5])
    grid = image_grid(images, labels, pad=1)
    assert grid.shape == (1 + 3 * 33, 1 + 3 * 33, 1) and grid.dtype == np.uint8
    cell = [[int(grid[1 + 33 * i, 1 + 33 * j, 0]) for j in range(3)] for i in range(3)]
    assert cell == [[1, 4, 255], [0, 2, 3], [5, 255, 255]]  # class 0, 2, 5; white where a row is short
    assert image_grid(images, labels, limit=3).shape[:2] == (1 + 3 * 33, 1 + 33)  # one image per class
    square = image_grid(images[:, :, :8, :8].contiguous())  # no labels: a square; 8x8 shown 4x as large
    assert square.shape == (1 + 2 * 33, 1 + 3 * 33, 1)
    rgb = image_grid(torch.zeros(2, 3, 32, 32, dtype=torch.uint8), torch.tensor([0, 1]))
    assert rgb.shape == (67, 34, 3)


def test_a_resumed_run_logs_each_round_once(tmp_path: Path) -> None:
    """A run that crashed after logging round 3 but checkpointed round 2 logs rounds 3 and 4 once on resume."""
    cfg = tiny_config(rounds=4, checkpoint_every=2, logging={"tensorboard": True}, algorithm=FEDDM)

    def crash(rec: dict[str, Any]) -> None:
        if rec["round"] == 3:
            raise FedskewError("the machine went down")

    with pytest.raises(FedskewError, match="went down"):
        _run(cfg, tmp_path / "part", on_round=crash)
    part = tmp_path / "part"
    assert [s for s, _ in _scalars(_events(part), "eval/accuracy")] == [1, 2, 3]
    resume_run(part, {}, data_dir=None, progress=False)
    _run(cfg, tmp_path / "full")
    assert (part / "metrics.jsonl").read_bytes() == (tmp_path / "full" / "metrics.jsonl").read_bytes()
    recs = _records(part)
    acc = _events(part)
    assert _scalars(acc, "eval/accuracy") == [(r["round"], float(np.float32(r["accuracy"]))) for r in recs]
    for tag in acc.Tags()["scalars"]:
        assert [s for s, _ in _scalars(acc, tag)] == [1, 2, 3, 4], tag
    assert [e.step for e in acc.Images("images/synthetic")] == [1, 2, 3, 4]
    # The files hold round 3 twice; the resumed writer's first event says to drop the first one.
    raw = _events(part, purge=False)
    assert [s for s, _ in _scalars(raw, "eval/accuracy")] == [1, 2, 3, 3, 4]


def test_a_fresh_run_drops_the_event_files_of_an_earlier_one(tmp_path: Path) -> None:
    old = tmp_path / "r" / TENSORBOARD_DIR
    old.mkdir(parents=True)
    (old / "events.out.tfevents.1.old").write_bytes(b"")
    (old / "notes.txt").write_text("mine")
    RoundLoop(typed_config(tiny_config(rounds=1, logging={"tensorboard": True})), tmp_path / "r", progress=False).run()
    assert not (old / "events.out.tfevents.1.old").exists() and (old / "notes.txt").exists()
    assert [s for s, _ in _scalars(_events(tmp_path / "r"), "eval/accuracy")] == [1]


def test_logging_is_a_checked_table() -> None:
    assert DEFAULTS["logging"] == {}
    validate(tiny_config(logging={}))
    validate(tiny_config(logging={"tensorboard": True}))
    with pytest.raises(ConfigError, match=r"^logging\.tensorboard must be .*got 'yes'"):
        validate(tiny_config(logging={"tensorboard": "yes"}))
    allowed = "mlflow, mlflow_uri, tensorboard, wandb, wandb_project"
    with pytest.raises(ConfigError, match=rf"^unknown key 'logging\.tensorbord'; allowed: {allowed}$"):
        validate(tiny_config(logging={"tensorbord": True}))
    with pytest.raises(ConfigError, match=r"^logging must be a table, got 5$"):
        validate(tiny_config(logging=5))
    cfg = tiny_config()
    for key, value in parse_overrides(["logging.tensorboard=true"]).items():
        set_dotted(cfg, key, value)
    assert cfg["logging"] == {"tensorboard": True}


def test_without_tensorboard_a_run_asking_for_it_is_refused_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed: its import fails
    validate(tiny_config(logging={"tensorboard": False}))
    with pytest.raises(ConfigError) as e:
        validate(tiny_config(logging={"tensorboard": True}))
    assert str(e.value) == MISSING
    with pytest.raises(ConfigError, match=re.escape("pip install -e '.[tensorboard]'")):
        RoundLoop(typed_config(tiny_config(logging={"tensorboard": True})), tmp_path / "direct", progress=False).run()
    cfg = tiny_config(rounds=1)
    cfg.pop("label")
    (tmp_path / "tiny.toml").write_text(dump(cfg))
    out = tmp_path / "out"
    code = main(["run", str(tmp_path / "tiny.toml"), "logging.tensorboard=true", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"fedskew: error: {MISSING}"]
    assert not out.exists()


def test_a_resume_may_turn_tensorboard_on(tmp_path: Path) -> None:
    """Logging changes no result, so a resume may switch it (``logging.tensorboard=true``)."""
    cfg = tiny_config(rounds=2)
    part = tmp_path / "part"
    part.mkdir()
    (part / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), part, progress=False).run()
    resume_run(part, {"rounds": 3, "logging.tensorboard": True}, data_dir=None, progress=False)
    assert any((part / "tensorboard").glob("events.out.tfevents.*"))
    assert tomllib.loads((part / "config.toml").read_text())["logging"]["tensorboard"] is True
