#!/usr/bin/env bash
# Runs on the device machine (see docs/performance.md, "GPU check"): installs the carried wheels, runs the GPU
# check on the first GPU and leaves its JSON line, its log and the GPU's name in $OUT (or here, outside the tool).
# Extra arguments go to benchmarks/gpu_check.py (for example --parts suite w).
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
export PYTHONPATH="$PWD/src:/tmp/site" FEDSKEW_DATA="$PWD/.data" PYTHONUNBUFFERED=1
out="${OUT:-.}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/nvidia_smi.txt"
python3 benchmarks/gpu_check.py --device cuda --out "$out/gpu_check.json" "$@" 2>&1 | tee "$out/gpu_check.log"
