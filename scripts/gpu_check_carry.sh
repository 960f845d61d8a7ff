#!/usr/bin/env bash
# Prepares what benchmarks/gpu_check.py needs on a device machine that has no network and no ../shared:
#   .data/fashion-mnist/  the Fashion-MNIST IDX files (workload W, the paper-scale rounds), from $FEDSKEW_DATA
#                         (default ../shared/datasets)
#   .whl/                 fedskew's one dependency the machine's image lacks (tomli-w), as a wheel
# Both folders are git-ignored; the device tool's `run` carries them (docs/performance.md, "GPU check").
set -euo pipefail
cd "$(dirname "$0")/.."
data="${FEDSKEW_DATA:-../shared/datasets}"
if [ ! -d "$data/fashion-mnist" ]; then
    echo "no $data/fashion-mnist: set FEDSKEW_DATA to a folder laid out like shared/datasets" >&2
    exit 1
fi
rm -rf .data .whl
mkdir -p .data .whl
cp -r "$data/fashion-mnist" .data/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
    -d .whl "tomli-w==1.2.0"
du -sh .data .whl
