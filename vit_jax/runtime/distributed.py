"""Connecting the processes of a multi-host run (`jax.distributed.initialize`), for every entry
point that runs stages: vit_jax.main and vit_jax.tools.transfer.

On a multi-host TPU VM slice, or a job of several slices whose environment says so, it connects
automatically (mode 'auto'); elsewhere (CPU or GPU
clusters) every process passes the coordinator's `host:port`, the number of processes and its
own index. A single process needs nothing.
"""

import os

import jax
from absl import logging


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
) -> None:
  """Connects the processes of a multi-host run (no-op for a single process).

  Args:
    mode: 'on' always (cluster auto-detection on TPU, SLURM, ...), 'off' never, 'auto' when
      `coordinator_address` is given or `multihost_tpu()`.
    coordinator_address, num_processes, process_id: for CPU/GPU clusters.
  """
  if mode == "off" or (mode == "auto" and not coordinator_address and not multihost_tpu()):
    return
  jax.distributed.initialize(
    coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
  )
  logging.info(
    "jax.distributed: process %d of %d, %d local / %d global devices",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )
