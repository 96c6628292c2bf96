"""Validation top-1 and loss of a classifier over an evaluation split.

The sums stay on device until the end of the pass (`_utils.summing`); padding never counts.
"""

from typing import Any

import jax
import jax.numpy as jnp

from vit_jax.evaluators import _utils
from vit_jax.objectives import supervised

LOSSES = tuple(supervised.LOSSES)


def batch_metrics(
  logits: jax.Array, labels: jax.Array, mask: jax.Array, loss: str = "softmax_xent"
) -> dict[str, jax.Array]:
  """{'correct', 'loss', 'count'} summed over the examples of mask [B] 1 of logits [B, K] and
  labels [B] (or one/multi-hot [B, K]); correct: the argmax class is a positive label."""
  if loss not in LOSSES:
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
  targets = supervised.dense_targets(labels, logits.shape[-1])
  logits = logits.astype(jnp.float32)
  per_example = supervised.LOSSES[loss](logits, targets)
  correct = supervised.top1_correct(logits, targets)
  mask = mask.astype(jnp.float32)
  return {
    "correct": jnp.sum(correct * mask),
    "loss": jnp.sum(per_example * mask),
    "count": jnp.sum(mask),
  }


class ClassificationEvaluator(_utils.OnSplit):
  """Top-1 accuracy and mean loss of `fn(params, images) -> logits [B, K]`."""

  def __init__(self, *args, loss: str = "softmax_xent", name: str = "val", **kwargs):
    if loss not in LOSSES:
      raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    self.loss = loss
    super().__init__(*args, name=name, **kwargs)

  def metrics(self, logits, batch):
    mask = batch.get("mask", jnp.ones(logits.shape[:1], jnp.float32))
    return batch_metrics(logits, batch["label"], mask, self.loss)

  def run(self, params: Any) -> dict[str, float]:
    zeros = {k: jnp.zeros((), jnp.float32) for k in ("correct", "loss", "count")}
    sums = _utils.sum_over_split(self.data, self._accumulate, params, zeros, self.max_examples)
    count = max(sums["count"], 1.0)
    return {
      f"{self.name}/accuracy": sums["correct"] / count,
      f"{self.name}/loss": sums["loss"] / count,
      f"{self.name}/num_examples": sums["count"],
    }
