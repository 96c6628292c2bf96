"""Object detection from a plain encoder's last feature map: ViTDet's simple feature pyramid and
an anchor-free dense head (FCOS), decoded on the device.

The encoder (ViT, R50+ViT hybrid or BiT ResNet) keeps its checkpoints' parameter names at the
top level, so vit_jax.checkpoint.load_pretrained fills it from any pretraining checkpoint; the
detector's own layers are the fresh `head` subtree:

  pyramid  (Li et al., 2022) from the last map alone (`out['normed_blocks'][-1]`, stride s),
           one level per scale of `pyramid_scales`: ×4 by two 2×2 stride-2 transposed convs
           (LayerNorm and GELU between), ×2 by one, ×1 as it is, ×1/2ⁿ by n 2×2 max-pools;
           each then a 1×1 conv → LayerNorm → 3×3 conv → LayerNorm to `width` channels.
           Level strides are s / scale in pixels.
  head     (Tian et al., 2019, with its later defaults: GIoU, centerness on the box branch,
           centre sampling) shared by the levels: a class tower and a box tower of
           `convs` × (3×3 conv → GroupNorm → ReLU), then per location K class logits (the
           bias of a 1% prior), the distances (left, top, right, bottom) to the box as
           exp(scale_level · x) · stride, and a centerness logit.

`__call__` returns (logits, out), the contract of vit_jax.models: logits float32 [batch, L,
K + 5], the L locations of every level in order (row-major), each [K class logits, ymin, xmin,
ymax, xmax of its box normalised to [0, 1] of the image, centerness logit]; out adds `points`
(a numpy float32 [L, 3], static) (centre y, centre x, stride, in pixels), and `detections` (`decode`): `boxes`
[batch, D, 4] (ymin, xmin, ymax, xmax in [0, 1]), `scores` [batch, D] (0: no detection),
`classes` int32 [batch, D]. Under jax.jit the decoding runs only where it is read (the
evaluator, predict, export), never in the train step.

This file must not import TensorFlow.
"""

import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax.models import bit, build, vit

PRIOR = 0.01  # the class logits' initial probability (Lin et al., 2017)


class SimplePyramid(nn.Module):
  """ViTDet's simple feature pyramid: maps [batch, h/scale... , width] from one map (see the
  module docstring)."""

  scales: tuple[float, ...]
  width: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> list[jax.Array]:
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    channels = x.shape[-1]
    levels = []
    for i, scale in enumerate(self.scales):
      y = x
      if scale == 4.0:
        y = nn.ConvTranspose(channels // 2, (2, 2), (2, 2), name=f"up_{i}_0", **kw)(y)
        y = nn.gelu(nn.LayerNorm(name=f"up_norm_{i}", **kw)(y))
        y = nn.ConvTranspose(channels // 4, (2, 2), (2, 2), name=f"up_{i}_1", **kw)(y)
      elif scale == 2.0:
        y = nn.ConvTranspose(channels // 2, (2, 2), (2, 2), name=f"up_{i}_0", **kw)(y)
      elif scale < 1.0:
        for _ in range(round(-math.log2(scale))):
          y = nn.max_pool(y, (2, 2), (2, 2))
      y = nn.LayerNorm(name=f"lateral_norm_{i}", **kw)(
        nn.Conv(self.width, (1, 1), use_bias=False, name=f"lateral_{i}", **kw)(y)
      )
      y = nn.LayerNorm(name=f"output_norm_{i}", **kw)(
        nn.Conv(self.width, (3, 3), padding="SAME", use_bias=False, name=f"output_{i}", **kw)(y)
      )
      levels.append(y)
    return levels


def check_scales(scales: Sequence[float]) -> tuple[float, ...]:
  """The pyramid's scales, each 4, 2, 1 or 1/2ⁿ; one line if not."""
  out = tuple(float(s) for s in scales)
  for s in out:
    if not (s in (4.0, 2.0, 1.0) or (0 < s < 1 and float(np.log2(s)).is_integer())):
      raise ValueError(f"pyramid scale {s}; expected 4, 2, 1 or 1/2^n (ViTDet: 4, 2, 1, 0.5)")
  if not out:
    raise ValueError("detection.pyramid_scales is empty")
  return out


class DenseHead(nn.Module):
  """FCOS's head on the pyramid's levels: per level (class logits [b, h, w, K], distances
  (l, t, r, b) [b, h, w, 4] in units of the level's stride, centerness logit [b, h, w, 1])."""

  num_classes: int
  width: int
  convs: int = 2
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, levels: Sequence[jax.Array]) -> list[tuple[jax.Array, ...]]:
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    groups = math.gcd(32, self.width)
    conv = lambda name, n, **a: nn.Conv(n, (3, 3), padding="SAME", name=name, **kw, **a)  # noqa: E731
    towers = {
      t: [
        (conv(f"{t}_conv_{j}", self.width), nn.GroupNorm(groups, name=f"{t}_norm_{j}", **kw))
        for j in range(self.convs)
      ]
      for t in ("class", "box")
    }
    prior = -math.log((1 - PRIOR) / PRIOR)
    classifier = conv("classifier", self.num_classes, bias_init=nn.initializers.constant(prior))
    regressor = conv("regressor", 4)
    centerness = conv("centerness", 1)
    out = []
    for i, x in enumerate(levels):
      y = {}
      for t, layers in towers.items():
        z = x
        for c, n in layers:
          z = nn.relu(n(c(z)))
        y[t] = z
      scale = self.param(f"scale_{i}", nn.initializers.ones, (), self.param_dtype)
      distances = jnp.exp(jnp.minimum(scale * regressor(y["box"]).astype(jnp.float32), 8.0))
      out.append((classifier(y["class"]), distances, centerness(y["box"])))
    return out


class DetectionHead(nn.Module):
  """The pyramid and the dense head, as one `head` subtree; returns (per level predictions,
  each level's stride in pixels (y, x))."""

  num_classes: int
  scales: tuple[float, ...]
  width: int
  convs: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, feature: jax.Array, image_hw: tuple[int, int]):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    h, w = feature.shape[1:3]
    for scale in self.scales:
      if int(h * scale) < 1 or int(w * scale) < 1:
        raise ValueError(
          f"pyramid scale {scale:g} of the encoder's {h}x{w} map (stride "
          f"{image_hw[0] // h} at {image_hw[0]}x{image_hw[1]}) leaves no cell: drop it from "
          "detection.pyramid_scales or raise the image size"
        )
    levels = SimplePyramid(self.scales, self.width, name="pyramid", **kw)(feature)
    predictions = DenseHead(self.num_classes, self.width, self.convs, name="dense", **kw)(levels)
    strides = [(image_hw[0] / m.shape[1], image_hw[1] / m.shape[2]) for m in levels]
    return predictions, strides


def points_of(grids: Sequence[tuple[int, int]], strides: Sequence[tuple[float, float]]):
  """float32 [L, 3]: every level's cell centres (y, x) and its stride (the larger of the two
  axes'), in pixels, levels in order, row-major."""
  rows = []
  for (h, w), (sy, sx) in zip(grids, strides, strict=True):
    y, x = np.meshgrid((np.arange(h) + 0.5) * sy, (np.arange(w) + 0.5) * sx, indexing="ij")
    rows.append(np.stack([y.ravel(), x.ravel(), np.full(h * w, max(sy, sx))], axis=1))
  return np.concatenate(rows).astype(np.float32)


def pairwise_iou(a: jax.Array, b: jax.Array) -> jax.Array:
  """IoU [..., n, m] of boxes a [..., n, 4] and b [..., m, 4] (ymin, xmin, ymax, xmax)."""
  a, b = a[..., :, None, :], b[..., None, :, :]
  hw = jnp.maximum(jnp.minimum(a[..., 2:], b[..., 2:]) - jnp.maximum(a[..., :2], b[..., :2]), 0)
  inter = hw[..., 0] * hw[..., 1]
  area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])  # noqa: E731
  return inter / jnp.maximum(area(a) + area(b) - inter, 1e-12)


def nms_keep(boxes: jax.Array, scores: jax.Array, classes: jax.Array, iou: float) -> jax.Array:
  """Greedy class-wise non-maximum suppression of one image's candidates, sorted by score
  (descending): bool [n], candidate i kept unless a kept one before it of its class overlaps it
  by IoU > `iou`; a score of 0 is never kept. Static shapes: n steps of O(n)."""
  n = boxes.shape[0]
  later = jnp.arange(n)[None, :] > jnp.arange(n)[:, None]
  same = classes[:, None] == classes[None, :]
  suppresses = (pairwise_iou(boxes, boxes) > iou) & same & later

  def body(i, keep):
    return keep & ~(keep[i] & suppresses[i])

  return jax.lax.fori_loop(0, n, body, scores > 0)


def top_k(x: jax.Array, k: int, by_sort: bool = False) -> tuple[jax.Array, jax.Array]:
  """(values, indices) of the k largest of x's last axis, the lower index first among equals:
  jax.lax.top_k, or with `by_sort` a stable sort (what a SavedModel can hold: TensorFlow's
  StableHLO reader lacks the top_k composite that jax2tf writes)."""
  if not by_sort:
    return jax.lax.top_k(x, k)
  index = jnp.argsort(-x, axis=-1, stable=True)[..., :k]
  return jnp.take_along_axis(x, index, axis=-1), index


def decode(
  logits: jax.Array,
  num_classes: int,
  *,
  pre_nms: int,
  max_detections: int,
  nms_iou: float,
  score_threshold: float,
  top_k_by_sort: bool = False,
) -> dict[str, jax.Array]:
  """The detections of logits [batch, L, K + 5] (the module docstring): score
  √(p_class · p_centerness) per location and class, the `pre_nms` best over both, those above
  `score_threshold` through `nms_keep`, the `max_detections` best kept; boxes clipped to the
  image. `top_k_by_sort`: see `top_k`."""
  k = num_classes
  probs = jax.nn.sigmoid(logits[..., :k]) * jax.nn.sigmoid(logits[..., k + 4 :])
  batch, locations = probs.shape[:2]
  candidates = min(pre_nms, locations * k)
  scores, index = top_k(jnp.sqrt(probs).reshape(batch, -1), candidates, top_k_by_sort)
  scores = jnp.where(scores > score_threshold, scores, 0.0)
  classes = (index % k).astype(jnp.int32)
  boxes = jnp.take_along_axis(logits[..., k : k + 4], (index // k)[..., None], axis=1)
  boxes = jnp.clip(boxes, 0.0, 1.0)
  keep = jax.vmap(nms_keep, (0, 0, 0, None))(boxes, scores, classes, nms_iou)
  scores, best = top_k(jnp.where(keep, scores, 0.0), min(max_detections, candidates), top_k_by_sort)
  take = lambda x: jnp.take_along_axis(x, best.reshape(*best.shape, *(1,) * (x.ndim - 2)), 1)  # noqa: E731
  return dict(boxes=take(boxes), scores=scores, classes=take(classes))


def _detecting(encoder: type[nn.Module], name: str) -> type[nn.Module]:
  """`encoder` (a ViT or BiT class) with a `DetectionHead` `head` on its last normed map."""

  class Detecting(encoder):
    pyramid_scales: tuple[float, ...] = (2.0, 1.0, 0.5)
    head_width: int = 64
    head_convs: int = 2
    pre_nms: int = 1000
    max_detections: int = 100
    nms_iou: float = 0.6
    score_threshold: float = 0.05
    top_k_by_sort: bool = False  # for export (see `top_k`)

    @nn.compact
    def __call__(self, images: jax.Array, *, train: bool, example_ids: vit.Ids = None):
      _, out = self.encode(images, train=train, example_ids=example_ids)
      feature = out["normed_blocks"][-1]
      out["pre_logits"] = jnp.mean(feature, axis=(1, 2))
      kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, name="head")
      head = DetectionHead(
        self.num_classes, self.pyramid_scales, self.head_width, self.head_convs, **kw
      )
      image_hw = images.shape[1:3]
      predictions, strides = head(feature, image_hw)
      points = points_of([p[0].shape[1:3] for p in predictions], strides)
      rows = []
      offset = 0
      for (classes, distances, centerness), (sy, sx) in zip(predictions, strides, strict=True):
        b, h, w = classes.shape[:3]
        centre = jnp.asarray(points[offset : offset + h * w, :2])
        offset += h * w
        d = distances.reshape(b, h * w, 4) * jnp.asarray([sx, sy, sx, sy], jnp.float32)
        ymin, xmin = (
          (centre[:, 0] - d[..., 1]) / image_hw[0],
          (centre[:, 1] - d[..., 0]) / image_hw[1],
        )
        ymax, xmax = (
          (centre[:, 0] + d[..., 3]) / image_hw[0],
          (centre[:, 1] + d[..., 2]) / image_hw[1],
        )
        box = jnp.stack([ymin, xmin, ymax, xmax], axis=-1)
        rows.append(
          jnp.concatenate(
            [
              classes.reshape(b, h * w, -1).astype(jnp.float32),
              box,
              centerness.reshape(b, h * w, 1).astype(jnp.float32),
            ],
            axis=-1,
          )
        )
      logits = jnp.concatenate(rows, axis=1)
      out["points"] = points  # numpy: static, for the objective's target assignment
      out["detections"] = decode(
        logits,
        self.num_classes,
        pre_nms=self.pre_nms,
        max_detections=self.max_detections,
        nms_iou=self.nms_iou,
        score_threshold=self.score_threshold,
        top_k_by_sort=self.top_k_by_sort,
      )
      return logits, out

  Detecting.__name__ = Detecting.__qualname__ = name
  return Detecting


DetectingViT = _detecting(vit.VisionTransformer, "DetectingViT")
DetectingBiT = _detecting(bit.ResNetV2, "DetectingBiT")


def get_model(
  model_config: ml_collections.ConfigDict | str,
  num_classes: int,
  detection: ml_collections.ConfigDict | dict | None = None,
  mesh: Any = None,
) -> nn.Module:
  """A `DetectingViT` or `DetectingBiT` of an encoder preset or config (ViT, hybrid or BiT) and
  the fields of `config.detection` (pyramid_scales, width, convs, pre_nms, max_detections,
  nms_iou, score_threshold; the defaults where absent); `num_classes` the object classes."""
  d = dict(detection or {})
  base = build.get_model(model_config, num_classes, mesh=mesh)
  is_bit = isinstance(base, bit.ResNetV2)
  cls = DetectingBiT if is_bit else DetectingViT
  fields = dict(
    pyramid_scales=check_scales(d.get("pyramid_scales", (2.0, 1.0, 0.5))),
    head_width=int(d.get("width", 64)),
    head_convs=int(d.get("convs", 2)),
    pre_nms=int(d.get("pre_nms", 1000)),
    max_detections=int(d.get("max_detections", 100)),
    nms_iou=float(d.get("nms_iou", 0.6)),
    score_threshold=float(d.get("score_threshold", 0.05)),
  )
  return cls(**vit.settings(base), **fields)
