"""Where a short run's first seconds go (issue 46, point 1): imports, federation (dataset decode and partition),
worker-pool start, the rounds, the report, against ``python -c "import torch"``.

Runs ``fedskew run ARGS`` (default: the default experiment, ``rounds=1 --only FedAvg``) in child processes, as a
user runs it, ``--repeat`` times, alternating with ``python -c "import torch"``, and reports the medians:

- ``import_torch_s``: ``python -c "import torch"``, the floor any run pays;
- ``run_s``: the whole ``fedskew run`` command, and its ratio to ``import_torch_s`` (the issue's target: 3x);
- a breakdown of one more run, timed inside its process: ``imports_s`` (importing ``fedskew.cli`` and what
  ``fedskew run`` imports before it plans), ``plan_s`` (config, checks), ``federation_s`` (dataset decode and
  partition: ``federation_for``), ``pool_s`` (the worker pool's start: ``WorkerPool.__init__``), ``rounds_s``
  (the round loop's rounds), ``report_s`` (``write_report``), and ``other_s`` (the rest: the run's set-up,
  checkpoints, the printed table, interpreter start and exit);
- ``heavy_imports``: the cumulative ``-X importtime`` microseconds of the biggest top-level packages a run
  imports (torch, matplotlib, pandas, mlflow, sklearn, ...), and whether each was imported at all.

    python benchmarks/startup.py                                  # the default experiment, rounds=1, FedAvg
    python benchmarks/startup.py --repeat 5 -- experiments/fmnist_fedavg.toml rounds=3
    PYTHONPATH=../main/src python benchmarks/startup.py           # another version of fedskew, same interpreter
    PYTHONPYCACHEPREFIX=/tmp/none python benchmarks/startup.py    # as if no .pyc had been written (fresh clone)

The last line printed is one JSON object. Machines shared with other work swing by seconds: compare versions
in one call (``--repeat`` alternates them with the torch baseline) and read the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_ARGS = ["rounds=1", "--only", "FedAvg"]
HEAVY = ("torch", "matplotlib", "pandas", "mlflow", "wandb", "sklearn", "scipy", "numpy", "PIL", "safetensors",
         "tqdm", "fedskew")

# Run inside the child: time the phases of one `fedskew run` by wrapping the functions that do them.
PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
phases = {}

def timed(owner, name, key):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            phases[key] = phases.get(key, 0.0) + time.perf_counter() - start
    setattr(owner, name, wrapper)

import fedskew.cli

import fedskew.api, fedskew.config, fedskew.engine.experiment as experiment, fedskew.report.html as html
import fedskew.engine.round_loop as round_loop, fedskew.engine.workers as workers
phases["imports"] = time.perf_counter() - t0
timed(fedskew.api, "plan", "plan")
timed(experiment, "federation_for", "federation")
timed(workers.WorkerPool, "__init__", "pool")
timed(round_loop.RoundLoop, "_one_round", "rounds")
timed(html, "write_report", "report")
import fedskew.report
fedskew.report.write_report = html.write_report  # what `fedskew run` imports from the package
code = fedskew.cli.main(sys.argv[1:])
phases["total_in_process"] = time.perf_counter() - t0
print("PHASES " + json.dumps(phases), file=sys.stderr)
sys.exit(code)
"""


def _wall(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, proc


def _heavy_imports(stderr: str) -> dict[str, int]:
    """Cumulative import microseconds of each top-level package in :data:`HEAVY` that was imported."""
    found: dict[str, int] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
        if name in HEAVY and cumulative.isdigit():  # a top-level package (indented names are submodules)
            found[name] = max(found.get(name, 0), int(cumulative))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (and torch imports), alternating")
    parser.add_argument("args", nargs="*", help=f"fedskew run's arguments (default: {' '.join(DEFAULT_ARGS)})")
    opts = parser.parse_args()
    run_args = opts.args or DEFAULT_ARGS
    env = {**os.environ, "FEDSKEW_PROGRESS": "off"}
    python = sys.executable
    torch_s: list[float] = []
    run_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i in range(opts.repeat):
            torch_s.append(_wall([python, "-c", "import torch"], work, env)[0])
            seconds, proc = _wall([python, "-m", "fedskew.cli", "run", *run_args, "--out", f"r{i}", "--no-progress"],
                                  work, env)
            if proc.returncode != 0:
                sys.exit(f"fedskew run failed:\n{proc.stderr[-3000:]}")
            run_s.append(seconds)
            print(f"repeat {i + 1}: import torch {torch_s[-1]:.2f} s, fedskew run {seconds:.2f} s", flush=True)
        seconds, proc = _wall([python, "-X", "importtime", "-c", PROBE, "run", *run_args, "--out", "probe",
                               "--no-progress"], work, env)
        if proc.returncode != 0:
            sys.exit(f"the probed run failed:\n{proc.stderr[-3000:]}")
    phases = json.loads(next(line for line in proc.stderr.splitlines() if line.startswith("PHASES "))[7:])
    known = sum(v for k, v in phases.items() if k != "total_in_process")
    breakdown = {f"{k}_s": round(v, 2) for k, v in phases.items() if k != "total_in_process"}
    breakdown["other_s"] = round(seconds - known, 2)
    torch_median, run_median = statistics.median(torch_s), statistics.median(run_s)
    result = {
        "command": "fedskew run " + " ".join(run_args),
        "import_torch_s": round(torch_median, 2),
        "run_s": round(run_median, 2),
        "ratio_to_import_torch": round(run_median / torch_median, 2),
        "probed_run_s": round(seconds, 2),
        "breakdown": breakdown,
        "heavy_imports_us": _heavy_imports(proc.stderr),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
