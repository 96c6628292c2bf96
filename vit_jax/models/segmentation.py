"""Semantic segmentation from a pretrained encoder's feature maps: the encoder plus a dense head.

The encoder (ViT, R50+ViT hybrid or BiT ResNet) keeps its checkpoints' parameter names at the
top level, so vit_jax.checkpoint.load_pretrained fills it from any pretraining checkpoint; the
head is the fresh `head` subtree:

  linear       SETR-naive (Zheng et al., 2021): a per-token linear classifier on the last
               block's map, its logits upsampled bilinearly to the pixels.
  progressive  the maps of several blocks (`layers`), each LayerNorm'd and projected to `width`
               channels, resized to the finest map's grid and summed (a simple feature
               pyramid; for a ViT all maps share one grid), then 3x3 conv → ReLU, ×2 bilinear
               upsampling while that stays within the pixel grid, a last 3x3 conv → ReLU
               (SETR-PUP's progressive upsampling), a per-pixel linear classifier, and a
               bilinear resize to the pixels if the grid is not there yet.

The head reads the encoder's `out['normed_blocks']` (vit_jax.models); the logits are float32
[batch, height, width, classes] at the input's resolution.

This file must not import TensorFlow.
"""

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


def _segmenting(encoder: type[nn.Module], name: str) -> type[nn.Module]:
  """`encoder` (a ViT or BiT class) with a `SegmentationHead` `head` on its blocks
  `head_layers`' normed maps; `num_classes` counts the background."""

  class Segmenting(encoder):
    head_kind: str = "linear"
    head_layers: tuple[int, ...] = (-1,)
    head_width: int = 64

    @nn.compact
    def __call__(self, images: jax.Array, *, train: bool, example_ids: vit.Ids = None):
      _, out = self.encode(images, train=train, example_ids=example_ids)
      maps = [out["normed_blocks"][i] for i in self.head_layers]
      out["pre_logits"] = jnp.mean(maps[-1], axis=(1, 2))
      kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, name="head")
      head = SegmentationHead(self.num_classes, self.head_kind, self.head_width, **kw)
      return head(maps, images.shape[1:3]).astype(jnp.float32), out

  Segmenting.__name__ = Segmenting.__qualname__ = name
  return Segmenting


SegmentingViT = _segmenting(vit.VisionTransformer, "SegmentingViT")
SegmentingBiT = _segmenting(bit.ResNetV2, "SegmentingBiT")


def _layer_indices(layers: Sequence[int], num_blocks: int) -> tuple[int, ...]:
  """Block indices in [0, num_blocks) (negative ones count from the end); one line if not."""
  for i in layers:
    if not -num_blocks <= int(i) < num_blocks:
      raise ValueError(
        f"feature layer {i} outside the model's {num_blocks} blocks "
        f"(0..{num_blocks - 1}, or -1 for the last)"
      )
  return tuple(int(i) % num_blocks for i in layers)


def get_model(
  model_config: ml_collections.ConfigDict | str,
  num_classes: int,
  head: str = "linear",
  layers: Sequence[int] | None = None,
  width: int = 64,
  mesh: Any = None,
) -> nn.Module:
  """A `SegmentingViT` or `SegmentingBiT` of an encoder preset or config (ViT, hybrid or BiT):
  `layers` the blocks the head reads (None or empty: `default_layers`), `width` the progressive
  head's channels, `num_classes` background included."""
  if head not in HEADS:
    raise ValueError(f"segmentation head {head!r}; expected one of {HEADS}")
  base = build.get_model(model_config, num_classes, mesh=mesh)
  is_bit = isinstance(base, bit.ResNetV2)
  num_blocks = len(base.block_units) if is_bit else base.num_layers
  layers = _layer_indices(tuple(layers) if layers else default_layers(head, num_blocks), num_blocks)
  cls = SegmentingBiT if is_bit else SegmentingViT
  return cls(**vit.settings(base), head_kind=head, head_layers=layers, head_width=width)
