"""Connecting the processes of a multi-host run (`jax.distributed.initialize`), for every entry
point that runs stages: vit_jax.main and vit_jax.tools.transfer.

On a multi-host TPU VM slice, or a job of several slices whose environment says so, it connects
automatically (mode 'auto'); elsewhere (CPU or GPU
clusters) every process passes the coordinator's `host:port`, the number of processes and its
own index. A single process needs nothing. A process that goes silent ends the others within
`LOST_PROCESS_TIMEOUT_S` (vit_jax.runtime.liveness, started by vit_jax.runtime.cli).
"""

import os

import jax
from absl import logging

# How long a process that shows no sign of life takes to count as gone (vit_jax.runtime.liveness):
# the survivors of a lost host end within about this. Long compiles and restores do not silence a
# process (its liveness thread runs beside them), a host frozen for this long does.
LOST_PROCESS_TIMEOUT_S = 30.0
# JAX's default heartbeat timeout: its coordination service then ends every other process from
# C++ without a word on the terminal, so it is kept at least 3x vit_jax's own.
_JAX_HEARTBEAT_TIMEOUT_S = 100


def jax_heartbeat_timeout_s(lost_process_timeout_s: float) -> int:
  """jax.distributed's heartbeat timeout for vit_jax's lost-process timeout."""
  return int(max(_JAX_HEARTBEAT_TIMEOUT_S, 3 * lost_process_timeout_s))


def multihost_tpu() -> bool:
  """Whether this is one of several TPU VM workers: of a multi-host slice, or of a job of several
  slices (Multislice) whose MEGASCALE_NUM_SLICES is in the environment."""
  # Set by the TPU VM runtime on every worker of a slice; one entry per host.
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
    lost_process_timeout_s: how long a silent process takes to count as gone
      (vit_jax.runtime.liveness); JAX's own heartbeat timeout is kept well above it.
  """
  if mode == "off" or (mode == "auto" and not coordinator_address and not multihost_tpu()):
    return False
  jax.distributed.initialize(
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
    heartbeat_timeout_seconds=jax_heartbeat_timeout_s(lost_process_timeout_s),
  )
  logging.info(
    "jax.distributed: process %d of %d, %d local / %d global devices",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )
  return True
