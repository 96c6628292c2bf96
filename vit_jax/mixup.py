"""Mixup (Zhang et al., 2018) of the global training batch, on device, inside the train step.

Every example is mixed with the one before it in the global batch (row r with row r − 1, row 0
with the last) with one Beta(alpha, alpha) weight per step, for the images and the labels alike.
The input pipeline lays out the global batch in the order of the examples' indices in the run's
stream whatever the number of hosts and devices (vit_jax.input_pipeline), and the weight comes
from the step's key: an example's partner and weight are the same on any topology and for any
`accum_steps` (the trainer mixes before it splits the batch into micro-batches). On a batch
sharded over devices the roll moves one row per device (a collective permute).

A skipped example (mask 0, blank image) is never mixed into a good one: the example after it
keeps its own image and label.

This file must not import TensorFlow.
"""

import jax
import jax.numpy as jnp


def mix(
  batch: dict[str, jax.Array], key: jax.Array, alpha: float, num_classes: int
) -> dict[str, jax.Array]:
  """Mixed images [B, H, W, 3] and soft labels float32 [B, num_classes]; the mask is kept.

  Args:
    batch: 'image' [B, H, W, 3], 'label' int [B] or float [B, num_classes], 'mask' [B], in the
      order of the examples' indices.
    key: the step's mixup key (one weight for the whole batch).
    alpha: the Beta distribution's parameter (> 0).
    num_classes: width of the one-hot labels.
  """
  labels = batch["label"]
  if labels.ndim == 1:
    labels = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  labels = labels.astype(jnp.float32)
  images = batch["image"]
  lam = jax.random.beta(key, alpha, alpha).astype(images.dtype)
  partner_ok = jnp.roll(batch["mask"], 1, axis=0) > 0
  images_b = jnp.where(partner_ok[:, None, None, None], jnp.roll(images, 1, axis=0), images)
  labels_b = jnp.where(partner_ok[:, None], jnp.roll(labels, 1, axis=0), labels)
  return {
    **batch,
    "image": lam * images + (1.0 - lam) * images_b,
    "label": lam.astype(jnp.float32) * labels + (1.0 - lam.astype(jnp.float32)) * labels_b,
  }
