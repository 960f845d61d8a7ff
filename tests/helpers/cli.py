"""``fedskew`` run as a separate process, as a user runs it: to its end (:func:`fedskew`), or started and left
running to be stopped or killed (:func:`start`), and the processes it leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fedskew
from fedskew.config import dump
from fedskew.runs import LOCK_FILE
from tests.helpers.configs import tiny_config

SRC = Path(fedskew.__file__).resolve().parents[1]
"""The ``src`` folder of the fedskew under test, put on the child's ``PYTHONPATH``."""

RUN_HEADER = "fedskew: "
"""``fedskew run`` says on stderr where its runs go (``fedskew: 1 run(s) -> DIR``) once the input passed."""


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def command(*args: str) -> list[str]:
    """The argv of ``fedskew ARGS`` with this interpreter."""
    return [sys.executable, "-m", "fedskew.cli", *args]


def environment(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), **extra}
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def fedskew(*args: str, cwd: Path, timeout: float = 300, prefix: Sequence[str] = (),
            preexec_fn: Callable[[], Any] | None = None) -> Result:
    """Run ``fedskew ARGS`` in ``cwd`` (``prefix``: a wrapper command such as ``unshare``) and wait for it."""
    proc = subprocess.run(
        [*prefix, *command(*args)], cwd=cwd, env=environment(), capture_output=True, text=True, timeout=timeout,
        preexec_fn=preexec_fn,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def one_error(res: Result, code: int = 2, *, after_start: bool = False) -> str:
    """Check that ``res`` failed with exit ``code`` and one line ``fedskew: error: ...``, no traceback.

    Input refused before anything runs leaves exactly that one line on stderr. With ``after_start``
    (a failure during a run), the line ``fedskew run`` printed when it started may precede it.
    """
    lines = res.err_lines
    assert res.code == code, (res.code, res.err)
    assert "Traceback" not in res.err and "Traceback" not in res.out, res.err
    if after_start and len(lines) == 2 and lines[0].startswith(RUN_HEADER) and "run(s) ->" in lines[0]:
        lines = lines[1:]
    assert len(lines) == 1 and lines[0].startswith("fedskew: error: "), res.err
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` and its bytes (for "nothing was overwritten"), but the run-folder locks
    (a process that takes a lock writes its pid into it)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*")) if p.is_file() and p.name != LOCK_FILE
    }


def write_config(path: Path, **over: Any) -> Path:
    """A config file of the tiny federation (label from the algorithm, ``seeds = [0]`` unless given)."""
    cfg = tiny_config(**over)
    cfg.pop("label")
    if "seeds" not in over:
        cfg["seeds"] = [0]
    path.write_text(dump(cfg))
    return path


def small_disk(tmp_path: Path, size: str) -> Path:
    """A folder ``tmp_path/disk`` where a tmpfs of ``size`` can be mounted in a private mount namespace
    (``unshare --mount``); the test is skipped where that is not possible (no unshare, no privilege)."""
    import shutil

    import pytest

    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["unshare", "--mount", "mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a file system here")
    return disk


# ---- a run left running, to be stopped or killed ---------------------------------------------------
LONG = 100_000
"""Rounds of a run that is stopped (killed, terminated) long before it ends."""


def rounds_of(run: Path) -> list[int]:
    return [json.loads(line)["round"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def wait_for(condition: object, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its exit status waits to be collected


def _default_sigint() -> None:
    """Ctrl-C's default action in the child: a test started as a background job (CI from a script) inherits
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler, so the run would not stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(procs: list[subprocess.Popen[str]], cwd: Path, *args: str) -> subprocess.Popen[str]:
    p = subprocess.Popen(command(*args), cwd=cwd, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=_default_sigint)
    procs.append(p)
    return p
