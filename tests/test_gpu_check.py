"""benchmarks/gpu_check.py's dry run (``--device cpu --quick``): every part runs at tiny scale on the CPU and the
last line is the JSON the GPU check reports, so the check cannot rot between the sessions that have a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # the dry run, a module fixture: about a minute


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "check.json"
    proc = subprocess.run(
        # Generous caps: this checks that every part runs and reports, not how fast; a loaded CI machine
        # (two test workers on two cores) took over the default 60 s a part.
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick", "--out", str(out),
         "--quick-cap", "400", "--budget", "1500", "--paper-set", "algorithm.condense_iterations=3",
         "--parts", "suite", "w", "steps", "compile", "paper", "inner", "kip"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    data: dict = json.loads(last)
    assert json.loads(out.read_text()) == data  # the file holds the printed line
    return data


def test_the_report_says_what_ran_where(report: dict) -> None:
    assert report["check"] == "gpu_check" and report["device"] == "cpu" and report["quick"] is True
    assert report["gpu"] is None and report["nvidia_smi"] is False
    assert 0 < report["seconds"] <= report["budget_s"]
    assert set(report) >= {"suite", "w", "steps", "compile", "paper", "w_vs_plain", "torch", "python", "runner_keys"}
    assert report["compile"]["status"] == "skipped"  # compiling is left out of the dry run


def test_the_inner_loops_part_reports_flops_against_the_peak(report: dict) -> None:
    inner = report["inner"]  # --quick: W's SGD step only
    assert inner["status"] == "ok" and inner["device"] == "cpu" and inner["peak_gflops_f32"] > 0
    [row] = inner["rows"]
    assert row["loop"].startswith("sgd") and row["gflop"] > 0 and 0 < row["of_peak"] < 5


def test_the_kip_part_counts_a_step_one_client_after_another_and_batched(report: dict) -> None:
    kip = report["kip"]  # --quick: the synthetic stand-in's 3 clients
    assert kip["status"] == "ok" and kip["device"] == "cpu" and kip["ipc"] == 2
    ops = kip["kip_step_ops"]
    assert ops["clients"] == 3 and 0 < ops["batched"] < ops["sequential"]
    assert set(ops["seconds_10_steps"]) == {"sequential", "batched"} and ops["seconds_kind"] == "CPU"


def test_the_gpu_suite_ran_and_skipped_without_cuda(report: dict) -> None:
    suite = report["suite"]
    assert suite["status"] == "ok" and suite["failed"] == suite["error"] == 0 and suite["failed_tests"] == []
    assert suite["skipped"] >= 30 and suite["passed"] == 0  # every test of tests/gpu, skipped on a CPU


def test_workload_w_ran_for_the_plain_loop_and_every_runner_present(report: dict) -> None:
    w = report["w"]
    assert set(w) == {"plain", "sequential", "workers_per_device", "clients_in_parallel"}
    for name, res in w.items():
        if res["status"] == "absent":  # a runner this code does not have yet
            assert name not in report["runner_keys"] and name != "sequential"
            continue
        assert res["status"] == "ok", (name, res)
        assert res["s_round"] > 0 and res["first_round_s"] > 0 and res["images_per_s"] > 0, name
        assert res["rounds_timed"] == 1 and 0.0 <= res["accuracy"] <= 1.0
        assert res["gpu_busy_pct"] is None and res["kernel_launches_per_round"] is None  # no GPU here
        assert res["aten_ops_per_round"] > 100  # a round of training and evaluation, profiled
    assert report["w_vs_plain"]["plain"] == 1.0 and report["w_vs_plain"]["sequential"] > 0


def test_the_step_options_and_both_paper_rounds_ran(report: dict) -> None:
    variants = report["steps"]["variants"]
    assert report["steps"]["status"] == "ok" and set(variants) == {"plain", "foreach", "fused"}
    assert variants["plain"]["s_step"] > 0 and variants["foreach"]["max_weight_diff"] == 0.0
    for method in ("FedDM", "FedAF"):
        paper = report["paper"][method]
        assert paper["status"] == "ok", paper
        assert paper["round_s"] > 0 and paper["clients_s"] > 0
        assert paper["scale"]["condense_iterations"] == 3  # --paper-set over the quick scale's 2
        assert "extrapolated" not in paper  # --quick: no paper-scale round to extrapolate to
        assert paper["round_s"] >= paper["clients_s"] and 0.0 <= paper["accuracy"] <= 1.0
