"""Shared fixtures of the engine tests: processes a test starts, a copy of a finished run, the Flower probe."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts (:func:`tests.helpers.cli.start`); any still running at the end is killed."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.fixture
def two_rounds(tmp_path: Path, finished_run: Callable[[int], Path]) -> Path:
    """This test's copy (``tmp_path/o/fedavg-seed0``) of a finished 2-round run of the tiny config."""
    run = tmp_path / "o" / "fedavg-seed0"
    shutil.copytree(finished_run(2).parent, run.parent, symlinks=True)
    return run


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> str:
    """Register :class:`tests.helpers.flower.Probe` for one test (only tests that have Flower ask for it)."""
    from tests.helpers.flower import Probe, register_for_flower

    return register_for_flower(monkeypatch, "flower_probe", Probe)
