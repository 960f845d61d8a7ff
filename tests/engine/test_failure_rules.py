"""Issue 35, the third reliability pass: each rule the red team found broken, checked where it applies.

1. a write that fails part-way is one line;          6. damaged or hostile files a resume or report reads;
2. one client's reply never ends a run (any engine);  7. optional components fail in one line, once;
3. a plug-in never ends fedskew silently;             8. sizes are bounded before memory is;
4. labels and report keys are checked as names are;   9. a stop request ends a run within seconds, every time.
5. a recorded config equals itself (NaN);

Most cases run ``fedskew`` as a separate process, as a user does, with real failures: a process file-size
limit (``ulimit -f``) and a small tmpfs for writes that fail part-way, a read-only bind mount, real SIGTERMs.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.config import dump
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message
from fedskew.engine.checkpoint import load_checkpoint, save_checkpoint
from fedskew.engine.replies import Undecodable, check_reply, decode_reply, encode_reply
from fedskew.runs import LOCK_FILE
from tests.helpers import cli
from tests.helpers.configs import tiny_config
from tests.helpers.plugins import BAD_REPLY

TRIALS = int(os.environ.get("FEDSKEW_SIGTERM_TRIALS", "3"))
"""SIGTERM trials of rule 9 (``benchmarks/integrity.py`` runs 20)."""


# ---- 1. a write that fails part-way ----------------------------------------------------------------
def _file_size_limit(limit: int) -> Any:
    def limit_writes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_writes


@pytest.mark.slow
def test_a_checkpoint_write_cut_off_part_way_is_one_line_and_the_run_resumes(
    two_rounds: Path, tmp_path: Path, finished_run: Callable[[int], Path]
) -> None:
    """The kernel stops every write past 8 KiB (``ulimit -f``): the checkpoint of round 3 (12 KiB) fails in
    the middle of torch's zip writer, which once turned it into a 40-line RuntimeError."""
    checkpoint = (two_rounds / "checkpoints" / "last.pt").read_bytes()
    assert len(checkpoint) > 8192  # so the write really is cut off part-way
    res = cli.fedskew("run", "--resume", str(two_rounds), "rounds=4", "--no-progress", cwd=tmp_path,
                  preexec_fn=_file_size_limit(8192))
    line = cli.one_error(res)
    assert f"file too large) while writing {two_rounds}; its last checkpoint is intact" in line
    assert (two_rounds / "checkpoints" / "last.pt").read_bytes() == checkpoint
    assert not (two_rounds / "checkpoints" / "last.pt.tmp").exists()
    assert cli.fedskew("run", "--resume", str(two_rounds), "rounds=4", "--no-progress", cwd=tmp_path).code == 0
    assert (two_rounds / "metrics.jsonl").read_bytes() == (finished_run(4) / "metrics.jsonl").read_bytes()


@pytest.mark.slow
def test_a_disk_that_fills_in_the_middle_of_a_checkpoint_is_one_line(two_rounds: Path, tmp_path: Path) -> None:
    """A real small tmpfs, filled until 8 KiB are free: the next checkpoint (12 KiB) runs out of space part-way,
    and so does the resume that is tried while the disk is still full."""
    disk = cli.small_disk(tmp_path, "1m")
    run = disk / "o" / "fedavg-seed0"
    kept = tmp_path / "kept"
    script = (
        f"mount -t tmpfs -o size=1m tmpfs {disk} && mkdir {disk}/o && cp -r {two_rounds} {disk}/o/ && "
        f"free=$(df -k --output=avail {disk} | tail -1) && "
        f"dd if=/dev/zero of={disk}/filler bs=1k count=$((free - 8)) 2>/dev/null; "
        f'"$@"; first=$?; "$@" 2> {tmp_path}/second.err; second=$?; rm {disk}/filler; cp -r {run} {kept}; '
        f'echo "$first $second" > {tmp_path}/codes; exit $first'
    )
    res = cli.fedskew("run", "--resume", str(run), "rounds=4", "--no-progress", cwd=tmp_path,
                  prefix=["unshare", "--mount", "sh", "-c", script, "sh"])
    line = cli.one_error(res)
    assert f"the disk is full (no space left on device) while writing {run}; its last checkpoint is intact" in line
    assert (tmp_path / "codes").read_text().split() == ["2", "2"]
    assert (tmp_path / "second.err").read_text().strip() == line
    assert (kept / "checkpoints" / "last.pt").read_bytes() == (two_rounds / "checkpoints" / "last.pt").read_bytes()
    assert not (kept / "checkpoints" / "last.pt.tmp").exists()


def test_save_checkpoint_reports_a_failed_write_as_an_os_error(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose writes stop after 1000 bytes: the error stays the OSError, the last checkpoint stays."""
    from fedskew.core import files

    save_checkpoint(tmp_path / "checkpoints", {"round": 1})
    before = (tmp_path / "checkpoints" / "last.pt").read_bytes()

    class CutOff:
        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> CutOff:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def write(self, data: bytes) -> int:
            self.f.write(bytes(data[:1000]))
            raise OSError(28, "No space left on device")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

    real_open = open
    monkeypatch.setattr(files, "open", lambda *a, **k: CutOff(real_open(*a, **k)), raising=False)
    with pytest.raises(OSError) as caught:
        save_checkpoint(tmp_path / "checkpoints", {"round": 2, "model": torch.zeros(4096)})
    assert caught.value.errno == 28
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == before
    assert not (tmp_path / "checkpoints" / "last.pt.tmp").exists()


# ---- 2. one client's reply never ends a run -----------------------------------------------------------
BAD_KINDS = ["string", "bool", "unencodable", "not_message"]


@pytest.mark.slow
def test_a_broken_reply_is_that_clients_rejection_with_any_number_of_workers(tmp_path: Path) -> None:
    """With workers >= 2 a reply whose ``num_samples`` was ``"12"`` once ended the run ("undecodable
    message"); it is rejected like with workers = 1, and the records are byte-identical across worker counts
    wherever the reply could be judged the same (all but the unencodable metric, whose repr differs).

    Each kind of broken reply is a variant of one experiment, run once with workers = 1 and once with 2 (the
    four runs share one pool there): two ``fedskew`` processes, not eight."""
    plugin = tmp_path / "bad_reply.py"
    plugin.write_text(BAD_REPLY)
    metrics: dict[tuple[str, int], bytes] = {}
    for workers in (1, 2):
        reasons: dict[str, set[str]] = {}
        cfg = tiny_config(rounds=2, workers=workers, plugins=[str(plugin)])
        cfg["algorithm"] = {**cfg["algorithm"], "name": "bad_reply", "clients_per_round": 6}
        cfg.pop("label")
        cfg["variants"] = [{"label": kind, "algorithm.kind": kind} for kind in BAD_KINDS]
        path = tmp_path / f"w{workers}.toml"
        path.write_text(dump(cfg))
        res = cli.fedskew("run", str(path), "--out", f"w{workers}", "--no-progress", cwd=tmp_path)
        assert res.code == 0, res.err
        for kind in BAD_KINDS:
            run = tmp_path / f"w{workers}" / f"{kind}-seed0"
            records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            assert [r["round"] for r in records] == [1, 2], kind
            for r in records:
                assert [cid for cid, _ in r["rejected"]] == [0] and 0 not in r["clients"], kind
                assert len(r["clients"]) == 5, kind
            metrics[kind, workers] = (run / "metrics.jsonl").read_bytes()
            reasons[kind] = {reason for r in records for _, reason in r["rejected"]}
        assert len({frozenset(r) for r in reasons.values()}) == len(BAD_KINDS), reasons  # each variant its own kind
    for kind in BAD_KINDS:
        if kind != "unencodable":
            assert metrics[kind, 1] == metrics[kind, 2], kind


def test_encoding_and_decoding_never_raise_on_what_a_client_sends() -> None:
    good = Message(arrays={"w": torch.ones(2)}, metrics={"num_samples": 3.0})
    assert isinstance(decode_reply(encode_reply(good)), Message)
    assert encode_reply({"w": 1}) == "not a Message but dict"
    for junk in (b"", b"\x00" * 4, b"\xff" * 64, "unencodable reply: x"):
        reply = decode_reply(junk)
        assert isinstance(reply, Undecodable)
        assert check_reply(reply, None, 10, 10**6) == reply.reason
    odd = decode_reply(Message(metrics={"num_samples": "12"}).to_bytes())  # type: ignore[dict-item]
    assert check_reply(odd, None, 10, 10**6) == "metric 'num_samples' is not a finite number: '12'"


# ---- 3. a plug-in never ends fedskew silently ---------------------------------------------------------
@pytest.mark.parametrize("body, shown", [
    ("import sys\nsys.exit(0)\n", "SystemExit: 0"),
    ("raise SystemExit(3)\n", "SystemExit: 3"),
    ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
])
def test_a_plugin_that_exits_or_interrupts_on_import_is_one_line_naming_it(tmp_path: Path, body: str,
                                                                          shown: str) -> None:
    plugin = tmp_path / "quits.py"
    plugin.write_text(body)
    res = cli.fedskew("run", "rounds=1", "--import", str(plugin), "--no-progress", cwd=tmp_path)  # a real process
    line = cli.one_error(res)
    assert f"plugin {str(plugin)!r} failed: {shown}" in line
    assert not (tmp_path / "runs").exists()


# ---- 4. labels and report keys -------------------------------------------------------------------------
@pytest.mark.parametrize("label, needle", [
    ("", "label must be 1 to 100 characters"),
    ("a\nb", "label must be 1 to 100 characters"),
    (" x", "label must be 1 to 100 characters"),
    ("../../x", "no leading '.'"),
    ("x" * 101, "label must be 1 to 100 characters"),
    ("{label}\n", "a label must be 1 to 100 characters"),
    ("{dataset}", "{dataset} is a table, not a single value"),
    ("{at_rounds}", "{at_rounds} is a list, not a single value"),
    ("{algorithm.nope}", "{algorithm.nope} is not a key of the run's config"),
])
def test_a_bad_label_is_one_line_before_anything_is_written(tmp_path: Path, inline: Any, label: str,
                                                            needle: str) -> None:
    cfg = cli.write_config(tmp_path / "c.toml", rounds=1)
    res = inline("run", str(cfg), "--label", label, "--no-progress")
    assert needle in cli.one_error(res)
    assert not (tmp_path / "runs").exists()


def test_a_bad_label_in_the_config_file_is_refused_too(tmp_path: Path, inline: Any) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump(tiny_config(rounds=1, label="two\nlines")))
    assert "label must be 1 to 100 characters" in cli.one_error(inline("run", str(cfg)))


@pytest.mark.parametrize("key, needle", [
    ("algorithm.nope", "--group-by 'algorithm.nope' is not a key of the run's config"),
    ("dataset", "--group-by 'dataset' is a table, not a single value"),
    ("at_rounds", "--group-by 'at_rounds' is a list"),
])
@pytest.mark.slow
def test_report_group_by_refuses_what_label_refuses(two_rounds: Path, inline: Any, key: str, needle: str) -> None:
    before = cli.snapshot(two_rounds.parent)
    assert needle in cli.one_error(inline("report", str(two_rounds.parent), "--group-by", key))
    assert cli.snapshot(two_rounds.parent) == before


# ---- 5. a recorded config equals itself ---------------------------------------------------------------
@pytest.mark.slow
def test_a_run_recorded_with_nan_resumes(tmp_path: Path) -> None:
    cfg = cli.write_config(tmp_path / "c.toml", rounds=1, faults={"corrupt": 0.2})
    res = cli.fedskew("run", str(cfg), "faults.attack=nan", "--out", "o", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    run = tmp_path / "o" / "fedavg-seed0"
    assert 'attack = "nan"' in (run / "config.toml").read_text()  # the full record stores the word
    res = cli.fedskew("run", "--resume", str(run), "rounds=2", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    assert cli.rounds_of(run) == [1, 2]
    res = cli.fedskew("run", str(cfg), "faults.attack=nan", "rounds=2", "--out", "o", "--resume", "--no-progress",
                  cwd=tmp_path)
    assert res.code == 0 and "1 run(s) finished" in res.err, res.err


# ---- 6. damaged or hostile files ----------------------------------------------------------------------
@pytest.mark.slow
def test_a_truncated_metrics_file_of_a_finished_run_is_one_line_under_resume(two_rounds: Path,
                                                                            tmp_path: Path) -> None:
    metrics = two_rounds / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:-25])
    cfg = cli.write_config(tmp_path / "two.toml", rounds=2)
    res = cli.fedskew("run", str(cfg), "--out", "o", "--resume", "--no-progress", cwd=tmp_path)
    assert res.code == 2 and "Traceback" not in res.err
    errors = [ln for ln in res.err_lines if ln.startswith("fedskew: error:")]
    assert len(errors) == 1 and "o/fedavg-seed0/metrics.jsonl, line 2: not valid JSON" in errors[0], res.err


@pytest.mark.slow
def test_a_run_folder_that_is_a_link_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "fedavg-seed0").symlink_to(elsewhere)
    cfg = cli.write_config(tmp_path / "c.toml", rounds=1)
    for extra in ([], ["--resume"], ["--force"]):
        line = cli.one_error(cli.fedskew("run", str(cfg), "--out", "o", *extra, "--no-progress", cwd=tmp_path))
        assert "fedavg-seed0 is a symbolic link" in line
    assert list(elsewhere.iterdir()) == []


@pytest.mark.slow
def test_a_report_that_cannot_be_written_is_not_a_success(tmp_path: Path) -> None:
    """A foreign, damaged run folder inside --out: the runs finish and are kept, the exit code says the
    report is missing."""
    (tmp_path / "o" / "stray").mkdir(parents=True)
    (tmp_path / "o" / "stray" / "summary.json").write_text("{")
    cfg = cli.write_config(tmp_path / "c.toml", rounds=1)
    res = cli.fedskew("run", str(cfg), "--out", "o", "--no-progress", cwd=tmp_path)
    assert res.code == 1 and "Traceback" not in res.err
    line = [ln for ln in res.err_lines if ln.startswith("fedskew: error:")]
    assert len(line) == 1 and "no report was written" in line[0] and "stray/summary.json" in line[0]
    assert (tmp_path / "o" / "fedavg-seed0" / "summary.json").is_file()
    assert not (tmp_path / "o" / "report" / "report.html").exists()


@pytest.mark.slow
def test_runs_that_fail_leave_no_lock_and_no_empty_folder(tmp_path: Path) -> None:
    """A data error after the run started (the dataset's files are missing) leaves nothing; a retry
    without --out reuses the same runs/<name> folder instead of moving to runs/<name>-2."""
    raw = tiny_config(rounds=1, name="tiny")
    raw["dataset"] = {"name": "fashion_mnist", "train_fraction": 0.1}
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump(raw))
    (tmp_path / "empty").mkdir()
    for _ in range(2):
        res = cli.fedskew("run", str(cfg), "--data-dir", str(tmp_path / "empty"), "--no-progress", cwd=tmp_path)
        cli.one_error(res, after_start=True)
        assert "-> runs/tiny\n" in res.err, res.err
    assert not list((tmp_path / "runs").rglob(LOCK_FILE))
    assert not list((tmp_path / "runs").rglob("*-seed0"))


# ---- 7. optional components fail in one line, once ------------------------------------------------------
@pytest.mark.slow
def test_tensorboard_on_a_read_only_folder_is_one_line_without_a_thread_traceback(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    board = tmp_path / "o" / "fedavg-seed0" / "tensorboard"
    board.mkdir(parents=True)
    mount = f"mount --bind {board} {board} && mount -o remount,bind,ro {board}"
    if subprocess.run(["unshare", "--mount", "sh", "-c", mount], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount read-only here")
    cfg = cli.write_config(tmp_path / "c.toml", rounds=2, logging={"tensorboard": True})
    res = cli.fedskew("run", str(cfg), "--out", "o", "--force", "--no-progress", cwd=tmp_path,
                  prefix=["unshare", "--mount", "sh", "-c", f'{mount} && exec "$@"', "sh"])
    line = cli.one_error(res, after_start=True)
    assert "o/fedavg-seed0/tensorboard" in line and "read-only file system" in line and "b'" not in line


@pytest.mark.slow
def test_tensorboard_where_a_file_stands_is_one_line(tmp_path: Path) -> None:
    run = tmp_path / "o" / "fedavg-seed0"
    run.mkdir(parents=True)
    (run / "tensorboard").write_text("not a folder")
    cfg = cli.write_config(tmp_path / "c.toml", rounds=1, logging={"tensorboard": True})
    line = cli.one_error(cli.fedskew("run", str(cfg), "--out", "o", "--force", "--no-progress", cwd=tmp_path),
                     after_start=True)
    assert "o/fedavg-seed0/tensorboard: exists and is not a folder" in line


# ---- 8. sizes are bounded before memory is ---------------------------------------------------------------
@pytest.mark.parametrize("overrides, needle", [
    (["algorithm.name=feddm", "algorithm.ipc=1000000000"], "algorithm.ipc must be at most 10_000"),
    (["algorithm.local_epochs=1000000"], "algorithm.local_epochs must be at most 10_000"),
    (["algorithm.batch_size=10000000"], "algorithm.batch_size must be at most 65_536"),
    (["algorithm.name=feddc", "algorithm.condense_iterations=1000000000"], "condense_iterations must be at most"),
    (["algorithm.name=fedaf", "algorithm.server.epochs=1000000"], "algorithm.server.epochs must be at most"),
    (["partition.num_clients=100000000"], "partition.num_clients must be at most 1_000_000"),
    (["model.name=mlp", "model.hidden=[64,100000000]"], "model.hidden must be at most 65_536"),
    (["eval.personalized_epochs=1000000", "partition.client_test_fraction=0.2"], "personalized_epochs must be"),
    (["algorithm.clients_per_round=50"], "algorithm.clients_per_round = 50 is more than partition.num_clients = 6"),
])
def test_sizes_beyond_memory_are_one_line_before_anything_runs(tmp_path: Path, inline: Any, overrides: list[str],
                                                               needle: str) -> None:
    cfg = cli.write_config(tmp_path / "c.toml", rounds=1)
    start_time = time.monotonic()
    assert needle in cli.one_error(inline("run", str(cfg), *overrides, "--no-progress"))
    assert time.monotonic() - start_time < 60  # refused up front, not after an allocation
    assert not (tmp_path / "runs").exists()


def test_condense_bounds_its_sizes(inline: Any) -> None:
    assert "--ipc must be an integer in [1, 10_000]" in cli.one_error(inline("condense", "--ipc", "100000000"))


def test_a_plugin_parameter_class_is_bounded_by_the_same_names() -> None:
    from dataclasses import dataclass

    from fedskew.core.params import build_params

    @dataclass
    class Mine:
        local_epochs: int = 1

    with pytest.raises(ConfigError, match=r"my\.local_epochs must be at most 10_000"):
        build_params(Mine, {"local_epochs": 10**6}, prefix="my.")


# ---- 9. a stop request ends a run within seconds, every time ----------------------------------------------
@pytest.mark.slow
def test_sigterm_ends_a_pooled_run_within_seconds_every_time(tmp_path: Path, started: list) -> None:
    """``FEDSKEW_SIGTERM_TRIALS`` trials (3 here, 20 in benchmarks/integrity.py) of a run with two workers,
    each stopped at a random moment after round 3: exit 143 within the grace period, no worker left, and the
    last finished round's metrics and checkpoint kept and readable."""
    from fedskew.cli.process import STOP_GRACE_S

    rng = random.Random(0)
    took = []
    for trial in range(TRIALS):
        cfg = cli.write_config(tmp_path / f"t{trial}.toml", rounds=cli.LONG, workers=2)
        run = tmp_path / f"o{trial}" / "fedavg-seed0"
        proc = cli.start(started, tmp_path, "run", str(cfg), "--out", f"o{trial}", "--no-progress")
        cli.wait_for(lambda run=run: (run / "metrics.jsonl").is_file() and len(cli.rounds_of(run)) >= 3, what="round 3")
        time.sleep(rng.uniform(0.0, 0.6))  # a random moment of a round
        helpers = cli.children(proc.pid)
        t0 = time.monotonic()
        proc.terminate()
        code = proc.wait(STOP_GRACE_S + 30)
        took.append(time.monotonic() - t0)
        assert code == 143, proc.stderr.read() if proc.stderr else ""
        cli.wait_for(lambda h=helpers: not any(cli.alive(p) for p in h), timeout=10, what="the workers to end")
        done = cli.rounds_of(run)
        assert done == list(range(1, len(done) + 1))
        assert 1 <= int(load_checkpoint(run / "checkpoints")["round"]) <= len(done)
    print(f"SIGTERM: {TRIALS} trials, seconds to exit: max {max(took):.2f}, "
          f"mean {sum(took) / len(took):.2f}")
    assert max(took) < STOP_GRACE_S + 2.0, took


STUCK = """
import atexit
import time

atexit.register(time.sleep, 120)  # winding down never ends: the watchdog must end the process
"""


@pytest.mark.slow
def test_a_run_whose_wind_down_hangs_still_ends_within_the_grace_period(tmp_path: Path,
                                                                      started: list) -> None:
    """A stop whose clean-up never finishes (here an exit handler that sleeps two minutes, as a pool stuck on
    a dead worker's lock once did): the watchdog ends the process with 143 after STOP_GRACE_S seconds."""
    from fedskew.cli.process import STOP_GRACE_S

    plugin = tmp_path / "stuck.py"
    plugin.write_text(STUCK)
    cfg = cli.write_config(tmp_path / "c.toml", rounds=cli.LONG, workers=2)
    run = tmp_path / "o" / "fedavg-seed0"
    proc = cli.start(started, tmp_path, "run", str(cfg), "--import", str(plugin), "--out", "o", "--no-progress")
    cli.wait_for(lambda: (run / "metrics.jsonl").is_file() and len(cli.rounds_of(run)) >= 2, what="round 2")
    t0 = time.monotonic()
    proc.terminate()
    assert proc.wait(STOP_GRACE_S + 30) == 143
    took = time.monotonic() - t0
    assert STOP_GRACE_S - 1 <= took < STOP_GRACE_S + 2, took
    err = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in err and err.count("fedskew: terminated") == 1, err
    assert int(load_checkpoint(run / "checkpoints")["round"]) >= 1


def test_recorded_configs_compare_nan_equal_to_nan() -> None:
    """A record written before configs were stored in full keeps ``attack = nan`` as a float NaN."""
    from fedskew.config.files import same_value

    nan = float("nan")
    assert same_value({"faults": {"attack": nan}}, {"faults": {"attack": nan}})
    assert same_value([1, nan], [1, nan]) and not same_value([1, nan], [1, 2.0])
    assert not same_value(nan, 0.0) and not same_value({"a": nan}, {"b": nan})
