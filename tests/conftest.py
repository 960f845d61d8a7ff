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

# ---- pytest-xdist: scripts/test.sh runs the suite with `-n auto --dist loadgroup` --------------------------------
XDIST_GROUPS: dict[str, str] = {
    # The tests on the Flower federation of test_flower.py's module fixture `federation` (it starts the SuperLink
    # and three SuperNodes once), in file order: the last one leaves the federation a node short.
    "tests/engine/test_flower.py::test_fedaf_over_flower": "flower_federation",
    "tests/engine/test_flower.py::test_a_plugin_runs_over_flower": "flower_federation",
    "tests/engine/test_flower.py::test_fedavg_over_flower_equals_simulation_and_survives_a_killed_node":
        "flower_federation",
    # A two-node Ray cluster (a module fixture) and Flower's local simulation (a local Ray instance, which
    # would join a cluster it finds): one after the other, never beside each other.
    "tests/engine/test_flower_local.py": "ray",
    "tests/engine/test_ray.py": "ray",
    # benchmarks/gpu_check.py's dry run, a module fixture that takes about a minute.
    "tests/test_gpu_check.py": "gpu_check",
}
"""Test-id prefixes (a module, a test and its parameters) whose tests run on one xdist worker, one after another.

pytest-xdist's own ``xdist_group`` mark does not work with this pytest (it renames tests through an attribute
that pytest 9 no longer reads), so :func:`pytest_xdist_make_scheduler` groups them from this table instead.
Every other test is handed out alone, to whichever worker is free.
"""


def xdist_scope(nodeid: str) -> str:
    """The work unit of a test under ``--dist loadgroup``: its group in :data:`XDIST_GROUPS`, else the test itself."""
    for prefix, group in XDIST_GROUPS.items():
        if nodeid == prefix or nodeid.startswith((f"{prefix}::", f"{prefix}[")):
            return group
    return nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: xdist's scheduling by work unit, the units from :func:`xdist_scope` (groups with
    more tests first, as xdist orders them); other ``--dist`` modes as xdist has them."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return Grouped(config, log)


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
