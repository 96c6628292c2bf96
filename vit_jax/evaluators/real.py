"""ImageNet ReaL top-1 (Beyer et al., 2020, "Are we done with ImageNet?"), the paper's Table 2.

ReaL relabels the 50,000 ImageNet validation images with sets of plausible classes (tfds
`imagenet2012_real`, split `validation`, feature `real_label`; the input pipeline turns each set
into a multi-hot target [1000] with `dataset.multi_label`). An image counts as correct when its
top-1 class is in its set; images whose set is empty (about 1,200, judged to fit no class) are
left out of numerator and denominator. Padding (batch `mask` 0) never counts.
"""

from typing import Any

import jax
import jax.numpy as jnp

from vit_jax.evaluators import _utils


def batch_metrics(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
  """{'correct': images whose top-1 class is in their set, 'count': images with a set} of
  logits [B, K], multi-hot ReaL sets [B, K] and mask [B] (0: padding)."""
  top1 = jnp.argmax(logits, axis=-1)
  in_set = jnp.take_along_axis(labels, top1[:, None], axis=-1)[:, 0] > 0
  counted = mask.astype(jnp.float32) * (jnp.sum(labels, axis=-1) > 0)
  return {"correct": jnp.sum(in_set * counted), "count": jnp.sum(counted)}


class RealEvaluator(_utils.OnSplit):
  """ReaL top-1 of `fn(params, images) -> logits [B, K]`; `num_examples` counts images with a
  non-empty set."""

  def __init__(self, *args, name: str = "real", **kwargs):
    super().__init__(*args, name=name, **kwargs)

  def metrics(self, logits, batch):
    if batch["label"].ndim != 2:
      raise ValueError(
        f"evaluator {self.name!r} needs multi-hot ReaL labels [B, K] (dataset.multi_label=True, "
        f"label_key='real_label'), got labels of shape {batch['label'].shape}"
      )
    return batch_metrics(logits, batch["label"], batch["mask"])

  def run(self, params: Any) -> dict[str, float]:
    zeros = {k: jnp.zeros((), jnp.float32) for k in ("correct", "count")}
    sums = _utils.sum_over_split(self.data, self._accumulate, params, zeros, self.max_examples)
    return {
      f"{self.name}/accuracy": sums["correct"] / max(sums["count"], 1.0),
      f"{self.name}/num_examples": sums["count"],
    }
