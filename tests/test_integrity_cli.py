"""Issue 26, bad input and run folders through the real command line (a ``fedskew`` process each; the bad
values of single settings through the command's ``main`` in this process, the first of them also as a process).

Every case ends with exit code 2 and one line ``fedskew: error: ...`` naming the bad value, never a
traceback, and (the integrity cases) nothing written, overwritten or duplicated. The cases are listed,
with the test of each, in ``benchmarks/integrity.py``.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.cli import main
from tests.helpers.cli import RUN_HEADER, Result, fedskew, one_error, snapshot, write_config


@pytest.fixture
def cfg_file(tmp_path: Path) -> Path:
    return write_config(tmp_path / "tiny.toml", rounds=2)


def refused(tmp_path: Path, *args: str, needle: str) -> str:
    """``fedskew ARGS`` in ``tmp_path`` fails with one line holding ``needle`` and writes nothing."""
    before = snapshot(tmp_path)
    line = one_error(fedskew(*args, cwd=tmp_path))
    assert needle in line, line
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "runs").exists()
    return line


# ---- every bad value: one line, before anything runs, no folder ---------------------------------------
BAD_VALUES = {
    "name=5": "name must be a string, got 5",
    "partition.seed=abc": "partition.seed must be an integer, got 'abc'",
    "dataset.image_size=10000000": "dataset.image_size must be an integer in [2, 1024], got 10000000",
    "algorithm.lr=inf": "algorithm.lr must be a finite number, got inf",
    "algorithm.lr=nan": "algorithm.lr must be a finite number, got nan",
    "algorithm.lr=-inf": "algorithm.lr must be a finite number, got -inf",
    "partition.alpha=inf": "partition.alpha must be a finite number, got inf",
    "rounds=99999999999999999999": "rounds must be an integer of at most 64 bits",
    "rounds=1000001": "rounds must be an integer in [1, 1_000_000], got 1000001",
    "workers=99999": "workers must be an integer in [0, 1024]",
    "name=../../x": "name must be a folder name inside runs/",
    "name=": "name must be a folder name inside runs/",
    "name=/tmp/x": "name must be a folder name inside runs/",
    "name=.": "name must be a folder name inside runs/",
    "seeds=[0,0]": "seeds must be a non-empty list of distinct integers, got [0, 0]",
    "seeds=[]": "seeds must be a non-empty list of distinct integers, got []",
}
"""Override -> what its one line says (the test id is the override)."""


@pytest.mark.parametrize("override", list(BAD_VALUES))
@pytest.mark.slow
def test_bad_values_are_one_line_before_anything_runs(tmp_path: Path, cfg_file: Path, override: str,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Each value through the command's ``main`` in this process (what the ``fedskew`` process runs, without an
    interpreter start-up per value); the first value also through a real ``fedskew`` process."""
    if override == next(iter(BAD_VALUES)):
        refused(tmp_path, "run", str(cfg_file), override, "--no-progress", needle=BAD_VALUES[override])
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = main(["run", str(cfg_file), override, "--no-progress"])
    out = capsys.readouterr()
    line = one_error(Result(code, out.out, out.err))
    assert BAD_VALUES[override] in line, line
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_an_empty_out_is_refused(tmp_path: Path, cfg_file: Path) -> None:
    refused(tmp_path, "run", str(cfg_file), "--out", "", "--no-progress", needle="--out must name a folder")


@pytest.mark.slow
def test_seed_on_the_command_line_sets_the_seeds(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "seeds.toml", rounds=1, seeds=[0, 1])
    res = fedskew("run", str(cfg), "seed=5", "--out", "o", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    assert sorted(p.name for p in (tmp_path / "o").iterdir() if p.name != "report") == ["fedavg-seed5"]
    refused(tmp_path, "run", str(cfg), "seed=5", "seeds=[1]", "--out", "p", needle="give seed=K or seeds=[...]")


@pytest.mark.slow
def test_duplicate_labels_and_per_variant_seeds_are_refused(tmp_path: Path, cfg_file: Path) -> None:
    base = cfg_file.read_text()
    twins = tmp_path / "twins.toml"
    twins.write_text(base + '\n[[variants]]\nlabel = "A"\n\n[[variants]]\nlabel = "A"\n"algorithm.lr" = 0.2\n')
    refused(tmp_path, "run", str(twins), "--no-progress", needle="two variants share the label 'A'")
    seeded = tmp_path / "seeded.toml"
    seeded.write_text(base + '\n[[variants]]\nlabel = "A"\nseed = 3\n')
    refused(tmp_path, "run", str(seeded), "--no-progress", needle="variant 'A' sets seed")


@pytest.mark.slow
def test_a_bad_second_variant_stops_everything_before_the_first_runs(tmp_path: Path, cfg_file: Path) -> None:
    two = tmp_path / "two.toml"
    two.write_text(cfg_file.read_text() + '\n[[variants]]\nlabel = "good"\n\n[[variants]]\nlabel = "bad"\n'
                   '"partition.alpha" = 0\n')
    refused(tmp_path, "run", str(two), "--out", "o", "--no-progress", needle="partition.alpha must be > 0")
    refused(tmp_path, "partition", str(two), needle="partition.alpha must be > 0")
    refused(tmp_path, "deploy", "init", "app", str(two), "--label", "good", needle="partition.alpha must be > 0")
    assert not (tmp_path / "o").exists() and not (tmp_path / "app").exists()


@pytest.mark.slow
def test_faults_attack_takes_the_documented_words_unquoted(tmp_path: Path, cfg_file: Path) -> None:
    res = fedskew("run", str(cfg_file), "faults.attack=nan", "faults.corrupt=0.5", "rounds=3", "--out", "o",
                  "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    metrics = tmp_path / "o" / "fedavg-seed0" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    reasons = [reason for r in records for _, reason in r["rejected"]]
    assert reasons and all("NaN" in reason for reason in reasons)
    res = fedskew("run", str(cfg_file), "faults.attack=inf", "faults.corrupt=0.5", "rounds=1", "--out", "p",
                  "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err


@pytest.mark.slow
def test_a_round_whose_every_reply_is_rejected_stops_the_run_in_one_error_line(tmp_path: Path, cfg_file: Path) -> None:
    """Every reply of round 1 corrupted: exit 2, one error line naming the round and the reasons (after the
    logged rejections), no traceback, no round recorded."""
    res = fedskew("run", str(cfg_file), "faults.corrupt=0.99", "--out", "o", "--no-progress", cwd=tmp_path)
    assert res.code == 2 and "Traceback" not in res.err + res.out, res.err
    *logged, line = res.err_lines
    assert line.startswith("fedskew: error: round 1: every reply to 'train' was rejected (client "), res.err
    assert "holds NaN or inf" in line and "the run stops here" in line
    assert logged[0].startswith(RUN_HEADER) and len(logged) == 4, res.err  # the header, three rejections
    assert all(x.startswith("round 1: rejected the 'train' reply of client ") for x in logged[1:]), res.err
    assert (tmp_path / "o" / "fedavg-seed0" / "metrics.jsonl").read_text() == ""


@pytest.mark.slow
def test_a_model_too_large_for_memory_is_one_line(tmp_path: Path, cfg_file: Path) -> None:
    # Within every size bound (a width of 65,536 is allowed), yet one 3x3 convolution of that width needs 154 GB.
    res = fedskew("run", str(cfg_file), "model.name=convnet", "model.net_width=65536", "--out", "o", "--no-progress",
                  cwd=tmp_path)
    assert "out of memory" in one_error(res, after_start=True)


# ---- config files that cannot be read ---------------------------------------------------------------
@pytest.mark.slow
def test_a_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('name = "café"\n'.encode("latin-1"))
    refused(tmp_path, "run", str(bad), needle="is not UTF-8 text (byte 0xe9")
    refused(tmp_path, "deploy", "init", "app", str(bad), needle="is not UTF-8 text")
    refused(tmp_path, "partition", str(bad), needle="is not UTF-8 text")


@pytest.mark.slow
def test_a_config_that_is_a_folder_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "cfg.toml").mkdir()
    refused(tmp_path, "run", "cfg.toml", needle="is a folder, not a TOML file")


def _without_root_file_access() -> None:
    """Drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set before exec (as root, file
    permissions are otherwise not enforced): the child runs as root, but cannot read a mode-000 file."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _unreadable_for_children(tmp_path: Path) -> Any:
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0)
    hook = _without_root_file_access if os.geteuid() == 0 else None
    try:
        readable = subprocess.run(["cat", str(probe)], capture_output=True, preexec_fn=hook).returncode == 0
    except (OSError, subprocess.SubprocessError):
        readable = True
    probe.unlink()
    if readable:
        pytest.skip("cannot make a file unreadable here")
    return hook


@pytest.mark.slow
def test_an_unreadable_config_is_one_line(tmp_path: Path, cfg_file: Path) -> None:
    hook = _unreadable_for_children(tmp_path)
    cfg_file.chmod(0)
    try:
        line = one_error(fedskew("run", str(cfg_file), cwd=tmp_path, preexec_fn=hook))
    finally:
        cfg_file.chmod(0o644)
    assert f"cannot read config {cfg_file}: Permission denied" in line


# ---- where results go -------------------------------------------------------------------------------
@pytest.mark.slow
def test_out_naming_an_existing_file_is_one_line_and_the_file_is_kept(tmp_path: Path, cfg_file: Path) -> None:
    (tmp_path / "results").write_text("mine")
    refused(tmp_path, "run", str(cfg_file), "--out", "results", "--no-progress", needle="--out results is a file")
    assert (tmp_path / "results").read_text() == "mine"


@pytest.mark.slow
def test_out_in_an_unwritable_folder_is_one_line(tmp_path: Path, cfg_file: Path) -> None:
    hook = _unreadable_for_children(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        line = one_error(fedskew("run", str(cfg_file), "--out", str(locked / "o"), "--no-progress", cwd=tmp_path,
                                 preexec_fn=hook))
    finally:
        locked.chmod(0o755)
    assert f"{locked / 'o'}: permission denied" in line
    assert list(locked.iterdir()) == []


@pytest.mark.slow
def test_out_on_a_read_only_file_system_is_one_line(tmp_path: Path, cfg_file: Path) -> None:
    mount = tmp_path / "ro"
    mount.mkdir()
    if shutil.which("unshare") is None:
        pytest.skip("no unshare to mount a read-only file system")
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {mount}"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot mount a read-only file system here")
    script = f'mount -t tmpfs -o ro tmpfs {mount} && exec "$@"'
    res = fedskew("run", str(cfg_file), "--out", str(mount / "o"), "--no-progress", cwd=tmp_path,
                  prefix=["unshare", "--mount", "sh", "-c", script, "sh"])
    assert f"{mount / 'o'}: read-only file system" in one_error(res)


@pytest.mark.slow
def test_deploy_init_into_a_file_is_one_line(tmp_path: Path, cfg_file: Path) -> None:
    (tmp_path / "app").write_text("mine")
    refused(tmp_path, "deploy", "init", "app", str(cfg_file), needle="app is a file, not a folder")
    assert (tmp_path / "app").read_text() == "mine"
    refused(tmp_path, "deploy", "init", "app2", str(cfg_file), "partition.alpha=0", needle="partition.alpha")
    assert not (tmp_path / "app2").exists()


# ---- resuming: refuse what would mix or lose results -----------------------------------------------
@pytest.fixture(scope="module")
def stopped_template(tmp_path_factory: pytest.TempPathFactory, finished_run: Callable[[int], Path]) -> Path:
    """A 6-round run stopped after round 4 (its checkpoint): made as a 4-round run whose rounds were raised."""
    run = tmp_path_factory.mktemp("stopped") / "o" / "fedavg-seed0"
    shutil.copytree(finished_run(4), run, symlinks=True)
    path = run / "config.toml"
    path.write_text(path.read_text().replace("rounds = 4", "rounds = 6"))  # rounds may change on a resume
    return run


@pytest.fixture
def stopped_run(stopped_template: Path, tmp_path: Path) -> Path:
    """A copy of the stopped run for one test."""
    run = tmp_path / "o" / stopped_template.name
    shutil.copytree(stopped_template, run)
    return run


def resume_refused(run: Path, *overrides: str, needle: str, capsys: pytest.CaptureFixture[str] | None = None) -> None:
    """``fedskew run --resume RUN OVERRIDES`` fails with one line holding ``needle`` and changes nothing in RUN: a
    ``fedskew`` process, or with ``capsys`` the command's ``main`` in this process."""
    before = snapshot(run)
    args = ["run", "--resume", str(run), *overrides, "--no-progress"]
    if capsys is None:
        res = fedskew(*args, cwd=run.parent)
    else:
        capsys.readouterr()
        code = main(args)
        out = capsys.readouterr()
        res = Result(code, out.out, out.err)
    line = one_error(res)
    assert needle in line, line
    assert snapshot(run) == before


@pytest.mark.slow
def test_resume_below_the_checkpoint_is_refused(stopped_run: Path) -> None:
    resume_refused(stopped_run, "rounds=2", needle="is at round 4, beyond the run's rounds = 2")


def edit_checkpoint(run: Path, **changes: Any) -> None:
    path = run / "checkpoints" / "last.pt"
    ck = torch.load(path, weights_only=True)
    for key, value in changes.items():
        if value is None:
            del ck[key]
        else:
            ck[key] = value(ck[key]) if callable(value) else value
    torch.save(ck, path)


DAMAGE: dict[str, tuple[dict[str, Any], str]] = {
    "round-beyond-rounds": (
        {"round": 99, "records": json.dumps([{"round": k, "accuracy": 0.5} for k in range(1, 100)])},
        "is at round 99, beyond the run's rounds = 6",
    ),
    "round-beyond-records": ({"round": 99}, "is at round 99 but its records hold rounds 1 ... 4"),
    "missing-keys": ({"model": None, "ledger": None}, "lacks model, ledger"),
    "records-not-json": ({"records": "not json ["}, "its records are not valid JSON"),
    "records-not-records": ({"records": "[1, 2]"}, "its records are not a list of round records"),
    "wrong-shapes": (
        {"model": lambda m: {k: torch.zeros(3, *v.shape) for k, v in m.items()}}, "does not fit this run's model"
    ),
    "round-not-int": ({"round": "four"}, "round must be a int, found str"),
}
"""How a checkpoint is damaged -> what the one line says (the test id is the key)."""


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.slow
def test_a_damaged_checkpoint_is_one_line_and_changes_nothing(stopped_run: Path, damage: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The first damage through a ``fedskew`` process, the others through the command's ``main`` in this process."""
    changes, needle = DAMAGE[damage]
    edit_checkpoint(stopped_run, **changes)
    resume_refused(stopped_run, needle=needle, capsys=None if damage == next(iter(DAMAGE)) else capsys)


@pytest.mark.slow
def test_a_checkpoint_that_is_not_one_is_one_line(stopped_run: Path) -> None:
    (stopped_run / "checkpoints" / "last.pt").write_bytes(b"\x00garbage" * 10)
    resume_refused(stopped_run, needle="cannot read checkpoint")


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        pytest.param("lr = 0.1", "lr = 0.2", "was edited after the checkpoint of round 4 (changed: algorithm)",
                     id="hyper-parameter"),
        pytest.param("hidden = [", "hidden = [64, ", "(changed: model)", id="model"),
        pytest.param("lr = 0.1", "lr = [", "invalid TOML", id="not-toml"),
        pytest.param("lr = 0.1", "lr = nan", "algorithm.lr must be a finite number", id="bad-value"),
    ],
)
@pytest.mark.slow
def test_a_config_edited_after_the_run_is_one_line(stopped_run: Path, old: str, new: str, needle: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The first edit through a ``fedskew`` process, the others through the command's ``main`` in this process."""
    path = stopped_run / "config.toml"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    resume_refused(stopped_run, needle=needle, capsys=None if new == "lr = 0.2" else capsys)


@pytest.mark.slow
def test_the_resume_that_is_allowed_still_works(stopped_run: Path) -> None:
    res = fedskew("run", "--resume", str(stopped_run), "--no-progress", cwd=stopped_run.parent)
    assert res.code == 0, res.err
    rounds = [json.loads(line)["round"] for line in (stopped_run / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1, 2, 3, 4, 5, 6]


def test_a_worker_dying_mid_handshake_leaves_no_traceback_and_other_errors_still_print() -> None:
    import sys
    import traceback

    from fedskew.cli.process import quiet_peer_resets

    printed: list[type[BaseException]] = []
    hook = quiet_peer_resets(lambda kind, value, tb: printed.append(kind))
    assert quiet_peer_resets(hook) is hook  # wrapping twice (main() called again) adds nothing
    sharer = "/x/multiprocessing/resource_sharer.py"
    code = compile("raise ConnectionResetError(104, 'Connection reset by peer')", sharer, "exec")
    eof = compile("raise EOFError", sharer, "exec")
    for raiser in (lambda: exec(code), lambda: exec(eof), lambda: (_ for _ in ()).throw(ConnectionResetError()),
                   lambda: 1 / 0):
        try:
            raiser()
        except BaseException:
            hook(*sys.exc_info())  # type: ignore[operator]
    assert printed == [ConnectionResetError, ZeroDivisionError], traceback.format_exc()
