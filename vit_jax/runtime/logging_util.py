"""Observability of a training run: metric writers, the progress line, parameter overview, MFU.

Only process 0 writes metrics (TensorBoard event files and metric log lines); the other processes
get a writer that drops them, and still log progress through absl, so a hung host is visible in
its own log. Nothing here synchronises devices.
"""

import time
from typing import Any

import jax
import numpy as np
from absl import logging
from clu import metric_writers, parameter_overview

from vit_jax.cost import devices
from vit_jax.runtime import workdir


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
  """Images/s and MFU between two log points, on the goodput account's clock: only the time
  in its training phases counts (vit_jax.runtime.goodput.TRAINING), not evaluations, saves,
  profiling or the compile."""

  def __init__(self, account: Any, batch_size: int, flops_per_step: float | None):
    self._account = account
    self._batch_size = batch_size
    self._flops = flops_per_step
    self._peak = devices.peak_flops_per_device()
    self._seconds, self._step = None, None

  def __call__(self, step: int) -> dict[str, float]:
    """Returns the throughput metrics since the previous call (empty on the first)."""
    seconds = self._account.training_seconds()
    out = {}
    if self._seconds is not None and step > self._step:
      steps_per_sec = (step - self._step) / max(seconds - self._seconds, 1e-9)
      out["images_per_sec"] = steps_per_sec * self._batch_size
      if self._flops and self._peak:
        out["mfu"] = steps_per_sec * self._flops / self._peak
    self._seconds, self._step = seconds, step
    return out


def _duration(seconds: float) -> str:
  """'1h02m', '3m05s' or '42s'."""
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
  if seconds >= 60:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds}s"


class Progress:
  """The line a user watches, one per log step, and one per evaluation:

    step 200/1000 (20%) | loss 0.5123 | accuracy 81.25% | 1,234.5 img/s | goodput 87% | ETA 3m12s
    step 200/1000 | val: accuracy 84.10%, loss 0.4421, num_examples 10,000 (12s)

  The ETA is the remaining steps at the pace since this run (or resume) started, evaluations
  and checkpoint saves included. Logged on process 0 only.
  """

  def __init__(self, total_steps: int, start_step: int):
    self._total, self._start = total_steps, start_step
    self._t0 = time.perf_counter()

  def _log(self, line: str) -> None:
    if jax.process_index() == 0:
      logging.info("%s", line)

  def step(self, step: int, metrics: dict[str, float]) -> str:
    """Logs (and returns) the progress line of `step` from the window's metrics."""
    parts = [f"step {step}/{self._total} ({100 * step / max(self._total, 1):.0f}%)"]
    if "loss" in metrics:
      parts.append(f"loss {metrics['loss']:.4f}")
    if "accuracy" in metrics:
      parts.append(f"accuracy {100 * metrics['accuracy']:.2f}%")
    if "images_per_sec" in metrics:
      parts.append(f"{metrics['images_per_sec']:,.1f} img/s")
    if "goodput/share" in metrics:  # vit_jax.runtime.goodput: the workdir's, all reruns included
      parts.append(f"goodput {100 * metrics['goodput/share']:.0f}%")
    done = step - self._start
    if done > 0 and step < self._total:
      pace = (time.perf_counter() - self._t0) / done
      parts.append(f"ETA {_duration(pace * (self._total - step))}")
    line = " | ".join(parts)
    self._log(line)
    return line

  def evaluation(self, step: int, name: str, results: dict[str, float], seconds: float) -> None:
    """Logs one line of an evaluation's `results`, which took `seconds`.

    Per-class breakdowns (`<name>/iou/<class>`, a second '/' in the key) are left off the line;
    they are in the metrics written to TensorBoard and the stage's final metrics.
    """
    shown = []
    for key, value in sorted(results.items()):
      label = key.split("/", 1)[-1]
      if "/" in label:
        continue
      percent = "accuracy" in label or "shot" in label
      if label.startswith("num_"):  # a count (the examples an evaluation read): all its digits
        shown.append(f"{label} {int(value):,}")
      else:
        shown.append(f"{label} {100 * value:.2f}%" if percent else f"{label} {value:.4g}")
    self._log(f"step {step}/{self._total} | {name}: {', '.join(shown)} ({_duration(seconds)})")


def flat_hparams(config: Any) -> dict[str, Any]:
  """A config's fields as TensorBoard hparams: scalars as they are, anything else as text."""
  return {
    k: v if isinstance(v, bool | int | float | str) else str(v)
    for k, v in workdir.flatten(config.to_dict()).items()
    if v is not None
  }
