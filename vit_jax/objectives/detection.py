"""Object detection: FCOS's targets and losses, computed on the device with static shapes
(`config.stage = 'detect'`, `config.loss = 'fcos'`).

The model is vit_jax.models.detection's encoder + pyramid + dense head of `config.model` and
`config.detection`. A batch's `label` is float32 [batch, M, 6]: rows (ymin, xmin, ymax, xmax,
class, crowd), boxes normalised to [0, 1], class -1 for an unused row (the input pipeline's
detection task). Crowd boxes and unused rows are never targets.

Targets per location (Tian et al., 2019, with centre sampling): a location is a positive of a
box when it lies inside the box, within `center_radius` strides of its centre, and the box's
largest distance to it, max(l, t, r, b), falls in its level's range (level i of stride s_i:
(8·s_{i-1}, 8·s_i], the first from 0, the last without bound); of several boxes, the smallest.
An example's loss is
  sigmoid focal loss (α 0.25, γ 2) over every location and class / max(positives, 1)
  + GIoU loss of the positives' boxes, weighted by their centerness target / its sum
  + centerness binary cross-entropy over the positives / max(positives, 1),
and its `correct` the fraction of its positives whose highest class logit is their box's class
(1 for an image without positives).

This file must not import TensorFlow.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vit_jax.models import detection
from vit_jax.objectives import supervised


def level_ranges(strides: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(low, high) of max(l, t, r, b) per location of strides [L] (see the module docstring)."""
  levels = np.unique(strides)
  high = {s: (8 * s if i < len(levels) - 1 else np.inf) for i, s in enumerate(levels)}
  low = {s: (8 * levels[i - 1] if i else 0.0) for i, s in enumerate(levels)}
  return np.array([low[s] for s in strides]), np.array([high[s] for s in strides])


def giou(a: jax.Array, b: jax.Array) -> jax.Array:
  """Generalised IoU [...] of boxes a, b [..., 4] (ymin, xmin, ymax, xmax)."""
  hw = jnp.maximum(jnp.minimum(a[..., 2:], b[..., 2:]) - jnp.maximum(a[..., :2], b[..., :2]), 0)
  inter = hw[..., 0] * hw[..., 1]
  area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])  # noqa: E731
  union = area(a) + area(b) - inter
  hull = jnp.maximum(a[..., 2:], b[..., 2:]) - jnp.minimum(a[..., :2], b[..., :2])
  enclosing = hull[..., 0] * hull[..., 1]
  iou = inter / jnp.maximum(union, 1e-9)
  return iou - (enclosing - union) / jnp.maximum(enclosing, 1e-9)


def fcos_targets(points: jax.Array, label: jax.Array, image_hw, center_radius: float):
  """One image's targets: (positive bool [L], class int32 [L], box [L, 4] in pixels,
  centerness [L]) of points [L, 3] (y, x, stride; pixels) and label [M, 6]."""
  height, width = image_hw
  scale = jnp.asarray([height, width, height, width], jnp.float32)
  boxes = label[:, :4] * scale
  valid = (label[:, 4] >= 0) & (label[:, 5] == 0)
  y, x, stride = points[:, 0:1], points[:, 1:2], points[:, 2:3]
  left, top = x - boxes[None, :, 1], y - boxes[None, :, 0]
  right, bottom = boxes[None, :, 3] - x, boxes[None, :, 2] - y
  ltrb = jnp.stack([left, top, right, bottom], axis=-1)  # [L, M, 4]
  inside = jnp.min(ltrb, axis=-1) > 0
  cy, cx = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
  radius = center_radius * stride
  near = (jnp.abs(y - cy[None]) < radius) & (jnp.abs(x - cx[None]) < radius)
  low, high = level_ranges(np.asarray(points[:, 2]))
  reach = jnp.max(ltrb, axis=-1)
  in_range = (reach > low[:, None]) & (reach <= high[:, None])
  candidate = inside & near & in_range & valid[None]
  area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
  best = jnp.argmin(jnp.where(candidate, area[None], jnp.inf), axis=1)
  positive = jnp.any(candidate, axis=1)
  d = jnp.take_along_axis(ltrb, best[:, None, None], axis=1)[:, 0]
  lr, tb = d[:, [0, 2]], d[:, [1, 3]]
  ratio = (jnp.min(lr, -1) / jnp.maximum(jnp.max(lr, -1), 1e-9)) * (
    jnp.min(tb, -1) / jnp.maximum(jnp.max(tb, -1), 1e-9)
  )
  centerness = jnp.sqrt(jnp.clip(ratio, 0.0, 1.0))
  return positive, label[best, 4].astype(jnp.int32), boxes[best], centerness


def fcos_loss(
  logits: jax.Array,
  points: jax.Array,
  label: jax.Array,
  image_hw: tuple[int, int],
  num_classes: int,
  center_radius: float = 1.5,
) -> tuple[jax.Array, jax.Array]:
  """(loss [batch], correct [batch]) of the module docstring; logits [batch, L, K + 5]."""
  k = num_classes
  scale = jnp.asarray([image_hw[0], image_hw[1]] * 2, jnp.float32)

  def one(logit, lab):
    positive, cls, box, centerness = fcos_targets(points, lab, image_hw, center_radius)
    pos = positive.astype(jnp.float32)
    num_pos = jnp.maximum(jnp.sum(pos), 1.0)
    target = jax.nn.one_hot(cls, k) * pos[:, None]
    focal = jnp.sum(optax.sigmoid_focal_loss(logit[:, :k], target, alpha=0.25, gamma=2.0))
    box_loss = 1.0 - giou(logit[:, k : k + 4] * scale, box)
    weight = centerness * pos
    box_loss = jnp.sum(box_loss * weight) / jnp.maximum(jnp.sum(weight), 1e-6)
    ctr = optax.sigmoid_binary_cross_entropy(logit[:, k + 4], centerness)
    ctr_loss = jnp.sum(ctr * pos) / num_pos
    right = (jnp.argmax(logit[:, :k], axis=-1) == cls) * pos
    correct = jnp.where(jnp.sum(pos) > 0, jnp.sum(right) / num_pos, 1.0)
    return focal / num_pos + box_loss + ctr_loss, correct

  return jax.vmap(one)(logits.astype(jnp.float32), label.astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class Detection:
  """FCOS on `num_classes` object classes (no background class)."""

  num_classes: int
  config: ml_collections.ConfigDict  # config.detection
  name: str = "detection"
  accepts_model_init: bool = True

  def model(self, model_config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None):
    return detection.get_model(model_config, self.num_classes, self.config, mesh=mesh)

  def per_example(self, model: Any, params: Any, batch: dict[str, jax.Array], key: jax.Array):
    logits, out = supervised.forward(model, params, batch, key)
    radius = float(self.config.get("center_radius", 1.5))
    image_hw = batch["image"].shape[1:3]
    return fcos_loss(logits, out["points"], batch["label"], image_hw, self.num_classes, radius)
