"""benchmarks/gpu_check.py's parts in-process: its GPU-busy sampler (one streaming ``nvidia-smi -lms`` process
read line by line) and its extrapolation of a paper-scale round. The dry run of the whole check is
tests/test_gpu_check.py.

No GPU here: a stand-in ``nvidia-smi`` on PATH (a shell script printing a fixed utilisation) isolates the
sampler's reading of the stream, its window and its stop."""

from __future__ import annotations

import datetime
import importlib.util
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def gpu_check(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_smi(folder: Path, value: str) -> None:
    script = folder / "nvidia-smi"
    # prints "timestamp, value" every 50 ms, as the real tool streams its query with -lms
    script.write_text(f'#!/bin/bash\nwhile true; do echo "$(date +"%Y/%m/%d %H:%M:%S.%N" | cut -c1-23), {value}"; '
                      'sleep 0.05; done\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(sys.platform == "win32", reason="a shell-script stand-in for nvidia-smi")
def test_a_streaming_sampler_fills_a_window_shorter_than_a_second(gpu_check, tmp_path, monkeypatch) -> None:
    fake_smi(tmp_path, "37")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sampler = gpu_check.BusySampler(0, period=0.05)
    assert sampler.available
    sampler.start()
    time.sleep(0.3)
    start = time.time()
    time.sleep(0.6)  # the batched runner's timed rounds on the H200 lasted about this long
    end = time.time()
    sampler.stop.set()
    sampler.join(timeout=5)
    assert not sampler.is_alive()  # stopping ends the nvidia-smi process and the reading thread
    inside = [u for t, u in sampler.samples if start <= t <= end]
    assert len(inside) >= 4
    assert sampler.busy(start, end) == 37.0
    assert sampler.busy(None, end) is None
    assert sampler.busy(end + 10, end + 11) is None  # no samples there


def test_without_nvidia_smi_the_sampler_reports_nothing(gpu_check, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no nvidia-smi
    sampler = gpu_check.BusySampler(0)
    assert not sampler.available
    sampler.start()
    sampler.join(timeout=5)
    assert sampler.samples == [] and sampler.busy(0.0, time.time()) is None


def test_a_paper_round_is_extrapolated_from_fewer_steps(gpu_check) -> None:
    # the H200's FedDM round of 100 steps (2026-11-28): clients 9.46 s, server 11.28 s, evaluation 0.46 s
    measured = {"clients_s": 9.46, "server_s": 11.28, "eval_s": 0.46}
    out = gpu_check.extrapolate(measured, 100, 1000)
    assert out == {"condense_iterations": 1000, "clients_s": 94.6, "round_s": 106.3}
    assert gpu_check.extrapolate(measured, 1000, 1000)["round_s"] == 21.2  # the paper's steps: as measured


def test_a_sample_keeps_nvidia_smi_s_own_time(gpu_check) -> None:
    when, value = gpu_check.parse_sample("2026/11/28 03:45:07.250, 44\n", arrived=9e9)
    assert value == 44.0
    assert abs(when - datetime.datetime(2026, 11, 28, 3, 45, 7, 250000).timestamp()) < 1e-6  # not the arrival
    assert gpu_check.parse_sample("[N/A], 12", arrived=5.0) == (5.0, 12.0)  # a time that does not parse
    with pytest.raises(ValueError):
        gpu_check.parse_sample("2026/11/28 03:45:07.250, [N/A]", arrived=5.0)  # the sampler skips such a line


def test_bad_paper_overrides_are_refused_in_one_line_before_anything_runs(capsys) -> None:
    for bad in ("algorithm.condense_iterations", "dataset.name=fmnist", "=3"):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--paper-set", bad],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stdout == ""
        assert f"--paper-set {bad!r}: expected KEY=VALUE with a TOML value" in proc.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--parts", "paper_batched"], "argument --parts: invalid choice: 'paper_batched'"),
    (["--cap", "paper_batched.FedDM=88"], "--cap 'paper_batched.FedDM=88': expected PART=SECONDS with PART one of"),
    (["--cap", "kip=-1"], "--cap 'kip=-1': expected PART=SECONDS"),
])
def test_unknown_parts_and_caps_are_refused_in_one_line_before_anything_runs(args: list[str], words: str) -> None:
    """A part that no longer exists (paper_batched, removed with the batched distribution matching) is refused, not
    silently left out of the run."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert words in proc.stderr
