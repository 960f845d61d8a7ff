"""Flower's local simulation from a fresh app folder, as docs/deploy.md's first recipe runs it (issue 36, point 4).

``fedskew deploy init``, then ``flwr run APP --stream --federation-config num-supernodes=N`` with the
environment's commands on ``PATH`` (``flwr run`` starts ``flower-superlink`` by name) and nothing else set
up: no certificates, no SuperNodes, no Flower configuration file. Flower's simulation runs the clients on
Ray, which the ``flower`` extra brings (``flwr[simulation]``); this test does not skip without Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import fedskew

pytest.importorskip("flwr", reason="Flower is optional: pip install -e '.[flower]'")

from tests.helpers.flower_federation import BIN, _descendants, free_port

ROOT = Path(__file__).resolve().parents[2]


def _pids_with(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (the managed SuperLink is detached: no parent to ask)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
    return pids


def test_the_flower_extra_brings_the_simulation() -> None:
    """``flwr run`` on a local connection simulates the clients on Ray: ``flwr`` alone cannot run it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("flwr[simulation]") for req in extras["flower"])


def test_local_simulation_recipe_runs_one_round(tmp_path: Path) -> None:
    home = tmp_path / "flwr-home"
    port, control = free_port(), free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # docs/deploy.md: the venv's commands
        "FLWR_HOME": str(home),  # a first-time user's: no configuration yet
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),  # not the fixed default ports, which may be taken
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
        "FLWR_TELEMETRY_ENABLED": "0",
        # the fedskew this test imports, in every process (the app's too), whatever the working directory
        "PYTHONPATH": os.pathsep.join([str(Path(fedskew.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    init = subprocess.run(
        [sys.executable, "-m", "fedskew.cli", "deploy", "init", "my-app", "--label", "FedAvg", "rounds=1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert init.returncode == 0, init.stderr
    assert "flwr run my-app --stream --federation-config 'num-supernodes=10'" in init.stdout  # the local recipe
    try:
        res = subprocess.run(
            [str(BIN / "flwr"), "run", "my-app", "--stream", "--federation-config", "num-supernodes=10"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )
    finally:
        superlinks = _pids_with(f"--port {port}")
        victims = [*superlinks, *(d for p in superlinks for d in _descendants(p))]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(1)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    assert "ray is not available" not in log.lower()
    run = tmp_path / "runs" / "deploy" / "FedAvg-seed0"  # the ServerApp writes where the SuperLink started
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1]
    assert sorted(records[0]["clients"]) == list(range(10))
    assert json.loads((run / "summary.json").read_text())["rounds"] == 1
