"""Semantic segmentation: per-pixel softmax cross-entropy with an ignore label (`config.stage =
'segment'`, `config.loss = 'seg_softmax_xent'`).

The model is vit_jax.models.segmentation's encoder + head of `config.model` and
`config.segmentation` (head, layers, width); its logits are [batch, height, width, classes].
An example's loss is the mean cross-entropy over its pixels whose label is not `IGNORE_LABEL`,
and its `correct` the fraction of those pixels labelled right (pixel accuracy); an image whose
pixels are all ignored contributes 0 to both. A run may start from any pretraining checkpoint
(`accepts_model_init`): the encoder's weights are loaded as fine-tuning loads them, the head is
new.

This file must not import TensorFlow.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.models import segmentation
from vit_jax.objectives import supervised

IGNORE_LABEL = 255  # the same as vit_jax.input_pipeline.segmentation.IGNORE_LABEL


def pixel_xent(
  logits: jax.Array, labels: jax.Array, ignore_label: int = IGNORE_LABEL
) -> tuple[jax.Array, jax.Array]:
  """(loss [batch], accuracy [batch]): mean cross-entropy and pixel accuracy of logits
  [batch, height, width, classes] over the labels [batch, height, width] not `ignore_label`; 0
  for an image without a counted pixel."""
  valid = labels != ignore_label
  safe = jnp.where(valid, labels, 0)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  right = jnp.argmax(logits, axis=-1) == safe
  weight = valid.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(weight, axis=(1, 2)), 1.0)
  loss = jnp.sum(nll * weight, axis=(1, 2)) / count
  return loss, jnp.sum(right * weight, axis=(1, 2)) / count


@dataclasses.dataclass(frozen=True)
class Segmentation:
  """Per-pixel classification into `num_classes` (background included)."""

  num_classes: int
  config: ml_collections.ConfigDict  # config.segmentation: head, layers, width
  name: str = "segmentation"
  accepts_model_init: bool = True

  def model(self, model_config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None):
    return segmentation.get_model(
      model_config,
      self.num_classes,
      head=self.config.head,
      layers=tuple(self.config.layers),
      width=int(self.config.width),
      mesh=mesh,
    )

  def per_example(self, model: Any, params: Any, batch: dict[str, jax.Array], key: jax.Array):
    logits, _ = supervised.forward(model, params, batch, key)
    return pixel_xent(logits, batch["label"])
