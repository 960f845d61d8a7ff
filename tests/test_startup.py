"""Issue 46, point 1: what a run imports before its first round. Plotting (matplotlib) and the analysis and
tracker packages (pandas, MLflow, W&B) are imported where they are used (the report after the runs, a tracker
that is on), not by the modules every run imports: each costs seconds on a loaded machine."""

from __future__ import annotations

import subprocess
import sys

from tests.cli_process import environment

RUN_PATH = ("fedskew.cli", "fedskew.cli.commands", "fedskew.api", "fedskew.config", "fedskew.engine.experiment",
            "fedskew.engine.session", "fedskew.engine.round_loop", "fedskew.engine.tensorboard",
            "fedskew.engine.workers", "fedskew.report", "fedskew.report.style", "fedskew.runs")


def test_the_modules_a_run_starts_with_import_no_plotting_or_tracker_package() -> None:
    code = (f"import sys, importlib\nfor m in {RUN_PATH!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in ('matplotlib', 'pandas', 'mlflow', 'wandb', 'PIL') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], env=environment(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
