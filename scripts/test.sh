#!/usr/bin/env bash
# Set up (if needed), install the optional extras the tests exercise, then lint, type-check and run the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The tests run real Flower processes (and Flower's local simulation), a real local Ray cluster, the
# TensorBoard writer, Hugging Face datasets and the trackers (W&B offline, MLflow's file store): install
# those extras here so CI runs them (they skip only where an extra is missing). None of them depends on
# torch, so the pinned one stays.
stamp=.venv/.fedskew-test-extras
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q -e ".[dev,flower,ray,tensorboard,huggingface,trackers,privacy]"
  touch "$stamp"
fi
# Tests that read real datasets look here; with ../shared/datasets present they fail if it is not set.
if [ -z "${FEDSKEW_DATA:-}" ] && [ -d ../shared/datasets ]; then
  export FEDSKEW_DATA="$(cd ../shared/datasets && pwd)"
fi
# GNU OpenMP's spin, shortened as `import fedskew` does (docs/performance.md, "OpenMP's spin"): the test processes
# may load torch first, and two of them share the cores.
export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-1000}"
.venv/bin/ruff check src tests benchmarks
.venv/bin/mypy src/fedskew
# pytest-xdist: one worker process per CPU core, at most 4 (each imports torch). --dist loadfile hands out
# whole files, each file's tests on one worker in file order: the tests that share a Flower federation, a Ray
# cluster or the GPU-check dry run are kept in one file each (tests/test_suite_groups.py checks it).
# Later options win: `-n 0` runs serially; `-m "not slow"` is the fast tier (README).
.venv/bin/python -m pytest -n auto --maxprocesses 4 --dist loadfile "$@"
