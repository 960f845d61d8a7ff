"""A helper of the algorithm tests: a run stopped and resumed equals one run uninterrupted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedskew.config import dump
from fedskew.engine.experiment import resume_run
from fedskew.engine.round_loop import RoundLoop


def _run(cfg: dict[str, Any], path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(cfg, path, progress=False).run()
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
