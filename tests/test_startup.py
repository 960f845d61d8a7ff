"""Issue 46, point 1: what a run imports before its first round. Plotting (matplotlib) and the analysis and
tracker packages (pandas, MLflow, W&B) are imported where they are used (the report after the runs, a tracker
that is on), not by the modules every run imports: each costs seconds on a loaded machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import environment

pytestmark = pytest.mark.slow  # each test starts an interpreter to see what it imports

RUN_PATH = ("fedskew.cli", "fedskew.cli.run", "fedskew.api", "fedskew.config", "fedskew.engine.experiment",
            "fedskew.engine.session", "fedskew.engine.round_loop", "fedskew.engine.tensorboard",
            "fedskew.engine.workers", "fedskew.report", "fedskew.core.figures", "fedskew.runs")


def test_the_modules_a_run_starts_with_import_no_plotting_or_tracker_package() -> None:
    code = (f"import sys, importlib\nfor m in {RUN_PATH!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in ('matplotlib', 'pandas', 'mlflow', 'wandb', 'PIL') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], env=environment(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_digits_come_from_the_array_cache_without_scikit_learn(tmp_path: Path) -> None:
    """The default experiment's data: the first load builds it with scikit-learn and caches it; a later process
    reads the same arrays without importing scikit-learn (2-3 s of a short run's start)."""
    import numpy as np

    from fedskew.data import load_dataset

    built = load_dataset("digits", cache_dir=tmp_path)
    code = ("import sys, numpy as np\nfrom fedskew.data import load_dataset\n"
            f"d = load_dataset('digits', cache_dir={str(tmp_path)!r})\n"
            f"np.savez({str(tmp_path / 'read.npz')!r}, x=d.x_train, y=d.y_train, xt=d.x_test, yt=d.y_test)\n"
            "print('sklearn' in sys.modules, d.mean, d.std)")
    res = subprocess.run([sys.executable, "-c", code], env=environment(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"False {built.mean} {built.std}"
    with np.load(tmp_path / "read.npz") as read:
        for key, array in (("x", built.x_train), ("y", built.y_train), ("xt", built.x_test), ("yt", built.y_test)):
            assert read[key].dtype == array.dtype and np.array_equal(read[key], array), key


def test_importing_fedskew_before_torch_sets_gnu_openmp_s_spin_unless_the_user_did() -> None:
    """``import fedskew`` shortens GNU OpenMP's spin (docs/performance.md, "OpenMP's spin") before torch loads it;
    a value the user set wins."""
    code = "import os, fedskew, torch\nprint(os.environ.get('GOMP_SPINCOUNT'))"
    env = environment()
    env.pop("GOMP_SPINCOUNT", None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "1000", res.stderr
    res = subprocess.run([sys.executable, "-c", code], env={**env, "GOMP_SPINCOUNT": "42"}, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "42", res.stderr


def test_the_startup_benchmark_times_functions_that_exist() -> None:
    """benchmarks/startup.py wraps functions by name inside its child process; a renamed one made it fail with
    an AttributeError (``experiment.build_federation``, 2026-11-28). Each ``timed(owner, name, ...)`` it makes
    names an attribute of that owner."""
    import re

    import fedskew.api
    import fedskew.engine.experiment as experiment
    import fedskew.engine.round_loop as round_loop
    import fedskew.engine.workers as workers
    import fedskew.report.html as html

    probe = (Path(__file__).resolve().parents[1] / "benchmarks" / "startup.py").read_text()
    calls = re.findall(r'^timed\(([\w.]+), "(\w+)", "\w+"\)$', probe, flags=re.M)
    assert len(calls) == 5, calls
    owners = {"fedskew": fedskew, "experiment": experiment, "round_loop": round_loop, "workers": workers, "html": html}
    for owner, name in calls:
        head, *rest = owner.split(".")
        obj = owners[head]
        for part in rest:
            obj = getattr(obj, part)
        assert callable(getattr(obj, name, None)), f"{owner}.{name}"
