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

from vit_jax.cost import devices


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


class Throughput:
  """Images/s and MFU between two log points, counting only time spent training.

  Wall-clock time inside `paused()` (evaluation, checkpoint saves) is left out.
  """

  def __init__(self, batch_size: int, flops_per_step: float | None):
    self._batch_size = batch_size
    self._flops = flops_per_step
    self._peak = devices.peak_flops_per_device()
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
