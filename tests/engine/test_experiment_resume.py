"""Resuming a whole experiment: finished runs kept, interrupted ones continued, the report rebuilt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedskew.cli import main
from fedskew.config import dump
from tests.helpers.configs import tiny_config


def _config(tmp_path: Path) -> Path:
    cfg = tiny_config(rounds=3, checkpoint_every=1)
    cfg.pop("seed")
    cfg.pop("label")
    cfg["seeds"] = [0, 1]
    cfg["variants"] = [{"label": "FedAvg"}]
    path = tmp_path / "exp.toml"
    path.write_text(dump(cfg))
    return path


@pytest.mark.slow
def test_an_interrupted_experiment_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert main(["run", str(config), "--out", str(tmp_path / "full"), "--no-progress"]) == 0
    # The same experiment stopped in seed 1's first round, before its first checkpoint: seed 0 finished,
    # seed 1 has a metrics file but no checkpoint or summary, as a crash leaves it.
    out = tmp_path / "cut"
    assert main(["run", str(config), "--out", str(out), "--no-progress"]) == 0
    seed1 = out / "FedAvg-seed1"
    (seed1 / "metrics.jsonl").write_text("")
    (seed1 / "summary.json").unlink()
    (seed1 / "checkpoints" / "last.pt").unlink()
    before = (out / "FedAvg-seed0" / "metrics.jsonl").stat().st_mtime_ns
    assert main(["run", str(config), "--out", str(out), "--resume", "--no-progress"]) == 0
    assert (out / "FedAvg-seed0" / "metrics.jsonl").stat().st_mtime_ns == before
    for run in ("FedAvg-seed0", "FedAvg-seed1"):
        assert (out / run / "metrics.jsonl").read_bytes() == (tmp_path / "full" / run / "metrics.jsonl").read_bytes()
    assert (out / "report" / "report.html").exists()


@pytest.mark.slow
def test_a_run_continues_from_its_checkpoint(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert main(["run", str(config), "--out", str(tmp_path / "full"), "--no-progress"]) == 0
    out = tmp_path / "short"
    assert main(["run", str(config), "rounds=2", "--out", str(out), "--no-progress"]) == 0
    for run in ("FedAvg-seed0", "FedAvg-seed1"):
        (out / run / "summary.json").unlink()  # stopped after round 2's checkpoint
    assert main(["run", str(config), "--out", str(out), "--resume", "--no-progress"]) == 0
    for run in ("FedAvg-seed0", "FedAvg-seed1"):
        assert (out / run / "metrics.jsonl").read_bytes() == (tmp_path / "full" / run / "metrics.jsonl").read_bytes()
        assert json.loads((out / run / "summary.json").read_text())["rounds"] == 3


def test_resume_refuses_another_config_and_needs_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path)
    out = tmp_path / "a"
    assert main(["run", str(config), "rounds=2", "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["run", str(config), "algorithm.lr=0.5", "--out", str(out), "--resume", "--no-progress"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "algorithm.lr = 0.1, this config has 0.5" in err[0]
    assert main(["run", str(config), "--resume", "--no-progress"]) != 0
    assert "needs its folder" in capsys.readouterr().err
    assert main(["run", str(config), "--out", str(out), "--resume", "--force", "--no-progress"]) != 0
    assert "give one" in capsys.readouterr().err


def test_label_applies_after_only(tmp_path: Path) -> None:
    """--only names the config's labels; --label then renames the runs it kept."""
    config = _config(tmp_path)
    out = tmp_path / "l"
    assert main(["run", str(config), "rounds=1", "algorithm.lr=0.2", "--only", "FedAvg", "--label",
                 "{label}, lr={algorithm.lr}", "--out", str(out), "--no-progress"]) == 0
    runs = sorted(p.name for p in out.iterdir() if p.name != "report")
    assert runs == ["FedAvg_lr_0.2-seed0", "FedAvg_lr_0.2-seed1"]  # shell-safe folders; the label keeps its text
    summary = json.loads((out / "FedAvg_lr_0.2-seed0" / "summary.json").read_text())
    assert summary["label"] == "FedAvg, lr=0.2"
