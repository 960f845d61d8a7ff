#!/usr/bin/env bash
# Set up (if needed), then lint, type-check and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The Ray engine's tests run on a real local cluster: install the optional extra fedskew[ray] here, so CI
# runs them (they skip only where Ray is missing). Ray does not depend on torch, so the pinned one stays.
.venv/bin/python -c "import ray" 2>/dev/null || .venv/bin/python -m pip install -q -e ".[ray]"
# The trackers' tests run W&B (offline) and MLflow (a file store) for real: install the trackers extra.
.venv/bin/python -c "import wandb, mlflow, pandas" 2>/dev/null || .venv/bin/python -m pip install -q -e ".[trackers]"
# Tests that read real datasets look here; with ../shared/datasets present they fail if it is not set.
if [ -z "${FEDSKEW_DATA:-}" ] && [ -d ../shared/datasets ]; then
  export FEDSKEW_DATA="$(cd ../shared/datasets && pwd)"
fi
.venv/bin/ruff check src tests benchmarks
.venv/bin/mypy src/fedskew
.venv/bin/python -m pytest "$@"
