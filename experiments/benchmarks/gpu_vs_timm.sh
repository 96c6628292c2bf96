#!/usr/bin/env bash
# ViT-B/16 and ViT-L/16 bf16 train steps on one NVIDIA GPU: vit_jax against timm under
# torch.compile, images/s and MFU, each side in a process of its own (experiments/benchmarks/benchmark_model.py).
# Written for a lent H200 with 15 minutes of device time for everything: the whole run is cut at
# 450 s (under 8 minutes), and what it printed is kept in $OUT/gpu_vs_timm.log (or /tmp).
#
# The machine's image has jax, flax, optax, torch and timm but not ml_collections: carry its wheel
# in .whl/ (pip download --no-deps --only-binary=:all: ml_collections==1.1.0 -d .whl), which is
# installed into /tmp/site first. Batches: 256 (B/16) and 128 (L/16); AdamW; 3 warm-up steps, then
# 5 rounds of 10 steps per side.
set -euo pipefail
cd "$(dirname "$0")/../.."
source experiments/gpu_site.sh
gpu_site gpu_vs_timm "ml_collections, timm, torch, jax"
export PYTHONUNBUFFERED=1
log="${OUT:-/tmp}/gpu_vs_timm.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$log"
timeout 450 python3 -m experiments.benchmarks.benchmark_model --models=B/16,L/16 --batch_sizes=256,128 \
  --dtypes=bfloat16 --modes=train --timm=compiled --warmup=3 --iters=10 --repeats=5 \
  2>&1 | tee -a "$log"
