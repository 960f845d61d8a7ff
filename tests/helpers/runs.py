"""Runs in the test's process (a round loop, its config written first) and what they record; a run stopped
and resumed equals one run uninterrupted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedskew.config import dump, typed_config
from fedskew.engine.experiment import resume_run
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config


def run_records(cfg: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """Run ``cfg`` alone (a round loop, its config written first) into ``path``; its metrics.jsonl records."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def run_metrics(tmp_path: Path, **over: Any) -> list[dict[str, Any]]:
    """Two rounds of the tiny config (a ConvNet, so convolutions and batch norm are in the step) with ``over``."""
    cfg = tiny_config(rounds=2, **over)
    cfg["model"] = {"name": "convnet", "net_width": 8, "net_depth": 2}
    path = tmp_path / "_".join(f"{k}-{v}" for k, v in over.items()) or "plain"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _run(cfg: dict[str, Any], path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return path


def assert_resumes_exactly(
    tmp_path: Path, config: Callable[[int], dict[str, Any]], rounds: int = 3, stop: int = 2
) -> Path:
    """Check that ``stop`` rounds resumed to ``rounds`` write the metrics of ``rounds`` rounds run at once.

    Parameters
    ----------
    tmp_path
        Folder for the two runs (``full`` and ``part`` are made in it).
    config
        The resolved run config for a number of rounds.
    rounds, stop
        Rounds of the uninterrupted run; rounds the other run does before it is resumed.

    Returns
    -------
    Path
        The folder of the uninterrupted run.
    """
    full = _run(config(rounds), tmp_path / "full")
    part = _run(config(stop), tmp_path / "part")
    resume_run(part, {"rounds": rounds}, data_dir=None, progress=False)
    assert (part / "metrics.jsonl").read_bytes() == (full / "metrics.jsonl").read_bytes()
    return full
