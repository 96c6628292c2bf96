"""Semantic segmentation from a pretrained encoder's feature maps: the encoder plus a dense head.

The encoder is a ViT (or R50+ViT hybrid) or a BiT ResNet, built from its usual model config,
with the parameter names of its checkpoints at the top level of the tree, so fine-tuning's
loader (vit_jax.checkpoint.load_pretrained: position embeddings resized to the new grid, the
classifier head replaced, `pre_logits` dropped) fills it from any pretraining checkpoint. The
head is the `head` subtree, initialised fresh:

  linear       SETR-naive (Zheng et al., 2021): a per-token linear classifier on the last
               block's map, its logits upsampled bilinearly to the pixels.
  progressive  the maps of several blocks (`layers`), each LayerNorm'd and projected to `width`
               channels, resized to the finest map's grid and summed (a simple feature
               pyramid; for a ViT all maps share one grid), then 3x3 conv → ReLU, ×2 bilinear
               upsampling while that stays within the pixel grid, a last 3x3 conv → ReLU
               (SETR-PUP's progressive upsampling), a per-pixel linear classifier, and a
               bilinear resize to the pixels if the grid is not there yet.

The ViT's maps are read through its final LayerNorm (`feature_norm`), the BiT ResNet's last map
through its final GroupNorm → ReLU (vit_jax.models.forward_intermediates). The model returns
float32 logits [batch, height, width, classes] at the input's resolution; with
`return_representation=True` the spatial mean of the last map (what few-shot evaluators read).

This file must not import TensorFlow.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.models import bit, build, vit

HEADS = ("linear", "progressive")


def default_layers(head: str, num_blocks: int) -> tuple[int, ...]:
  """The blocks a head reads by default: the last for `linear`; for `progressive` every block
  of a model with at most 4 (BiT's 4 stages), else 4 evenly spaced ones ending at the last."""
  if head == "linear":
    return (-1,)
  if num_blocks <= 4:
    return tuple(range(num_blocks))
  step = num_blocks / 4
  return tuple(int(round(step * (i + 1))) - 1 for i in range(4))


class SegmentationHead(nn.Module):
  """Logits [batch, height, width, num_classes] from feature maps (see the module docstring)."""

  num_classes: int
  kind: str = "linear"
  width: int = 64
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, maps: Sequence[jax.Array], out_shape: tuple[int, int]) -> jax.Array:
    """maps: [batch, h_i, w_i, c_i] each; out_shape: (height, width) of the pixels."""
    if self.kind not in HEADS:
      raise ValueError(f"segmentation head {self.kind!r}; expected one of {HEADS}")
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    height, width = out_shape
    if self.kind == "linear":
      logits = nn.Dense(self.num_classes, name="linear", **kw)(maps[-1])
      return _resize(logits, (height, width))
    grid = max((m.shape[1:3] for m in maps), key=lambda hw: hw[0] * hw[1])
    x = 0.0
    for i, m in enumerate(maps):
      m = nn.LayerNorm(name=f"norm_{i}", **kw)(m)
      m = nn.Dense(self.width, name=f"lateral_{i}", **kw)(m)
      x = x + _resize(m, grid)
    stage = 0
    while True:
      x = nn.relu(nn.Conv(self.width, (3, 3), padding="SAME", name=f"conv_{stage}", **kw)(x))
      stage += 1
      if x.shape[1] * 2 > height or x.shape[2] * 2 > width:
        break
      x = _resize(x, (x.shape[1] * 2, x.shape[2] * 2))
    logits = nn.Dense(self.num_classes, name="classifier", **kw)(x)
    return _resize(logits, (height, width))


def _resize(x: jax.Array, hw: Sequence[int]) -> jax.Array:
  """Bilinear resize of [batch, h, w, c] to hw (a no-op at the same size)."""
  if tuple(x.shape[1:3]) == tuple(hw):
    return x
  return jax.image.resize(x, (x.shape[0], *hw, x.shape[3]), "bilinear")


def _segment(module, encode, images, train, return_representation, example_ids) -> jax.Array:
  """The body of both segmenting models' `__call__`: `encode` is the encoder's own `__call__`,
  asked for the maps of `module.head_layers` (normed); the head is made inside the caller's
  compact method, so it is named `head` under the model."""
  maps = encode(
    images,
    train=train,
    example_ids=example_ids,
    feature_layers=module.head_layers,
    feature_norm=True,
  )
  if return_representation:
    return jnp.mean(maps[-1], axis=(1, 2))
  head = SegmentationHead(
    module.num_classes,
    module.head_kind,
    module.head_width,
    module.dtype,
    module.param_dtype,
    name="head",
  )
  return head(maps, images.shape[1:3]).astype(jnp.float32)


class SegmentingViT(vit.VisionTransformer):
  """A ViT (or hybrid) with a segmentation head on its patch tokens; `num_classes` is the number
  of segmentation classes (background included)."""

  head_kind: str = "linear"
  head_layers: tuple[int, ...] = (-1,)
  head_width: int = 64

  @nn.compact
  def __call__(
    self,
    images: jax.Array,
    *,
    train: bool,
    return_representation: bool = False,
    example_ids: jax.Array | None = None,
  ) -> jax.Array:
    """images [batch, height, width, 3] in [-1, 1] → float32 logits [batch, height, width, K]."""
    return _segment(self, super().__call__, images, train, return_representation, example_ids)


class SegmentingBiT(bit.ResNetV2):
  """A BiT ResNet with a segmentation head on its blocks' feature maps (the baseline)."""

  head_kind: str = "linear"
  head_layers: tuple[int, ...] = (-1,)
  head_width: int = 64

  @nn.compact
  def __call__(
    self,
    images: jax.Array,
    *,
    train: bool,
    return_representation: bool = False,
    example_ids: jax.Array | None = None,
  ) -> jax.Array:
    """images [batch, height, width, 3] in [-1, 1] → float32 logits [batch, height, width, K]."""
    return _segment(self, super().__call__, images, train, return_representation, example_ids)


def get_model(
  model_config: ml_collections.ConfigDict | str,
  num_classes: int,
  head: str = "linear",
  layers: Sequence[int] | None = None,
  width: int = 64,
  mesh: Any = None,
) -> nn.Module:
  """The segmentation model of an encoder preset or config.

  Args:
    model_config: a vit_jax.models preset name or model ConfigDict (ViT, hybrid or BiT).
    num_classes: segmentation classes, background included.
    head: one of HEADS.
    layers: the blocks the head reads (None or empty: `default_layers`).
    width: channels of the progressive head.
    mesh: as for vit_jax.models.get_model.

  Returns:
    A `SegmentingViT` or `SegmentingBiT`.
  """
  if head not in HEADS:
    raise ValueError(f"segmentation head {head!r}; expected one of {HEADS}")
  base = build.get_model(model_config, num_classes, mesh=mesh)
  fields = {
    f.name: getattr(base, f.name)
    for f in dataclasses.fields(base)
    if f.init and f.name not in ("parent", "name")
  }
  is_bit = isinstance(base, bit.ResNetV2)
  num_blocks = len(base.block_units) if is_bit else base.num_layers
  layers = tuple(layers) if layers else default_layers(head, num_blocks)
  cls = SegmentingBiT if is_bit else SegmentingViT
  return cls(**fields, head_kind=head, head_layers=layers, head_width=width)
