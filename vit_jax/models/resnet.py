"""The BiT ResNet stem of the R50+ViT hybrids (Kolesnikov et al., 2020; ViT paper §3.1).

Weight-standardised convolutions followed by GroupNorm, in bottleneck units. Module names
(`conv_root`, `gn_root`, `block{s}/unit{u}/conv1..3|conv_proj`, `gn1..3|gn_proj`) are the
published checkpoint format. This file must not import TensorFlow.
"""

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any


def weight_standardize(kernel: jax.Array, eps: float = 1e-5) -> jax.Array:
  """Standardises a conv kernel [kh, kw, c_in, c_out] over all but the output axis.

  (w − mean) / (std + eps), as the official vit_jax hybrid (eps 1e-5) and BiT code do; not
  (w − mean) / sqrt(var + eps), which differs where a channel's std is small.
  """
  kernel = kernel - jnp.mean(kernel, axis=(0, 1, 2), keepdims=True)
  return kernel / (jnp.std(kernel, axis=(0, 1, 2), keepdims=True) + eps)


class StdConv(nn.Module):
  """A bias-free 2-D convolution whose kernel is weight-standardised on every call.

  `padding` is 'SAME' (the hybrids) or explicit [(top, bottom), (left, right)] pairs (BiT pads
  symmetrically, whatever the stride); `eps` is the standardisation's variance epsilon.
  """

  features: int
  kernel_size: tuple[int, int]
  strides: tuple[int, int] = (1, 1)
  padding: Any = "SAME"
  eps: float = 1e-5
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param(
      "kernel",
      nn.initializers.lecun_normal(),
      (*self.kernel_size, x.shape[-1], self.features),
      self.param_dtype,
    )
    # Standardise in the parameter dtype (fp32): bf16 statistics would be too coarse.
    kernel = weight_standardize(kernel, self.eps).astype(self.dtype)
    return jax.lax.conv_general_dilated(
      x.astype(self.dtype),
      kernel,
      window_strides=self.strides,
      padding=self.padding,
      dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )


class Unit(nn.Module):
  """What a bottleneck unit is built with: `features` bottleneck channels (4× as many out)."""

  features: int
  strides: tuple[int, int] = (1, 1)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32


class ResidualUnit(Unit):
  """A bottleneck unit: 1x1 → 3x3 (strided) → 1x1 (4× features), GroupNorm after each conv."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    conv = lambda f, k, s, name: StdConv(  # noqa: E731
      f, k, s, dtype=self.dtype, param_dtype=self.param_dtype, name=name
    )
    norm = lambda name, **kw: nn.GroupNorm(  # noqa: E731
      dtype=self.dtype, param_dtype=self.param_dtype, name=name, **kw
    )
    residual = x
    if x.shape[-1] != self.features * 4 or self.strides != (1, 1):
      residual = conv(self.features * 4, (1, 1), self.strides, "conv_proj")(residual)
      residual = norm("gn_proj")(residual)
    y = nn.relu(norm("gn1")(conv(self.features, (1, 1), (1, 1), "conv1")(x)))
    y = nn.relu(norm("gn2")(conv(self.features, (3, 3), self.strides, "conv2")(y)))
    # Zero-initialised last scale: each unit starts as the identity (BiT).
    y = norm("gn3", scale_init=nn.initializers.zeros)(
      conv(self.features * 4, (1, 1), (1, 1), "conv3")(y)
    )
    return nn.relu(residual + y)


class ResNetStage(nn.Module):
  """`block_size` units of the class `unit` (`ResidualUnit`, or BiT's pre-activation unit),
  named `unit1`, `unit2`, ... (BiT: `unit01`, ...); the first carries the stage's stride."""

  block_size: int
  features: int
  first_stride: tuple[int, int]
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  unit: Any = ResidualUnit  # the class of the units
  unit_names: str = "unit{}"  # their names, of 1, 2, ...

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for i in range(self.block_size):
      strides = self.first_stride if i == 0 else (1, 1)
      kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, name=self.unit_names.format(i + 1))
      x = self.unit(self.features, strides, **kw)(x)
    return x


def resnet_stem(
  parent_x: jax.Array,
  num_layers: Sequence[int],
  width_factor: float,
  dtype: Dtype,
  param_dtype: Dtype,
) -> jax.Array:
  """Applies the hybrid's ResNet inside the caller's compact scope (names stay top level).

  `num_layers`: units per stage; (3, 4, 9) downsamples images [batch, height, width, 3] by 16,
  (3, 4, 6, 3) by 32, to 256·width_factor·2^(stages-1) channels.
  """
  width = int(64 * width_factor)
  x = StdConv(width, (7, 7), (2, 2), dtype=dtype, param_dtype=param_dtype, name="conv_root")(
    parent_x
  )
  x = nn.GroupNorm(dtype=dtype, param_dtype=param_dtype, name="gn_root")(x)
  x = nn.relu(x)
  x = nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding="SAME")
  for i, block_size in enumerate(num_layers):
    x = ResNetStage(
      block_size,
      features=width * 2**i,
      first_stride=(1, 1) if i == 0 else (2, 2),
      dtype=dtype,
      param_dtype=param_dtype,
      name=f"block{i + 1}",
    )(x)
  return x
