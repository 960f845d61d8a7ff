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
# --no-compile: no byte-compiling of every module at install time (PyTorch alone has thousands); Python
# compiles the modules a run imports, once, when it first imports them.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q --no-compile "torch==2.13.0"
stamp=.venv/.fedskew-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --no-compile -e ".[dev]"
  touch "$stamp"
fi
