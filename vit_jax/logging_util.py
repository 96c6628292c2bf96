"""Observability of a training run: metric writers, progress/ETA, parameter overview, MFU.

Only process 0 writes metrics (TensorBoard event files and metric log lines); the other processes
get a writer that drops them, and still log progress through absl, so a hung host is visible in
its own log. Nothing here synchronises devices.
"""

import contextlib
import time
from typing import Any

import jax
import numpy as np
from absl import logging
from clu import metric_writers, parameter_overview, periodic_actions

# Peak dense bf16 FLOP/s per device, by `jax.Device.device_kind` prefix. TPUs: Cloud TPU system
# architecture pages (cloud.google.com/tpu/docs/v2, /v3, /v4, /v5e, /v5p, /v6e): per chip v2 45,
# v3 123, v4 275, v5e 197, v5p 459, v6e 918 TFLOP/s. v2 and v3 chips are two devices (one per
# TensorCore); v4 and v5p run as one "megacore" device per chip; v5e and v6e have one core.
PEAK_FLOPS = {
  "TPU v2": 45e12 / 2,
  "TPU v3": 123e12 / 2,
  "TPU v4": 275e12,
  "TPU v5 lite": 197e12,
  "TPU v5e": 197e12,
  "TPU v5p": 459e12,
  "TPU v5": 459e12,
  "TPU v6 lite": 918e12,
  "TPU v6e": 918e12,
  "NVIDIA A100": 312e12,
  "NVIDIA H100": 989e12,
  "NVIDIA H200": 989e12,
  "NVIDIA B200": 2250e12,
}

# HBM per device, same sources: per chip v2 16 GiB, v3 32 GiB (two devices each), v4 32 GiB,
# v5e 16 GB, v5p 95 GB, v6e 32 GB (counted here as GiB, as the runtime reports them); GPUs:
# vendor data sheets (GB).
HBM_BYTES = {
  "TPU v2": 8 * 2**30,
  "TPU v3": 16 * 2**30,
  "TPU v4": 32 * 2**30,
  "TPU v5 lite": 16 * 2**30,
  "TPU v5e": 16 * 2**30,
  "TPU v5p": 95 * 2**30,
  "TPU v5": 95 * 2**30,
  "TPU v6 lite": 32 * 2**30,
  "TPU v6e": 32 * 2**30,
  "NVIDIA A100": 80e9,
  "NVIDIA H100": 80e9,
  "NVIDIA H200": 141e9,
}


def _by_kind(table: dict[str, float], device: jax.Device | None) -> float | None:
  kind = (device or jax.devices()[0]).device_kind
  for prefix, value in sorted(table.items(), key=lambda kv: -len(kv[0])):
    if kind.startswith(prefix):
      return value
  return None


def create_writer(workdir: str) -> metric_writers.MetricWriter:
  """TensorBoard + metric log lines on process 0, nothing elsewhere."""
  if jax.process_index() > 0:
    return metric_writers.MultiWriter([])
  return metric_writers.create_default_writer(workdir, asynchronous=True)


def log_parameter_overview(params: Any) -> int:
  """Logs a table of parameter names, shapes and shardings; returns the parameter count."""
  if jax.process_index() == 0:
    # Without statistics: they would need every process to take part in the computation.
    parameter_overview.log_parameter_overview(params, include_stats=False)
  count = sum(int(np.prod(np.shape(x))) for x in jax.tree_util.tree_leaves(params))
  logging.info("parameters: %s", f"{count:,}")
  return count


def peak_flops_per_device(device: jax.Device | None = None) -> float | None:
  """The device's peak FLOP/s if known (TPUs and recent NVIDIA GPUs), else None."""
  return _by_kind(PEAK_FLOPS, device)


def hbm_bytes_per_device(device: jax.Device | None = None) -> int | None:
  """The device's memory (HBM) in bytes if known, else None."""
  hbm = _by_kind(HBM_BYTES, device)
  return None if hbm is None else int(hbm)


def compiled_flops(compiled: Any) -> float | None:
  """FLOPs per device of one call of an AOT-compiled function, from XLA's cost analysis."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001 - not every backend implements it
    return None
  if isinstance(cost, list | tuple):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return float(cost["flops"])


class Throughput:
  """Images/s and MFU between two log points, counting only time spent training.

  Wall-clock time inside `paused()` (evaluation, checkpoint saves) is left out.
  """

  def __init__(self, batch_size: int, flops_per_step: float | None):
    self._batch_size = batch_size
    self._flops = flops_per_step
    self._peak = peak_flops_per_device()
    self._t, self._step = None, None
    self._paused = 0.0  # seconds paused since the previous call

  @contextlib.contextmanager
  def paused(self, pending: Any = None):
    """Excludes the time of the `with` body; `pending` (arrays) is waited for first, so steps
    still running on the devices count as training time."""
    if pending is not None:
      jax.block_until_ready(pending)
    start = time.perf_counter()
    try:
      yield
    finally:
      self._paused += time.perf_counter() - start

  def __call__(self, step: int) -> dict[str, float]:
    """Returns the throughput metrics since the previous call (empty on the first)."""
    now = time.perf_counter()
    out = {}
    if self._t is not None and step > self._step:
      seconds = max(now - self._t - self._paused, 1e-9)
      steps_per_sec = (step - self._step) / seconds
      out["images_per_sec"] = steps_per_sec * self._batch_size
      if self._flops and self._peak:
        out["mfu"] = steps_per_sec * self._flops / self._peak
    self._t, self._step, self._paused = now, step, 0.0
    return out


def report_progress(
  total_steps: int, writer: metric_writers.MetricWriter, every_steps: int
) -> periodic_actions.ReportProgress:
  """steps/s to the writer and an ETA log line every `every_steps` steps."""
  return periodic_actions.ReportProgress(
    num_train_steps=total_steps, writer=writer, every_steps=every_steps, every_secs=None
  )
