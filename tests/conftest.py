"""Shared fixtures: tiny federations that run in seconds on one thread."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.cli import Result, fedskew, write_config
from tests.helpers.configs import tiny_config

torch.set_num_threads(1)


_SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(scope="session", name="shared_datasets")
def shared_datasets_fixture() -> Path:
    """The folder of real dataset copies, ``$FEDSKEW_DATA``, for tests that read real data.

    Fails when ``$FEDSKEW_DATA`` names a missing folder, and when it is unset although this checkout
    has ``../shared/datasets`` (scripts/test.sh sets it from there), so those tests never skip
    silently where the data exists. Skips only where there is no data at all. Session-scoped, so it
    reads the variable before any test's monkeypatch removes it.
    """
    env = os.environ.get("FEDSKEW_DATA")
    if env:
        folder = Path(env)
        if not folder.is_dir():
            pytest.fail(f"FEDSKEW_DATA={env} is not a folder")
        return folder
    if _SHARED.is_dir():
        pytest.fail(f"set FEDSKEW_DATA={_SHARED} to run the tests on real datasets (scripts/test.sh sets it)")
    pytest.skip("no real datasets: set FEDSKEW_DATA to a folder laid out like shared/datasets")


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """``finished_run(N)``: the run folder of ``fedskew run`` (a separate process, as a user runs it) on the tiny
    config of N rounds (:func:`tests.helpers.cli.write_config`) with ``--out o`` (so its parent, ``o``, also
    holds the report), made once per N for the session (per worker under pytest-xdist). Tests read it, and copy
    it to change it: several compare a resumed run with it, and several resume or damage a copy of ``o`` of the
    2-round run.
    """
    made: dict[int, Path] = {}

    def get(rounds: int) -> Path:
        if rounds not in made:
            folder = tmp_path_factory.mktemp(f"finished{rounds}")
            cfg = write_config(folder / f"rounds{rounds}.toml", rounds=rounds)
            res = fedskew("run", str(cfg), "--out", "o", "--no-progress", cwd=folder)
            assert res.code == 0, res.err
            made[rounds] = folder / "o" / "fedavg-seed0"
        return made[rounds]

    return get


@pytest.fixture
def tiny() -> dict[str, Any]:
    return tiny_config()


@pytest.fixture
def float64() -> Iterator[None]:
    """Float64 as torch's default dtype for the test (the equality tests of the batched runners)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


@pytest.fixture
def inline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """``fedskew ARGS`` run in this process (for input refused before anything runs, and short runs: no
    interpreter start-up), in ``tmp_path``; returns the exit code and the output as :func:`fedskew` does."""
    from fedskew.cli import main

    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run
