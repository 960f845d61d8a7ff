"""Issue 26, run folders and processes: one process per run folder, workers that die with the run, SIGTERM
handled as Ctrl-C, a full disk reported in one line with the last checkpoint intact.

The cases run ``fedskew`` as a separate process, as a user does, and kill it for real.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fedskew.core.errors import ConfigError, FedskewError
from fedskew.engine.checkpoint import load_checkpoint
from fedskew.runs import LOCK_FILE, check_folder_name, describe_os_error, locked_run_folder
from tests.helpers import cli


def checkpointed(run: Path, at_least: int = 1) -> bool:
    try:
        return int(load_checkpoint(run / "checkpoints")["round"]) >= at_least
    except FedskewError:
        return False


# ---- one process per run folder ---------------------------------------------------------------------
@pytest.mark.slow
def test_a_second_run_or_resume_of_a_busy_folder_is_refused(tmp_path: Path, started: list) -> None:
    cfg = cli.write_config(tmp_path / "long.toml", rounds=cli.LONG)
    run = tmp_path / "o" / "fedavg-seed0"
    first = cli.start(started, tmp_path, "run", str(cfg), "--out", "o", "--no-progress")
    cli.wait_for(lambda: checkpointed(run), what="the first run's first checkpoint")
    lock = (run / LOCK_FILE).read_text().strip()
    assert lock == str(first.pid)
    for args in (["run", str(cfg), "--out", "o", "--force"], ["run", "--resume", str(run)]):
        line = cli.one_error(cli.fedskew(*args, "--no-progress", cwd=tmp_path), after_start=True)
        assert f"fedavg-seed0 is in use by another fedskew process (pid {first.pid})" in line
    first.send_signal(signal.SIGINT)
    assert first.wait(60) == 130
    done = cli.rounds_of(run)
    assert done == list(range(1, len(done) + 1))  # no round twice, none lost
    # The lock went with the process: the folder can be resumed now.
    res = cli.fedskew("run", "--resume", str(run), f"rounds={int(load_checkpoint(run / 'checkpoints')['round']) + 1}",
                  "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    done = cli.rounds_of(run)
    assert done == list(range(1, len(done) + 1))


def test_the_lock_is_exclusive_and_names_its_holder(tmp_path: Path) -> None:
    with locked_run_folder(tmp_path / "run"):
        assert (tmp_path / "run" / LOCK_FILE).read_text().strip() == str(os.getpid())
        busy = rf"in use by another fedskew process \(pid {os.getpid()}\)"
        with pytest.raises(FedskewError, match=busy), locked_run_folder(tmp_path / "run"):
            pass
    with locked_run_folder(tmp_path / "run"):  # released when the block ended
        pass


# ---- workers die with the run; SIGTERM as Ctrl-C -----------------------------------------------------
def _pool_run(tmp_path: Path, started: list) -> tuple[subprocess.Popen[str], Path, list[int]]:
    """A long run with two worker processes, once both are up and it has a checkpoint."""
    cfg = cli.write_config(tmp_path / "pool.toml", rounds=cli.LONG, workers=2)
    run = tmp_path / "o" / "fedavg-seed0"
    proc = cli.start(started, tmp_path, "run", str(cfg), "--out", "o", "--no-progress")
    cli.wait_for(lambda: checkpointed(run), what="the first checkpoint")
    helpers = cli.children(proc.pid)
    assert len(helpers) >= 3, helpers  # two workers and multiprocessing's resource tracker
    return proc, run, helpers


@pytest.mark.slow
def test_workers_die_with_a_killed_run(tmp_path: Path, started: list) -> None:
    proc, _, helpers = _pool_run(tmp_path, started)
    proc.kill()
    proc.wait()
    cli.wait_for(lambda: not any(cli.alive(p) for p in helpers), timeout=30, what=f"the helpers {helpers} to end")


@pytest.mark.slow
def test_sigterm_stops_a_run_as_ctrl_c_does_and_it_resumes_exactly(tmp_path: Path, started: list,
                                                                    finished_run: Callable[[int], Path]) -> None:
    proc, run, helpers = _pool_run(tmp_path, started)
    proc.terminate()
    assert proc.wait(60) == 143
    err = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in err and "fedskew: terminated; a run continues from its last checkpoint" in err
    cli.wait_for(lambda: not any(cli.alive(p) for p in helpers), timeout=30, what=f"the helpers {helpers} to end")
    stop = int(load_checkpoint(run / "checkpoints")["round"])
    res = cli.fedskew("run", "--resume", str(run), f"rounds={stop + 2}", "workers=1", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    assert (run / "metrics.jsonl").read_bytes() == (finished_run(stop + 2) / "metrics.jsonl").read_bytes()


# ---- a full disk --------------------------------------------------------------------------------------
def _full(path: Path) -> None:
    """Make writes to ``path`` fail as on a full disk: a link to /dev/full (the kernel answers ENOSPC)."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/full")


@pytest.mark.parametrize("target", ["checkpoints/last.pt.tmp", "metrics.jsonl"])
@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_last_checkpoint_survives(two_rounds: Path, tmp_path: Path, target: str,
                                                                   finished_run: Callable[[int], Path]) -> None:
    checkpoint = (two_rounds / "checkpoints" / "last.pt").read_bytes()
    _full(two_rounds / target)
    line = cli.one_error(cli.fedskew("run", "--resume", str(two_rounds), "rounds=4", "--no-progress", cwd=tmp_path))
    assert f"the disk is full (no space left on device) while writing {two_rounds}; its last checkpoint is intact" \
        in line
    assert (two_rounds / "checkpoints" / "last.pt").read_bytes() == checkpoint
    assert not (two_rounds / "checkpoints" / "last.pt.tmp").exists()
    (two_rounds / target).unlink(missing_ok=True)  # space again: the run goes on from its checkpoint
    assert cli.fedskew("run", "--resume", str(two_rounds), "rounds=4", "--no-progress", cwd=tmp_path).code == 0
    assert (two_rounds / "metrics.jsonl").read_bytes() == (finished_run(4) / "metrics.jsonl").read_bytes()


@pytest.mark.slow
def test_a_disk_that_fills_during_a_run_is_one_line(tmp_path: Path) -> None:
    """A real small file system (tmpfs of 64 KiB in a private mount namespace) fills up during the run."""
    disk = cli.small_disk(tmp_path, "64k")
    cfg = cli.write_config(tmp_path / "long.toml", rounds=2000)
    copy = tmp_path / "copy"
    script = (f'mount -t tmpfs -o size=64k tmpfs {disk} && "$@"; code=$?; cp -r {disk}/o {copy}; exit $code')
    res = cli.fedskew("run", str(cfg), "--out", str(disk / "o"), "--no-progress", cwd=tmp_path,
                  prefix=["unshare", "--mount", "sh", "-c", script, "sh"])
    run = disk / "o" / "fedavg-seed0"
    line = cli.one_error(res, after_start=True)
    assert f"the disk is full (no space left on device) while writing {run}" in line
    ck = load_checkpoint(copy / "fedavg-seed0" / "checkpoints")  # intact, and consistent with itself
    assert ck["round"] >= 1


# ---- the pieces -------------------------------------------------------------------------------------
def test_file_system_errors_read_as_one_line_naming_the_place(tmp_path: Path) -> None:
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert describe_os_error(full, tmp_path) == f"the disk is full (no space left on device) while writing {tmp_path}"
    assert describe_os_error(OSError(errno.EROFS, "x", "/mnt/o")) == "/mnt/o: read-only file system"
    assert describe_os_error(PermissionError(errno.EACCES, "x", "/o")) == "/o: permission denied"
    assert describe_os_error(FileExistsError(errno.EEXIST, "x", "f")) == "f: exists and is not a folder"


@pytest.mark.parametrize("name", ["", " ", "..", "../x", "a/../../b", "/abs", "~/x", "C:\\x", ".", "a\nb", 5])
def test_experiment_names_stay_inside_runs(name: object) -> None:
    with pytest.raises(ConfigError, match="name must be a folder name inside runs/"):
        check_folder_name("name", name)


@pytest.mark.parametrize("name", ["fmnist", "fmnist/alpha0.1", "x..y", "FedAvg vs FedProx"])
def test_ordinary_names_pass(name: str) -> None:
    check_folder_name("name", name)


def test_a_checkpoint_write_that_fails_leaves_the_last_one(tmp_path: Path) -> None:
    from fedskew.engine.checkpoint import save_checkpoint

    folder = tmp_path / "checkpoints"
    save_checkpoint(folder, {"round": 1})
    before = (folder / "last.pt").read_bytes()
    _full(folder / "last.pt.tmp")
    with pytest.raises(OSError) as err:
        save_checkpoint(folder, {"round": 2, "big": torch.zeros(10_000)})
    assert err.value.errno == errno.ENOSPC
    assert (folder / "last.pt").read_bytes() == before and not (folder / "last.pt.tmp").exists()
    assert cli.snapshot(folder) == {"last.pt": before}
