"""Issue 44, the fourth reliability pass: faults and resources (items 7, 8, 9, 10, 14 and 15).

7. an unreachable MLflow server is one line naming it, in seconds;
8. a report that cannot be written (a read-only folder, a full disk) is exit 1 naming it, the runs kept, no
   partial report;
9. a run's memory is estimated jointly before it starts, and a run that cannot fit is one line;
10. ``checkpoint_every = 0`` writes the final checkpoint: the run can be extended and an experiment resume
    continues it;
14. W&B writes its files into the run folder;
15. a stop never waits on a worker that died in the middle of sending a result (the watchdog is a guard, not the
    path).

Most cases run ``fedskew`` as a separate process, as a user does, with real failures: a closed port, a
read-only bind mount, a file-size limit, real SIGTERMs.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedskew.engine.checkpoint import load_checkpoint
from fedskew.runs import LOCK_FILE
from tests.helpers.cli import (
    LONG,
    SRC,
    environment,
    fedskew,
    one_error,
    rounds_of,
    small_disk,
    snapshot,
    start,
    wait_for,
    write_config,
)

ROOT = Path(__file__).resolve().parents[2]

TRIALS = int(os.environ.get("FEDSKEW_SIGTERM_TRIALS", "5"))
"""SIGTERM trials of item 15 (``benchmarks/integrity.py`` runs 20)."""


# ---- 15. a stop never waits on a half-sent reply --------------------------------------------------------------
@pytest.mark.parametrize("kind", ["stop", "crash"])
@pytest.mark.slow
def test_a_worker_that_dies_mid_reply_never_holds_up_the_pool(kind: str) -> None:
    """A worker stops in the middle of sending its result (tests/helpers/pool_faults.py): the pool still ends in
    seconds, stopped (its workers terminated, then closed) or crashed (the other worker alive: the wait for the
    result ends in the one-line BROKEN error), with no semaphore leaked."""
    env = environment(PYTHONPATH=f"{SRC}{os.pathsep}{ROOT}")
    res = subprocess.run([sys.executable, "-m", "tests.helpers.pool_faults", kind], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    seconds = float(res.stdout.split("ended in ")[1].split()[0])
    assert seconds < 5.0, res.stdout
    assert "leaked" not in res.stderr and "Traceback" not in res.stderr, res.stderr


HALF_A_REPLY = """
import multiprocessing
import struct
import sys
import time
from pathlib import Path

import fedskew.engine.workers as workers

if multiprocessing.parent_process() is not None:  # in a pool worker: from round 3 on, send half a reply and stay
    _task = workers._client_task

    def _client_task(args):
        if args[1].round >= 3 and Path(__file__).with_suffix(".on").exists():
            frame = sys._getframe(1)  # as tests/helpers/pool_faults.py's half_a_reply
            while "result_queue" not in frame.f_locals:
                frame = frame.f_back
            frame.f_locals["result_queue"]._writer._send(struct.pack("!i", 1 << 20) + b"half a reply")
            time.sleep(600)
        return _task(args)

    workers._client_task = _client_task
"""


def _stopped(proc: subprocess.Popen[str], run: Path) -> tuple[float, str]:
    """SIGTERM ``proc``; the seconds it took to exit and its stderr, checked: exit 143 without the watchdog, no
    leaked semaphore, no traceback, no lock left, the metrics a prefix of rounds and a checkpoint of one of them."""
    from fedskew.cli.process import STOP_GRACE_S

    t0 = time.monotonic()
    proc.terminate()
    code = proc.wait(STOP_GRACE_S + 60)
    took = time.monotonic() - t0
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 143, err
    assert "of winding down" not in err, err  # the watchdog's line: it had to end the process
    assert err.count("fedskew: terminated") == 1 and "leaked" not in err and "Traceback" not in err, err
    assert not (run / LOCK_FILE).exists()
    done = rounds_of(run)
    assert done == list(range(1, len(done) + 1))
    assert 1 <= int(load_checkpoint(run / "checkpoints")["round"]) <= len(done)
    return took, err


def _resumes(run: Path, cwd: Path) -> None:
    """``--resume`` of the stopped run (one more round, one process) finishes, so nothing holds the folder."""
    ck = int(load_checkpoint(run / "checkpoints")["round"])
    res = fedskew("run", "--resume", str(run), f"rounds={ck + 1}", "workers=1", "--no-progress", cwd=cwd)
    assert res.code == 0, res.err
    assert rounds_of(run) == list(range(1, ck + 2))


@pytest.mark.slow
def test_sigterm_while_a_reply_is_half_sent_never_waits_for_the_watchdog(tmp_path: Path,
                                                                         started: list) -> None:
    """The red team's hang, made certain: a worker of a two-worker run has sent half its round-3 reply when SIGTERM
    comes (the executor's thread waits for the rest): exit 143 well within the grace period, without the watchdog,
    no leaked semaphore, no lock left, and the run resumes."""
    from fedskew.cli.process import STOP_GRACE_S

    plugin = tmp_path / "half_a_reply.py"
    plugin.write_text(HALF_A_REPLY)
    plugin.with_suffix(".on").touch()
    cfg = write_config(tmp_path / "half.toml", rounds=LONG, workers=2)
    run = tmp_path / "half" / "fedavg-seed0"
    proc = start(started, tmp_path, "run", str(cfg), "--import", str(plugin), "--out", "half", "--no-progress")
    wait_for(lambda: (run / "metrics.jsonl").is_file() and len(rounds_of(run)) >= 2, what="round 2")
    time.sleep(1.0)  # round 3's first reply is half sent
    took, _ = _stopped(proc, run)
    print(f"SIGTERM with a reply half sent: exit 143 after {took:.2f} s")
    assert took < STOP_GRACE_S - 1.0, took
    plugin.with_suffix(".on").unlink()
    _resumes(run, tmp_path)


@pytest.mark.slow
def test_sigterm_at_random_moments_of_a_two_worker_run(tmp_path: Path, started: list) -> None:
    """``FEDSKEW_SIGTERM_TRIALS`` (5; 20 in benchmarks/integrity.py) SIGTERMs at random moments after round 2 of a
    two-worker run with larger replies (more of each round is spent sending them): each as above, and the last
    run resumes."""
    from fedskew.cli.process import STOP_GRACE_S

    rng = random.Random(44)
    times = []
    for trial in range(TRIALS):
        cfg = write_config(tmp_path / f"t{trial}.toml", rounds=LONG, workers=2, model={"name": "mlp",
                                                                                      "hidden": [512, 512]})
        run = tmp_path / f"o{trial}" / "fedavg-seed0"
        proc = start(started, tmp_path, "run", str(cfg), "--out", f"o{trial}", "--no-progress")
        wait_for(lambda run=run: (run / "metrics.jsonl").is_file() and len(rounds_of(run)) >= 2, what="round 2")
        time.sleep(rng.uniform(0.0, 0.6))  # a random moment of a round
        times.append(_stopped(proc, run)[0])
    print(f"SIGTERM: {TRIALS} trials, seconds to exit: max {max(times):.2f}, mean {sum(times) / len(times):.2f}")
    assert max(times) < STOP_GRACE_S - 1.0, times
    _resumes(run, tmp_path)


# ---- 10. checkpoint_every = 0 writes the final checkpoint ------------------------------------------------------


@pytest.mark.slow
def test_checkpoint_every_0_writes_the_last_round_so_a_finished_run_can_be_extended(
    tmp_path: Path, inline: Any, finished_run: Callable[[int], Path]
) -> None:
    cfg = write_config(tmp_path / "c.toml", rounds=2, checkpoint_every=0)
    assert inline("run", str(cfg), "--out", "o", "--no-progress").code == 0
    run = tmp_path / "o" / "fedavg-seed0"
    assert int(load_checkpoint(run / "checkpoints")["round"]) == 2  # only the last round's
    res = inline("run", "--resume", str(run), "rounds=3", "--no-progress")
    assert res.code == 0, res.err
    assert (run / "metrics.jsonl").read_bytes() == (finished_run(3) / "metrics.jsonl").read_bytes()


def test_an_experiment_resume_continues_a_run_checkpointed_only_at_the_end(tmp_path: Path, inline: Any) -> None:
    """Not rerun from round 1: the resume says it continues the run, and rounds 1-2 are kept as they were."""
    cfg = write_config(tmp_path / "c.toml", rounds=2, checkpoint_every=0)
    assert inline("run", str(cfg), "--out", "o", "--no-progress").code == 0
    metrics = tmp_path / "o" / "fedavg-seed0" / "metrics.jsonl"
    before = metrics.read_bytes()
    res = inline("run", str(cfg), "rounds=3", "--out", "o", "--resume", "--no-progress")
    assert res.code == 0, res.err
    assert "0 run(s) finished, 1 to continue, 0 to start" in res.err
    assert rounds_of(metrics.parent) == [1, 2, 3] and metrics.read_bytes().startswith(before)


# ---- 14. W&B writes into the run folder ---------------------------------------------------------------------------
@pytest.mark.slow
def test_wandb_writes_its_files_into_the_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without WANDB_DIR: W&B's offline run is in the run folder's wandb/; nothing lands in the current folder, and
    no run in the temporary folder."""
    pytest.importorskip("wandb", reason="the tracker extra (pip install wandb) is not installed")
    import tempfile

    import fedskew
    from tests.helpers.configs import tiny_config

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    results = fedskew.run(tiny_config(rounds=2, logging={"wandb": True}), out=tmp_path / "o", progress=False)
    run = results.runs[0].run_dir
    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and any(f.suffix == ".wandb" and f.stat().st_size > 0 for f in offline[0].iterdir())
    assert list(cwd.iterdir()) == []
    assert not list(temp.rglob("offline-run-*")) and not list(temp.rglob("*.wandb"))  # (its service's files stay)
    assert [r["round"] for r in results.runs[0].records] == [1, 2]


# ---- 7. an unreachable MLflow server is one line, in seconds ---------------------------------------------------
def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_mlflow_server_is_one_line_naming_it_before_anything_runs(tmp_path: Path,
                                                                                 inline: Any) -> None:
    """A closed port: one line naming the URI (without its password) within seconds, not after MLflow's 255 s of
    retries; nothing written."""
    pytest.importorskip("mlflow", reason="the tracker extra (pip install mlflow-skinny) is not installed")
    port = _closed_port()
    cfg = write_config(tmp_path / "c.toml", rounds=1, logging={"mlflow": True,
                                                               "mlflow_uri": f"http://me:secret@127.0.0.1:{port}"})
    t0 = time.monotonic()
    line = one_error(inline("run", str(cfg), "--out", "o", "--no-progress"))
    assert time.monotonic() - t0 < 10
    assert f"logging.mlflow: the tracking server http://127.0.0.1:{port} cannot be reached (connection refused" in line
    assert "secret" not in line and not (tmp_path / "o").exists()


def test_the_mlflow_tracker_checks_its_server_and_lowers_mlflows_retries(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the run starts its tracker (a resumed deployment, a caller of the round loop): the same line, through
    the tracker's one-line guard; MLflow's retries are lowered unless the environment sets them."""
    pytest.importorskip("mlflow", reason="the tracker extra (pip install mlflow-skinny) is not installed")
    from fedskew.core.errors import FedskewError
    from fedskew.engine.trackers import MLFLOW_HTTP_DEFAULTS, MlflowTracker, OneLine, check_mlflow_server

    for name in MLFLOW_HTTP_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")
    uri = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(FedskewError, match=r"logging.mlflow: the tracking server http://127.0.0.1:\d+ cannot be"):
        OneLine("mlflow", lambda: MlflowTracker({}, tmp_path / "run", uri, "exp"))
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2" and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"
    with socket.socket() as server:  # a server that listens is reached
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_mlflow_server(f"http://127.0.0.1:{server.getsockname()[1]}/mlflow")
    check_mlflow_server("file:/nowhere/mlruns")  # not a server: left to MLflow
    with pytest.raises(FedskewError, match="is not valid"):
        check_mlflow_server("http://127.0.0.1:99999")


# ---- 8. a report that cannot be written: exit 1 naming it, the runs kept, no partial report --------------------
@pytest.mark.slow
def test_a_read_only_report_folder_is_exit_1_naming_it_and_the_old_report_stays(tmp_path: Path) -> None:
    """The report folder of an earlier run, made read-only (a read-only bind mount: root ignores chmod), and the
    experiment run again with --force: exit 1, one line naming the report folder, the runs kept, the old report
    as it was."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    cfg = write_config(tmp_path / "c.toml", rounds=1)
    assert fedskew("run", str(cfg), "--out", "o", "--no-progress", cwd=tmp_path).code == 0
    report = tmp_path / "o" / "report"
    before = snapshot(report)
    mount = f"mount --bind {report} {report} && mount -o remount,bind,ro {report}"
    if subprocess.run(["unshare", "--mount", "sh", "-c", mount], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount read-only here")
    res = fedskew("run", str(cfg), "rounds=2", "--out", "o", "--force", "--no-progress", cwd=tmp_path,
                  prefix=["unshare", "--mount", "sh", "-c", f'{mount} && exec "$@"', "sh"])
    line = one_error(res, code=1, after_start=True)
    assert "the runs finished and are kept in o, but no report was written: read-only file system in o/report" in line
    assert "fedskew report o" in line and ".partial" not in line
    assert rounds_of(tmp_path / "o" / "fedavg-seed0") == [1, 2]
    assert snapshot(report) == before


@pytest.mark.slow
def test_a_disk_that_fills_while_the_report_is_written_leaves_no_partial_report(tmp_path: Path) -> None:
    """A real 256 KiB tmpfs: the run's files fit, its report (about 480 KiB) does not. Exit 1, one line naming the
    report folder, the run kept and complete, no report folder and no temporary one; `fedskew report` of the kept
    runs writes it afterwards."""
    disk = small_disk(tmp_path, "256k")
    kept = tmp_path / "kept"
    script = (f'mount -t tmpfs -o size=256k tmpfs {disk} && cd {disk} && "$@"; code=$?; '
              f"cp -r {disk}/o {kept}; exit $code")
    cfg = write_config(tmp_path / "c.toml", rounds=1)
    res = fedskew("run", str(cfg), "--out", "o", "--no-progress", cwd=tmp_path,
                  prefix=["unshare", "--mount", "sh", "-c", script, "sh"])
    line = one_error(res, code=1, after_start=True)
    assert ("the runs finished and are kept in o, but no report was written: the disk is full (no space left on "
            "device) while writing o/report; fix that, then `fedskew report o`") in line
    assert sorted(p.name for p in kept.iterdir()) == ["fedavg-seed0"]  # no report, no .report.partial-*
    assert (kept / "fedavg-seed0" / "summary.json").is_file() and rounds_of(kept / "fedavg-seed0") == [1]
    assert fedskew("report", str(kept), "--no-progress", cwd=tmp_path).code == 0
    assert len(list(kept.rglob("report.html"))) == 1


def test_a_report_write_that_fails_part_way_leaves_the_folder_as_it_was(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """staged_folder: a new folder appears whole or not at all; an existing one keeps its other files and gets the
    new ones only when every write succeeded."""
    from fedskew.core.files import staged_folder

    out = tmp_path / "report"
    with pytest.raises(OSError), staged_folder(out) as stage:
        (stage / "a.md").write_text("a")
        raise OSError(28, "No space left on device")
    assert list(tmp_path.iterdir()) == []
    with staged_folder(out) as stage:
        (stage / "a.md").write_text("a")
        (stage / "b.png").write_text("b")
    (out / "mine.txt").write_text("kept")
    with pytest.raises(OSError), staged_folder(out) as stage:
        (stage / "a.md").write_text("new a")
        raise OSError(30, "Read-only file system")
    assert snapshot(out) == {"a.md": b"a", "b.png": b"b", "mine.txt": b"kept"}
    with staged_folder(out) as stage:
        (stage / "a.md").write_text("new a")
    assert snapshot(out) == {"a.md": b"new a", "b.png": b"b", "mine.txt": b"kept"}


# ---- 9. a run's memory, estimated jointly before it starts ------------------------------------------------------
REPRODUCER = ["algorithm.name=feddm", "algorithm.ipc=10000", "dataset.num_classes=100", "dataset.image_size=256",
              "dataset.channels=3"]
"""Issue 44's case: every value within its own bound, about a million condensed 3x256x256 images together."""


def _syn(tmp_path: Path) -> Path:
    """The red team's ``syn.toml``: 200 images of 8x8, 4 clients, FedAvg, 2 rounds."""
    return write_config(tmp_path / "syn.toml", rounds=2, dataset={"num_train": 200, "num_test": 100},
                        partition={"num_clients": 4}, algorithm={"clients_per_round": 4})


def test_sizes_that_multiply_beyond_memory_are_one_line_before_anything_runs(
    tmp_path: Path, inline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedskew.engine import memory

    monkeypatch.setattr(memory, "machine_memory", lambda config: (64 * 10**9, "RAM"))
    t0 = time.monotonic()
    line = one_error(inline("run", str(_syn(tmp_path)), *REPRODUCER, "--out", "o", "--no-progress"))
    assert time.monotonic() - t0 < 30  # not after 28 s of allocating
    assert "run 'feddm' (seed 0) would run out of memory: it needs at least 983.4 GB (data 0.2 GB, model " in line
    assert "condensed sets 983.0 GB (1,000,000 images of 3x256x256)), more than this machine's 64.0 GB of RAM" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("overrides, part", [
    (["model.name=convnet", "model.net_width=65536"], "model 927.7 GB (77,310,853,124 values)"),
    (["model.name=mlp", "model.hidden=[65536,16384]", "clients_in_parallel=4", "workers=1"],
     "batched clients 34.5 GB (4 models and their gradients)"),
    (["algorithm.name=fedaf", "algorithm.ipc=10000", "dataset.num_classes=40", "dataset.image_size=256",
      "dataset.channels=3"], "condensed sets 393.2 GB (400,000 images of 3x256x256)"),
    (["algorithm.name=hfldd", "algorithm.kip_images=1000000", "dataset.image_size=256", "dataset.channels=3"],
     "condensed sets 1,572.9 GB (1,000,000 images a client)"),
], ids=["model", "batched-clients", "fedaf-sets", "hfldd-kip"])
def test_every_part_of_the_estimate_can_refuse_a_run(tmp_path: Path, overrides: list[str], part: str) -> None:
    from fedskew.config import parse_overrides, read_config, resolve
    from fedskew.core.errors import ConfigError
    from fedskew.engine.memory import check_memory

    runs = resolve(read_config(str(_syn(tmp_path))), parse_overrides(overrides))
    with pytest.raises(ConfigError, match="would run out of memory") as refused:
        check_memory([r.typed for r in runs], memory=lambda config: (16 * 10**9, "RAM"))
    assert part in str(refused.value), refused.value


def _shipped() -> list[str]:
    from fedskew.config.files import builtin_configs

    return [*sorted(str(p.relative_to(ROOT)) for p in (ROOT / "experiments").rglob("*.toml")), *builtin_configs()]


@pytest.mark.parametrize("config", _shipped())
def test_every_shipped_config_passes_the_estimate_on_a_small_machine(config: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No false refusal: every variant and seed of every config in experiments/ and the built-in ones fits a
    4 GB machine by the estimate (the largest, CIFAR-10's, needs 0.8 GB: the data)."""
    from fedskew.config import read_config, resolve
    from fedskew.engine.memory import check_memory, estimate

    monkeypatch.chdir(ROOT)  # configs name their plug-ins relative to the repository
    runs = resolve(read_config(config), {})
    check_memory([r.typed for r in runs], memory=lambda c: (4 * 10**9, "RAM"))
    assert all(estimate(r.typed).total < 1.5 * 10**9 for r in runs)


def test_the_estimate_counts_what_a_run_holds() -> None:
    """The tiny config: its data as float32 plus labels, its model once for the server and twice for the one
    process that trains; a dataset known only once it is read counts nothing."""
    from fedskew.config.schema import typed_config
    from fedskew.engine.memory import estimate, total_ram
    from tests.helpers.configs import tiny_config

    est = estimate(typed_config(tiny_config()))
    params = 64 * 32 + 32 + 32 * 4 + 4
    assert est.parts == {"data": 600 * (64 * 4 + 8), "model": params * 4 * 3}
    folder = tiny_config(dataset={"name": "image_folder", "path": "/nowhere"})
    folder["dataset"] = {"name": "image_folder", "path": "/nowhere"}
    assert estimate(typed_config(folder)).parts == {}
    assert (total_ram() or 0) > 2**28


@pytest.mark.parametrize(("algorithm", "devices", "workers", "batched"), [
    ("fedprox", ("cuda:0",), 0, 3),  # one GPU, one process: the whole round together
    ("fedprox", ("cuda:0", "cuda:1"), 0, 1),  # several GPUs: one worker process each
    ("fedprox", ("cuda:0",), 2, 1),  # worker processes asked for
    ("feddm", ("cuda:0",), 0, 1),  # its clients' condensation has no batched form
    ("fedprox", ("cpu",), 0, 1),
])
def test_the_estimate_resolves_auto_as_the_runner_does(algorithm: str, devices: tuple[str, ...], workers: int,
                                                        batched: int) -> None:
    """``clients_in_parallel = "auto"`` counts batched clients exactly where the runner batches them (one rule,
    ``engine/runner.width_of``); the devices are set on the config (this machine has no GPU)."""
    from fedskew.config.schema import typed_config
    from fedskew.core.device import Compute
    from fedskew.engine.memory import estimate
    from fedskew.engine.runner import width_of
    from tests.helpers.configs import config_for

    config = typed_config(config_for(algorithm, clients_in_parallel="auto", workers=workers))
    config.__dict__["compute"] = Compute(devices[0], workers=devices)  # what resolving these devices gives
    assert int(config.algorithm.params.clients_per_round) == 3
    note = estimate(config).notes.get("batched clients")
    assert note == (f"{batched} models and their gradients" if batched > 1 else None)
    assert (width_of("auto", algorithm, config.compute, workers) == 0) == (batched > 1)


@pytest.mark.parametrize(("algorithm", "extra", "together"), [
    ("hfldd", [], 4), ("hfldd", ["algorithm.kip_kernel=rf_convnet"], 1), ("fedaf", [], 1)])
def test_the_estimate_counts_condensing_clients_as_the_batched_runner_runs_them(
    tmp_path: Path, algorithm: str, extra: list[str], together: int
) -> None:
    """Under ``clients_in_parallel = 4`` HFLDD's four clients distil together (four sets held at once) with KIP's
    NTK kernel, one at a time with its random ConvNet kernel; FedAF's distribution matching runs one client at a
    time (one set: 8 clients, 4 a round, 8-bit uploads, so that four sets at once would outweigh the server's
    pool)."""
    from fedskew.config import parse_overrides, read_config, resolve
    from fedskew.engine.memory import estimate

    def sets(width: int) -> int:
        over = [f"algorithm.name={algorithm}", f"clients_in_parallel={width}", "workers=1", "partition.num_clients=8",
                "dataset.image_size=64", "dataset.channels=3",
                "algorithm.kip_images=100000" if algorithm == "hfldd" else "algorithm.ipc=50", *extra]
        [run] = resolve(read_config(str(_syn(tmp_path))), parse_overrides(over))
        return estimate(run.typed).parts["condensed sets"]

    assert sets(4) == together * sets(1)
