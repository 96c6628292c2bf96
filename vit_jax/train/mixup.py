"""Mixup (Zhang et al., 2018) and CutMix (Yun et al., 2019) of the global training batch, on
device, inside the train step.

Every example is mixed with the one before it in the global batch (row r with row r − 1, row 0
with the last), with one weight λ ~ Beta(alpha, alpha) per step:
  mixup   image λ·x + (1 − λ)·x_partner, label λ·y + (1 − λ)·y_partner;
  cutmix  one box per step, of area (1 − λ)·H·W (sides ⌊√(1 − λ)·H⌋ × ⌊√(1 − λ)·W⌋) at a
          uniformly drawn centre, clipped to the image, holds the partner's pixels; the labels
          are mixed by the pasted area's share of the image, that of the clipped box (the
          paper's and timm's λ correction), not by the drawn λ.
With both alphas > 0 each step does one of the two, cutmix with probability 0.5 (timm's
`switch_prob` 0.5, DeiT's recipe); the choice, λ and the box all come from the step's key.

The global batch is in stream order on any topology and every draw comes from the step's key,
so an example's partner, weight and box are the same on any topology and for any `accum_steps`
(the trainer mixes before it splits the batch). On a sharded batch the roll is a collective
permute. Shapes are static: the box is a mask of iota comparisons, not a dynamic slice.

A skipped example (mask 0, blank image) is never mixed into a good one: the example after it
keeps its own image and label.

This file must not import TensorFlow.
"""

import jax
import jax.numpy as jnp


def check_alphas(mixup_alpha: float, cutmix_alpha: float) -> None:
  """Raises ValueError naming the field of a negative alpha (0 turns a method off)."""
  for name, alpha in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
    if not float(alpha) >= 0.0:  # also refuses NaN
      raise ValueError(
        f"config.dataset.{name}={alpha!r} must be >= 0 (0 turns it off, > 0 is Beta(alpha, "
        "alpha)'s parameter)"
      )


def _soft_labels(batch: dict[str, jax.Array], num_classes: int) -> jax.Array:
  labels = batch["label"]
  if labels.ndim == 1:
    labels = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  return labels.astype(jnp.float32)


def _partners(batch: dict[str, jax.Array], labels: jax.Array):
  """Each row's partner image and label (the previous row's), or its own if that was skipped."""
  images = batch["image"]
  partner_ok = jnp.roll(batch["mask"], 1, axis=0) > 0
  images_b = jnp.where(partner_ok[:, None, None, None], jnp.roll(images, 1, axis=0), images)
  labels_b = jnp.where(partner_ok[:, None], jnp.roll(labels, 1, axis=0), labels)
  return images_b, labels_b


def mix(
  batch: dict[str, jax.Array], key: jax.Array, alpha: float, num_classes: int
) -> dict[str, jax.Array]:
  """Mixup: mixed images [B, H, W, 3] and soft labels float32 [B, num_classes]; mask kept.

  Args:
    batch: 'image' [B, H, W, 3], 'label' int [B] or float [B, num_classes], 'mask' [B], in the
      order of the examples' indices.
    key: the step's mixup key (one weight for the whole batch).
    alpha: the Beta distribution's parameter (> 0).
    num_classes: width of the one-hot labels.
  """
  labels = _soft_labels(batch, num_classes)
  images = batch["image"]
  lam = jax.random.beta(key, alpha, alpha).astype(images.dtype)
  images_b, labels_b = _partners(batch, labels)
  return {
    **batch,
    "image": lam * images + (1.0 - lam) * images_b,
    "label": lam.astype(jnp.float32) * labels + (1.0 - lam.astype(jnp.float32)) * labels_b,
  }


def cutmix_box(key: jax.Array, alpha: float, height: int, width: int) -> jax.Array:
  """bool [height, width]: the step's box (True where the partner's pixels are pasted)."""
  lam_key, y_key, x_key = jax.random.split(key, 3)
  lam = jax.random.beta(lam_key, alpha, alpha)
  ratio = jnp.sqrt(jnp.clip(1.0 - lam, 0.0, 1.0))
  cut_h = jnp.floor(ratio * height).astype(jnp.int32)
  cut_w = jnp.floor(ratio * width).astype(jnp.int32)
  cy = jax.random.randint(y_key, (), 0, height)
  cx = jax.random.randint(x_key, (), 0, width)
  top, left = cy - cut_h // 2, cx - cut_w // 2
  rows = jax.lax.broadcasted_iota(jnp.int32, (height, width), 0)
  cols = jax.lax.broadcasted_iota(jnp.int32, (height, width), 1)
  # Rows top .. top + cut_h − 1, columns likewise; the comparisons clip the box to the image.
  return (rows >= top) & (rows < top + cut_h) & (cols >= left) & (cols < left + cut_w)


def cutmix(
  batch: dict[str, jax.Array], key: jax.Array, alpha: float, num_classes: int
) -> dict[str, jax.Array]:
  """CutMix: images [B, H, W, C] with the partner's pixels in the step's box, soft labels float32
  [B, num_classes] weighted by the pasted share of the image; the mask is kept.

  Args: as `mix`'s; `key` draws λ and the box's centre (one box for the whole batch).
  """
  labels = _soft_labels(batch, num_classes)
  images = batch["image"]
  height, width = images.shape[1:3]
  box = cutmix_box(key, alpha, height, width)
  images_b, labels_b = _partners(batch, labels)
  pasted = jnp.sum(box, dtype=jnp.int32).astype(jnp.float32) / (height * width)
  return {
    **batch,
    "image": jnp.where(box[None, :, :, None], images_b, images),
    "label": (1.0 - pasted) * labels + pasted * labels_b,
  }


def mix_or_cut(
  batch: dict[str, jax.Array],
  key: jax.Array,
  num_classes: int,
  mixup_alpha: float = 0.0,
  cutmix_alpha: float = 0.0,
) -> dict[str, jax.Array]:
  """The step's batch after mixup and/or cutmix (each off at alpha 0; with both on, one of them,
  cutmix with probability 0.5, chosen with `key`); the batch itself when both are off.

  With only one method on, its draws use `key` itself (mixup alone draws exactly what `mix`
  draws).
  """
  check_alphas(mixup_alpha, cutmix_alpha)
  if mixup_alpha > 0 and cutmix_alpha > 0:
    switch_key, key = jax.random.split(key)
    mixed = mix(batch, key, mixup_alpha, num_classes)
    cut = cutmix(batch, key, cutmix_alpha, num_classes)
    use_cutmix = jax.random.bernoulli(switch_key, 0.5)
    return {**mixed, **{k: jnp.where(use_cutmix, cut[k], mixed[k]) for k in ("image", "label")}}
  if mixup_alpha > 0:
    return mix(batch, key, mixup_alpha, num_classes)
  if cutmix_alpha > 0:
    return cutmix(batch, key, cutmix_alpha, num_classes)
  return batch
