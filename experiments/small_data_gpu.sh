#!/usr/bin/env bash
# The small-data grid (experiments/small_data.py) with three seeds per arm and fraction on one
# NVIDIA GPU, for when a device is lent (15 minutes of device time for everything): cut at 450 s,
# what it printed kept in $OUT/small_data_gpu.log (or /tmp), its results.json, table.md and
# small_data.png in $OUT/small_data_gpu/. Never run by the tests. Not yet run on a GPU: whether
# the grid (36 training stages and 36 fine-tunes) fits in the cut is unmeasured.
#
# The machine's image has jax, flax and optax but not ml_collections: carry its wheel in .whl/
# (pip download --no-deps --only-binary=:all: ml_collections==1.1.0 -d .whl), installed into
# /tmp/site first (experiments/gpu_site.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source experiments/gpu_site.sh
gpu_site small_data_gpu "ml_collections, jax, tensorflow"
export PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
log="$out/small_data_gpu.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$log"
timeout 450 python3 -m experiments.small_data --seeds=3 --workdir=/tmp/vit_small_data_gpu \
  --out="$out/small_data_gpu" 2>&1 | tee -a "$log"
