#!/usr/bin/env bash
# Set up a fresh clone: a virtual environment in .venv with PyTorch (CPU), fedskew and its dev tools (pytest,
# ruff, mypy, hypothesis): what the default experiment and development need. The optional extras (flower,
# ray, tensorboard, huggingface) are installed on demand: `.venv/bin/pip install -e '.[flower]'`, or all
# that the tests need by scripts/test.sh. Safe to run again: it only installs what is missing or changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# PyTorch first, pinned: on this machine torch==2.13.0 is a local CPU wheel; an open range would pull a
# multi-GB CUDA build from PyPI.
# --no-compile: no byte-compiling of every module at install time (PyTorch alone has thousands); the modules
# a run imports are compiled once, below.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q --no-compile "torch==2.13.0"
stamp=.venv/.fedskew-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --no-compile -e ".[dev]"
  touch "$stamp"
fi
# Byte-compile what a run imports, once. Python writes a module's .pyc when it first imports it, except where
# PYTHONDONTWRITEBYTECODE is set (this project's machine sets it): there every run compiled PyTorch's Python
# files again, half of a short run's time and each worker process's start (docs/performance.md, "Start-up").
# Only the .venv and the clone's own __pycache__ folders are written (ignored by git).
bytecode=.venv/.fedskew-bytecode
if [ ! -f "$bytecode" ] || [ "$stamp" -nt "$bytecode" ]; then
  env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "
import torch, torch._dynamo, torch._inductor, torch.optim, numpy, safetensors.torch, tqdm, PIL.Image
import sklearn.datasets, sklearn.model_selection
import matplotlib.figure, matplotlib.backends.backend_agg, matplotlib.backends.backend_pdf, matplotlib.backends.backend_svg
import fedskew.cli, fedskew.api, fedskew.engine.experiment, fedskew.engine.workers, fedskew.report.html
import fedskew.algorithms.base, fedskew.models, fedskew.data, fedskew.data.partition_plot, fedskew.audit
"
  touch "$bytecode"
fi
