"""BiT ResNets (Kolesnikov et al., 2020), the ViT paper's convolutional baseline (§4, Fig. 3-5).

A ResNetV2: pre-activation bottleneck units (GroupNorm → ReLU → conv, three times, plus the
shortcut) with weight-standardised convolutions and GroupNorm of 32 groups, as in BiT's released
code (`big_transfer/bit_jax`). The projection shortcut of a block's first unit reads the
pre-activated input, and the stride sits on the 3x3 convolution. The root block is a 7x7/2 conv
and a 3x3/2 max-pool with BiT's fixed symmetric padding (zeros, also before the max-pool); the
network ends in GroupNorm → ReLU → global average pool (the representation) → a zero-initialised
1x1 conv head.

Module and parameter names are the published BiT `.npz` layout without its `resnet/` prefix
(vit_jax.checkpoint strips it on load and writes it on save): `root_block/standardized_conv2d`,
`block{s}/unit{uu}/{a,b,c}/{group_norm/{gamma,beta},standardized_conv2d/kernel}`,
`block{s}/unit01/a/proj/standardized_conv2d/kernel`, `group_norm`, `head/conv2d/{kernel,bias}`.
The R50+ViT hybrids' stem is a different (post-activation) ResNet: vit_jax.models.resnet.

This file must not import TensorFlow.
"""

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models.resnet import ResNetStage, StdConv, Unit
from vit_jax.models.vit import Ids, Output

Dtype = Any

# BiT's constants (bit_jax/models.py). timm's BiT port uses 1e-8 for the weight standardisation;
# its GroupNorm epsilon is the same 1e-5.
WS_EPS = 1e-10
GN_EPS = 1e-5
NUM_GROUPS = 32


def _fixed_padding(kernel_size: int) -> tuple[tuple[int, int], tuple[int, int]]:
  """BiT's padding: (k - 1) zeros split evenly (the extra one at the end), for any stride."""
  begin = (kernel_size - 1) // 2
  end = kernel_size - 1 - begin
  return ((begin, end), (begin, end))


class GroupNorm(nn.Module):
  """GroupNorm with BiT's `gamma`/`beta` names, statistics in at least float32."""

  num_groups: int = NUM_GROUPS
  epsilon: float = GN_EPS
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    channels = x.shape[-1]
    if channels % self.num_groups:
      raise ValueError(
        f"GroupNorm: {channels} channels do not split into {self.num_groups} groups "
        f"(module {'/'.join(self.path)}); widths must be multiples of {self.num_groups}"
      )
    gamma = self.param("gamma", nn.initializers.ones, (channels,), self.param_dtype)
    beta = self.param("beta", nn.initializers.zeros, (channels,), self.param_dtype)
    compute = jnp.promote_types(x.dtype, jnp.float32)
    grouped = x.astype(compute).reshape(*x.shape[:-1], self.num_groups, -1)
    axes = tuple(range(1, grouped.ndim - 2)) + (grouped.ndim - 1,)  # space and channels in group
    mean = jnp.mean(grouped, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(grouped - mean), axis=axes, keepdims=True)
    y = ((grouped - mean) * jax.lax.rsqrt(var + self.epsilon)).reshape(x.shape)
    return (y * gamma.astype(compute) + beta.astype(compute)).astype(self.dtype)


def _std_conv(features, kernel_size, strides, dtype, param_dtype, name="standardized_conv2d"):
  return StdConv(
    features,
    (kernel_size, kernel_size),
    strides,
    padding=_fixed_padding(kernel_size),
    eps=WS_EPS,
    dtype=dtype,
    param_dtype=param_dtype,
    name=name,
  )


class _Projection(nn.Module):
  """`proj/standardized_conv2d`: the 1x1 (strided) shortcut of a block's first unit."""

  features: int
  strides: tuple[int, int]
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    return _std_conv(self.features, 1, self.strides, self.dtype, self.param_dtype)(x)


class _PreActConv(nn.Module):
  """GroupNorm → ReLU → conv (a unit's `a`, `b` or `c`), and the projection shortcut of the same
  pre-activated input when `projection_features` is set (else None)."""

  features: int
  kernel_size: int
  strides: tuple[int, int] = (1, 1)
  projection_features: int | None = None
  projection_strides: tuple[int, int] = (1, 1)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    x = nn.relu(GroupNorm(name="group_norm", **kw)(x))
    shortcut = None
    if self.projection_features is not None:
      shortcut = _Projection(self.projection_features, self.projection_strides, name="proj", **kw)(
        x
      )
    y = _std_conv(self.features, self.kernel_size, self.strides, self.dtype, self.param_dtype)(x)
    return y, shortcut


class PreActBottleneck(Unit):
  """A pre-activation bottleneck unit: 1x1 → 3x3 (strided) → 1x1 (4× features) + shortcut."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    out = self.features * 4
    needs_projection = x.shape[-1] != out or self.strides != (1, 1)
    y, shortcut = _PreActConv(
      self.features,
      1,
      projection_features=out if needs_projection else None,
      projection_strides=self.strides,
      name="a",
      **kw,
    )(x)
    y, _ = _PreActConv(self.features, 3, self.strides, name="b", **kw)(y)
    y, _ = _PreActConv(out, 1, name="c", **kw)(y)
    return y + (x.astype(y.dtype) if shortcut is None else shortcut)


class _RootBlock(nn.Module):
  """7x7/2 weight-standardised conv, then a 3x3/2 max-pool over a zero-padded map."""

  width: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = _std_conv(self.width, 7, (2, 2), self.dtype, self.param_dtype)(x)
    # BiT pads with zeros (not -inf) before pooling, and the root has no activation, so padding
    # can win the max; matching that keeps the published weights' numbers.
    x = jnp.pad(x, ((0, 0), *_fixed_padding(3), (0, 0)))
    return nn.max_pool(x, (3, 3), strides=(2, 2), padding="VALID")


class _Head(nn.Module):
  """`head/conv2d`: a 1x1 conv on the pooled features, i.e. a dense layer [C, K] + bias."""

  num_classes: int
  bias_init: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    conv = nn.Conv(
      self.num_classes,
      (1, 1),
      kernel_init=nn.initializers.zeros,
      bias_init=nn.initializers.constant(self.bias_init),
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name="conv2d",
    )
    # squeeze, not [:, 0, 0]: integer indexing under a symbolic batch (vit_jax.tools.export)
    # becomes a dynamic gather, which LiteRT's converter cannot lower.
    return jnp.squeeze(conv(x[:, None, None, :]), axis=(1, 2))


class ResNetV2(nn.Module):
  """BiT ResNet classifier.

  Attributes:
    num_classes: width of the zero-initialised head; None for none (the logits are then the
      pre-logits, see vit_jax.models).
    block_units: bottleneck units per block, e.g. (3, 4, 6, 3) for R50.
    width_factor: channel multiplier (the `x3` of BiT-R50x3).
    base_width: root width at factor 1 (BiT: 64); block s has base_width·factor·2^(s-1)
      bottleneck channels and 4× as many outputs. Widths must be multiples of 32 (GroupNorm).
    head_bias_init: initial head bias (−10 for sigmoid pretraining).
    dtype: computation dtype; parameters are kept in `param_dtype`.
  """

  num_classes: int | None
  block_units: Sequence[int]
  width_factor: float = 1
  base_width: int = 64
  head_bias_init: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool, example_ids: Ids = None) -> Output:
    """`encode`, the global average pool (`pre_logits`), the head; `train` and `example_ids` are
    unused (nothing random, no batch statistics)."""
    x, out = self.encode(images)
    pooled = jnp.mean(x, axis=(1, 2))  # [batch, channels]
    out["pre_logits"] = pooled.astype(jnp.float32)
    if self.num_classes is None:
      return out["pre_logits"], out
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    logits = _Head(self.num_classes, self.head_bias_init, name="head", **kw)(pooled)
    return logits.astype(jnp.float32), out

  def encode(self, images: jax.Array, **_) -> tuple[jax.Array, dict[str, Any]]:
    """The root block, the stages and the final GroupNorm → ReLU: that map, and `out` with each
    stage's output (strides 4, 8, 16, 32) as `blocks`/`normed_blocks` (vit_jax.models)."""
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    width = int(self.base_width * self.width_factor)
    x = _RootBlock(width, name="root_block", **kw)(images.astype(self.dtype))
    blocks = []
    for s, units in enumerate(self.block_units):
      strides = (1, 1) if s == 0 else (2, 2)
      unit = dict(unit=PreActBottleneck, unit_names="unit{:02d}")
      x = ResNetStage(units, width * 2**s, strides, **kw, **unit, name=f"block{s + 1}")(x)
      blocks.append(x.astype(jnp.float32))
    x = nn.relu(GroupNorm(name="group_norm", **kw)(x))
    out = dict(blocks=tuple(blocks), normed_blocks=(*blocks[:-1], x.astype(jnp.float32)))
    return x, out
