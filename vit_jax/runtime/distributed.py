"""Connecting the processes of a multi-host run (`jax.distributed.initialize`), and agreeing on
values between them.

On TPU VM slices (one or several) mode 'auto' connects by itself; on CPU or GPU clusters every
process passes the coordinator's `host:port`, the number of processes and its own index.

The agreement functions (`gather`, `on_every_process`, `largest`, `of_process_0`) are collectives:
every process calls them at the same point (on one process they only return the value). Values
pass through jax's dtypes: a 64-bit integer is cut to 32 bits unless jax_enable_x64 is set.
"""

import os
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

# How long a process that shows no sign of life takes to count as gone (vit_jax.runtime.liveness):
# the survivors of a lost host end within about this (compiles and restores do not silence one).
LOST_PROCESS_TIMEOUT_S = 30.0
# JAX's default heartbeat timeout: its coordination service then ends every other process from
# C++ without a word on the terminal, so it is kept at least 3x vit_jax's own.
_JAX_HEARTBEAT_TIMEOUT_S = 100


def multihost_tpu() -> bool:
  """Whether this is one of several TPU VM workers: of a multi-host slice (TPU_WORKER_HOSTNAMES)
  or of several slices (MEGASCALE_NUM_SLICES)."""
  if "," in os.environ.get("TPU_WORKER_HOSTNAMES", ""):
    return True
  try:
    return int(os.environ.get("MEGASCALE_NUM_SLICES", "1")) > 1
  except ValueError:
    return False


def initialize(
  mode: str,
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  lost_process_timeout_s: float = LOST_PROCESS_TIMEOUT_S,
) -> bool:
  """Connects the processes of a multi-host run (no-op for a single process); whether it did.

  Args:
    mode: 'on' always (cluster auto-detection on TPU, SLURM, ...), 'off' never, 'auto' when
      `coordinator_address` is given or `multihost_tpu()`.
    coordinator_address, num_processes, process_id: for CPU/GPU clusters.
    lost_process_timeout_s: see LOST_PROCESS_TIMEOUT_S; JAX's heartbeat timeout stays above.
  """
  if mode == "off" or (mode == "auto" and not coordinator_address and not multihost_tpu()):
    return False
  jax.distributed.initialize(
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
    heartbeat_timeout_seconds=int(max(_JAX_HEARTBEAT_TIMEOUT_S, 3 * lost_process_timeout_s)),
  )
  logging.info(
    "jax.distributed: process %d of %d, %d local / %d global devices",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )
  return True


def gather(value: Any) -> np.ndarray:
  """Every process's `value` (a number or an array of one shape and dtype on every process), in
  process order: [processes, *shape]."""
  if jax.process_count() == 1:
    return np.asarray(value)[None]
  return np.asarray(multihost_utils.process_allgather(np.asarray(value)))


def on_every_process(ok: bool) -> bool:
  """Whether `ok` holds on every process."""
  return bool(gather(np.int32(ok)).all())


def largest(value: int) -> int:
  """The largest of every process's `value`."""
  return int(gather(np.int64(value)).max())


def of_process_0(value: int) -> int:
  """Process 0's `value`, on every process."""
  return int(gather(np.int64(value))[0])
