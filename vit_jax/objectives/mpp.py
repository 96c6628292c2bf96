"""Masked patch prediction as a training objective (§4.6, App. B.1.2; `config.loss = 'mpp'`).

The model is vit_jax.models.mpp's `MaskedPatchPredictor` of `config.model`; an example's loss
is the mean over its corrupted patches of the target's loss, and its accuracy the fraction of
those patches whose 3-bit colour is predicted right. Labels are not used. A run starts from
scratch (`accepts_model_init` is False).

This file must not import TensorFlow.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.models import mpp
from vit_jax.models.mpp import KEPT_CLEAN, NUM_COLORS, MaskedPatchPredictor


@dataclasses.dataclass(frozen=True)
class MaskedPatchPrediction:
  """The objective of `config.mpp` (vit_jax.models.mpp.mpp_config)."""

  config: ml_collections.ConfigDict
  name: str = "mpp"
  accepts_model_init: bool = False

  def model(self, model_config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None):
    return mpp.get_model(model_config, self.config, mesh=mesh)

  def per_example(self, model: Any, params: Any, batch: dict[str, jax.Array], key: jax.Array):
    return objective(model, params, batch["image"], key, example_ids=batch["index"])


# ---------------------------------------------------------------------------------------------
# The loss.


def per_example_loss(
  logits: jax.Array, kind: jax.Array, images: jax.Array, patch_size: int, target: str
) -> tuple[jax.Array, jax.Array]:
  """Loss and accuracy of each image, averaged over its corrupted patches only.

  Every image has the same number of corrupted patches, so the mean over images of these is the
  mean over all corrupted patches of the batch.

  Of logits [B, N, K], `kind` int [B, N] (`out['kind']`) and the clean images [B, H, W, 3]:
  (loss [B], accuracy [B]), softmax cross-entropy (squared error for l2) and the fraction of
    corrupted patches whose 3-bit colour is right (for downsample4x4, of their 16 cells; for l2,
    the mean colour of the predicted patch).
  """
  y = mpp.targets(images, patch_size, target)
  z, corrupted = logits, (kind != KEPT_CLEAN).astype(jnp.float32)
  if target == "mean_color":
    logp = jax.nn.log_softmax(z, axis=-1)
    loss = -jnp.take_along_axis(logp, y[..., None], axis=-1)[..., 0]
    correct = (jnp.argmax(z, -1) == y).astype(jnp.float32)
  elif target == "downsample4x4":
    z = z.reshape(*z.shape[:2], 16, NUM_COLORS)
    logp = jax.nn.log_softmax(z, axis=-1)
    loss = -jnp.mean(jnp.take_along_axis(logp, y[..., None], axis=-1)[..., 0], axis=-1)
    correct = jnp.mean((jnp.argmax(z, -1) == y).astype(jnp.float32), axis=-1)
  else:
    loss = jnp.mean(jnp.square(z - y), axis=-1)
    pixels = z.shape[-1] // 3
    mean_rgb = lambda v: jnp.mean(v.reshape(*v.shape[:2], pixels, 3), axis=2)  # noqa: E731
    correct = mpp.color_index(mpp.quantize(mean_rgb(z))) == mpp.color_index(
      mpp.quantize(mean_rgb(y))
    )
    correct = correct.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(corrupted, axis=1), 1.0)
  return jnp.sum(loss * corrupted, axis=1) / count, jnp.sum(correct * corrupted, axis=1) / count


def objective(
  model: MaskedPatchPredictor,
  params: Any,
  images: jax.Array,
  key: jax.Array,
  example_ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """(loss [B], accuracy [B]) of `model` in training on `images`; `key` draws dropout and the
  corruption, image i's from fold_in(·, example_ids[i]) (None: its row)."""
  dropout_key, mpp_key = jax.random.split(key)
  rngs = {"dropout": dropout_key, "mpp": mpp_key}
  logits, out = model.apply(
    {"params": params}, images, train=True, example_ids=example_ids, rngs=rngs
  )
  return per_example_loss(logits, out["kind"], images, model.patch_size, model.target)
