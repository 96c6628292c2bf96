"""The Vision Transformer (Dosovitskiy et al., 2021, §3.1) as Flax linen modules.

Module and parameter names are the published vit_jax checkpoint format (`embedding`, `cls`,
`Transformer/posembed_input/pos_embedding`, `Transformer/encoderblock_{i}/...`,
`Transformer/encoder_norm`, `pre_logits`, `head`); with `scan=True` the blocks are one scanned
`Transformer/encoderblock` whose leaves have a leading layer axis. `distill_token` adds DeiT's
`dist_token` and `head_dist` (timm's names). Computation runs in `dtype`, parameters stay in
`param_dtype`; attention weights are sown into `intermediates` when that collection is mutable.

Dropout and stochastic depth draw each example's mask from the 'dropout' key and the example's
id (`ops.dropout`, `ops.drop_path_keep`), so an example is dropped the same way in any batch,
micro-batch or sharding (vit_jax.train). The layout is chosen for speed, not for the parameters:
2-D matmuls over flattened tokens, one Q/K/V matmul, and the kernels of vit_jax.models.ops
(docs/benchmarks.md).

This file must not import TensorFlow.
"""

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.kernels import cpu as cpu_kernels
from vit_jax.models import ops, resnet

Dtype = Any
Ids = jax.Array | None  # example ids int [batch], or None: the rows
Output = tuple[jax.Array, dict[str, Any]]  # (logits, out): the contract of vit_jax.models

_xavier = nn.initializers.xavier_uniform()
_tiny_normal = nn.initializers.normal(stddev=1e-6)


class LayerNorm(nn.Module):
  """`nn.LayerNorm`'s parameters and numbers as `ops.layer_norm` (float32, returns `dtype`);
  `kernel` (ops.LAYER_NORM_KERNELS) picks the C++ kernel of `cpu_kernels` or XLA."""

  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  kernel: str = "auto"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.kernel not in ops.LAYER_NORM_KERNELS:
      raise ValueError(
        f"layer_norm_kernel={self.kernel!r}; expected one of {ops.LAYER_NORM_KERNELS}"
      )
    features = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (features,), self.param_dtype)
    bias = self.param("bias", nn.initializers.zeros, (features,), self.param_dtype)
    if ops.use_cpu_kernel("layer_norm_kernel", self.kernel, self.dtype):
      f32 = jnp.float32
      return cpu_kernels.layer_norm(x.astype(f32), scale.astype(f32), bias.astype(f32))
    return ops.layer_norm(x.astype(self.dtype), scale, bias)


class Dropout(nn.Module):
  """Dropout with a mask per example id (`ops.dropout`; None: row i is example i)."""

  rate: float

  @nn.compact
  def __call__(
    self, x: jax.Array, deterministic: bool, example_ids: jax.Array | None = None
  ) -> jax.Array:
    if deterministic or self.rate == 0.0:
      return x
    ids = jnp.arange(x.shape[0]) if example_ids is None else example_ids
    return ops.dropout(x, self.rate, self.make_rng("dropout"), ids)


class _Projection(nn.Module):
  """The kernel and bias of an `nn.DenseGeneral` (same names, shapes, initial values), created
  but not applied: the attention applies them as 2-D matmuls."""

  kernel_shape: tuple[int, ...]
  num_inputs: int  # leading dimensions of the kernel that are contracted with the input
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self) -> tuple[jax.Array, jax.Array]:
    n = self.num_inputs

    def kernel_init(rng, shape, dtype):
      flat = (math.prod(shape[:n]), math.prod(shape[n:]))
      return jnp.reshape(_xavier(rng, flat, dtype), shape)

    kernel = self.param("kernel", kernel_init, self.kernel_shape, self.param_dtype)
    bias = self.param("bias", nn.initializers.zeros, self.kernel_shape[n:], self.param_dtype)
    return kernel, bias


class Dense(nn.Module):
  """`nn.Dense` over the last axis, the same parameters and numbers, run as `ops.dense`: its
  weight gradients are computed in `grad_reduce_dtype` when that is wider than `dtype`."""

  features: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros
  grad_reduce_dtype: Dtype | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    shape = (x.shape[-1], self.features)
    kernel = self.param("kernel", self.kernel_init, shape, self.param_dtype)
    bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
    return ops.dense(x.astype(self.dtype), kernel, bias, self.grad_reduce_dtype)


class MultiHeadDotProductAttention(nn.Module):
  """Flax's `nn.MultiHeadDotProductAttention` parameters (query/key/value/out), the three
  projections run as one matmul and the core per `attention_kernel` (`ops.attention_path`)."""

  num_heads: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  attention_kernel: str = "auto"
  grad_reduce_dtype: Dtype | None = None

  @nn.compact
  def __call__(
    self, x: jax.Array, deterministic: bool, example_ids: jax.Array | None = None
  ) -> jax.Array:
    """x: [batch, tokens, width] → [batch, tokens, width]; example_ids int [batch] or None."""
    batch, tokens, width = x.shape
    heads = self.num_heads
    if width % heads:
      raise ValueError(f"hidden size {width} is not divisible by num_heads={heads}")
    head_dim = width // heads
    projections = [
      _Projection((width, heads, head_dim), 1, self.param_dtype, name=n)()
      for n in ("query", "key", "value")
    ]
    kernel, bias = ops.dense_params(
      self.dtype,
      self.grad_reduce_dtype,
      jnp.stack([k for k, _ in projections], axis=1),  # [D, 3, h, d]
      jnp.stack([b for _, b in projections], axis=0),  # [3, h, d]
    )
    qkv = ops.dense(
      x.astype(self.dtype), kernel.reshape(width, -1), bias.reshape(-1), self.grad_reduce_dtype
    )
    qkv = qkv.reshape(batch, tokens, 3, heads, head_dim)
    sow = self.is_mutable_collection("intermediates")
    dropout = self.dropout_rate > 0.0 and not deterministic
    path = ops.attention_path(self.attention_kernel, self.dtype, head_dim)
    if path == "cudnn" and not (sow or dropout):
      out = ops.cudnn_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])  # [b, t, h, d]
      out = out.reshape(batch, tokens, width)
    elif path == "cpu" and not (sow or dropout):
      out = cpu_kernels.attention(qkv).reshape(batch, tokens, width)
    else:
      qkv = qkv.transpose(2, 0, 3, 1, 4)
      # [batch, heads, tokens, head_dim]. Static slices (index_in_dim), not integer indexing:
      # under a symbolic batch size (vit_jax.tools.export) jnp's indexing becomes a dynamic
      # gather, which LiteRT's converter cannot lower.
      q, k, v = (jax.lax.index_in_dim(qkv, i, keepdims=False) for i in range(3))
      if sow:
        self.sow("intermediates", "attention_weights", ops.attention_weights(q, k))
      if dropout:
        weights = ops.attention_weights(q, k)
        weights = Dropout(rate=self.dropout_rate)(weights, False, example_ids)
        out = jnp.einsum("bhqk,bhkd->bhqd", weights, v)
      else:
        out = ops.attention(q, k, v)
      out = out.transpose(0, 2, 1, 3).reshape(batch, tokens, width)
    out_kernel, out_bias = _Projection((heads, head_dim, width), 2, self.param_dtype, name="out")()
    return ops.dense(out, out_kernel.reshape(width, width), out_bias, self.grad_reduce_dtype)


class MlpBlock(nn.Module):
  """Dense → GELU → Dense, with dropout (`gelu_approximate`: see VisionTransformer)."""

  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  gelu_approximate: bool = True
  grad_reduce_dtype: Dtype | None = None

  @nn.compact
  def __call__(
    self, x: jax.Array, deterministic: bool, example_ids: jax.Array | None = None
  ) -> jax.Array:
    """x: [batch, tokens, width] (or [rows, width]) → the same shape; example_ids int [batch]."""
    dense = functools.partial(
      Dense,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      kernel_init=_xavier,
      bias_init=_tiny_normal,
      grad_reduce_dtype=self.grad_reduce_dtype,
    )
    rows = x.reshape(-1, x.shape[-1])
    y = dense(self.mlp_dim, name="Dense_0")(rows)
    y = ops.gelu_tanh(y) if self.gelu_approximate else nn.gelu(y, approximate=False)
    y = Dropout(rate=self.dropout_rate)(y, deterministic, example_ids)
    y = dense(x.shape[-1], name="Dense_1")(y)
    return Dropout(rate=self.dropout_rate)(y, deterministic, example_ids).reshape(x.shape)


# What a block's `drop_path` argument holds: its drop rate (a float32 scalar) and its key.
DropPath = tuple[jax.Array, jax.Array]


class BlockSettings(nn.Module):
  """The fields the block, the encoder and the ViT share (see VisionTransformer's attributes)."""

  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  gelu_approximate: bool = True
  attention_kernel: str = "auto"
  layer_norm_kernel: str = "auto"
  grad_reduce_dtype: Dtype | None = None


class Encoder1DBlock(BlockSettings):
  """A pre-LayerNorm Transformer block: x + MSA(LN(x)), then x + MLP(LN(x)) (Eq. 2–3).

  With `window` > 0 the attention runs within `window_attention`'s windows of the patch `grid`.

  With `drop_path` (rate r, key), each example's two residual branches are kept with probability
  1 - r (scaled by 1/(1 - r)) under fold_in(key, 0) and fold_in(key, 1); the decisions, bool
  [2, batch], are sown as `drop_path_keep` when `intermediates` is mutable.
  """

  window: int = 0  # 0: global attention
  grid: tuple[int, int] | None = None  # the patch grid (gh, gw), for `window`

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    deterministic: bool,
    example_ids: jax.Array | None = None,
    drop_path: DropPath | None = None,
  ) -> jax.Array:
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    ln_kw = dict(kernel=self.layer_norm_kernel, **kw)
    kw["grad_reduce_dtype"] = self.grad_reduce_dtype
    keep = None  # bool [2, batch]: stochastic depth's decisions for the two branches
    if drop_path is not None and not deterministic:
      rate, key = drop_path
      ids = jnp.arange(x.shape[0]) if example_ids is None else example_ids
      keep = jnp.stack([ops.drop_path_keep(rate, jax.random.fold_in(key, i), ids) for i in (0, 1)])
      if self.is_mutable_collection("intermediates"):
        self.sow("intermediates", "drop_path_keep", keep)

    def branch(y, i):  # the residual branch i (0: attention, 1: MLP) as added to x
      if keep is None:
        return y
      kept = y / (1 - jnp.asarray(rate, y.dtype))
      return jnp.where(keep[i].reshape(-1, *(1,) * (y.ndim - 1)), kept, jnp.zeros_like(y))

    msa = MultiHeadDotProductAttention(
      self.num_heads,
      self.attention_dropout_rate,
      attention_kernel=self.attention_kernel,
      name="MultiHeadDotProductAttention_1",
      **kw,
    )
    gelu = self.gelu_approximate
    mlp = MlpBlock(self.mlp_dim, self.dropout_rate, gelu_approximate=gelu, name="MlpBlock_3", **kw)
    dropout = Dropout(rate=self.dropout_rate)

    def attend(y):
      if self.window:
        core = lambda z, ids: msa(z, deterministic, ids)  # noqa: E731
        y = window_attention(core, y, self.grid, self.window, example_ids)
      else:
        y = msa(y, deterministic, example_ids)
      return dropout(y, deterministic, example_ids)

    def mlp_block(y):
      return mlp(y, deterministic, example_ids)

    # z' = MSA(LN(z)) + z (Eq. 2), then z' + MLP(LN(z')) (Eq. 3).
    for i, (norm, sublayer) in enumerate((("LayerNorm_0", attend), ("LayerNorm_2", mlp_block))):
      x = x + branch(sublayer(LayerNorm(name=norm, **ln_kw)(x)), i)
    return x


def window_attention(
  attend: Callable[[jax.Array, jax.Array], jax.Array],
  x: jax.Array,
  grid: tuple[int, int] | None,
  window: int,
  example_ids: jax.Array | None,
) -> jax.Array:
  """ViTDet's window attention (Li et al., 2022): `attend(tokens [n, t, D], ids [n])` within the
  non-overlapping window×window windows of the patch grid, which is zero-padded at the bottom
  and right to a multiple of `window` (the padding attends and is attended to, as in ViTDet;
  it is cropped after). The prefix tokens (class, distillation) attend among themselves.
  x: [batch, prefix + gh·gw, D] → the same shape. Window k of example e gets id e·n + k, so
  attention dropout draws each window's mask apart."""
  if grid is None:
    raise ValueError("window attention needs the patch grid")
  batch, tokens, width = x.shape
  gh, gw = grid
  prefix = tokens - gh * gw
  nh, nw = -(-gh // window), -(-gw // window)
  patches = x[:, prefix:].reshape(batch, gh, gw, width)
  patches = jnp.pad(patches, ((0, 0), (0, nh * window - gh), (0, nw * window - gw), (0, 0)))
  windows = patches.reshape(batch, nh, window, nw, window, width).transpose(0, 1, 3, 2, 4, 5)
  windows = windows.reshape(batch * nh * nw, window * window, width)
  ids = jnp.arange(batch) if example_ids is None else example_ids
  window_ids = (ids[:, None] * (nh * nw) + jnp.arange(nh * nw)).reshape(-1)
  out = attend(windows, window_ids).reshape(batch, nh, nw, window, window, width)
  out = out.transpose(0, 1, 3, 2, 4, 5).reshape(batch, nh * window, nw * window, width)
  out = out[:, :gh, :gw].reshape(batch, gh * gw, width)
  if prefix:
    out = jnp.concatenate([attend(x[:, :prefix], ids), out], axis=1)
  return out


class _ScannedEncoder1DBlock(Encoder1DBlock):
  """The block in nn.scan's (carry, output) convention; the outputs stack to [layers, ...]."""

  @nn.compact
  def __call__(self, x, deterministic, example_ids=None, drop_path=None):
    y = super().__call__(x, deterministic, example_ids, drop_path)
    return y, y


def stochastic_depth_rates(stochastic_depth: float, num_layers: int) -> np.ndarray:
  """Each block's drop-path rate, float [num_layers], 0 to `stochastic_depth` (DeiT, timm)."""
  return np.linspace(0.0, stochastic_depth, num_layers)


# `posemb` values: the paper's learned 1-D table, or fixed 2-D sin-cos embeddings.
POSEMB_TYPES = ("learn", "sincos2d")


def sincos2d_posemb(grid: tuple[int, int], width: int, temperature: float = 10_000.0) -> np.ndarray:
  """Fixed 2-D sin-cos position embeddings [gh*gw, width], float64, tokens in row-major order.

  big_vision's `posemb_sincos_2d` (the code of Beyer et al., 2022; "follows the MoCo v3 logic"):
  with the patch at row y, column x and the frequencies omega_k = temperature^(-k / (width/4 - 1))
  for k = 0 .. width/4 - 1 (from 1 down to 1/temperature, both included), the embedding is
  [sin(x omega), cos(x omega), sin(y omega), cos(y omega)]. (MoCo v3's own code divides k by
  width/4 instead, so its lowest frequency stops short of 1/temperature; big_vision's is the one
  its sincos2d checkpoints, which store no table, were trained with.) Computed in float64 on the
  host: the caller rounds it once to its dtype.

  Args:
    grid: (gh, gw), the patch grid.
    width: the tokens' width D, a multiple of 4 and at least 8.
  """
  if width % 4 or width < 8:
    raise ValueError(
      f"posemb='sincos2d' needs hidden_size divisible by 4 and at least 8, got {width}"
    )
  y, x = np.mgrid[: grid[0], : grid[1]]
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4 - 1))
  y = np.outer(y.reshape(-1), omega)
  x = np.outer(x.reshape(-1), omega)
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)


def fixed_posemb(grid: tuple[int, int], width: int, num_prefix_tokens: int) -> np.ndarray:
  """The `posemb='sincos2d'` table laid out as a learned one, [1, prefix + gh*gw, width]: zero
  rows for the prefix tokens (as big_vision and MoCo v3), then `sincos2d_posemb`."""
  table = sincos2d_posemb(grid, width)
  return np.concatenate([np.zeros((num_prefix_tokens, width)), table])[None]


class AddPositionEmbs(nn.Module):
  """Adds position embeddings (Eq. 1): `pos_embedding` ('learn') or `fixed_posemb` ('sincos2d')."""

  param_dtype: Dtype = jnp.float32
  grad_reduce_dtype: Dtype | None = None
  posemb: str = "learn"

  @nn.compact
  def __call__(self, x: jax.Array, grid: tuple[int, int] | None = None) -> jax.Array:
    if self.posemb == "sincos2d":
      prefix = x.shape[1] - (grid[0] * grid[1] if grid is not None else 0)
      if grid is None or prefix < 0:
        raise ValueError(f"posemb='sincos2d' needs the patch grid of the {x.shape[1]} tokens")
      return x + jnp.asarray(fixed_posemb(grid, x.shape[2], prefix), x.dtype)
    if self.posemb != "learn":
      raise ValueError(f"posemb={self.posemb!r}; expected one of {POSEMB_TYPES}")
    pos_embedding = self.param(
      "pos_embedding",
      nn.initializers.normal(stddev=0.02),
      (1, x.shape[1], x.shape[2]),
      self.param_dtype,
    )
    return x + ops.broadcast_param(pos_embedding, x.shape, x.dtype, self.grad_reduce_dtype)


class PatchEmbedding(nn.Module):
  """A VALID conv with kernel = stride = patch (the checkpoints' kernel layout), run as one
  matmul over patches gathered by a reshape: a cheaper weight gradient on every backend."""

  patch_size: int
  features: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  grad_reduce_dtype: Dtype | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [batch, height, width, channels] → [batch, patches, features] in row-major order."""
    p = self.patch_size
    batch, height, width, channels = x.shape
    kernel = self.param(
      "kernel", nn.initializers.lecun_normal(), (p, p, channels, self.features), self.param_dtype
    )
    bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype)
    gh, gw = height // p, width // p
    x = x[:, : gh * p, : gw * p].astype(self.dtype)
    if p > 1:
      x = jnp.reshape(x, (batch, gh, p, gw, p, channels))
      x = jnp.transpose(x, (0, 1, 3, 2, 4, 5))  # [batch, gh, gw, p, p, channels]
    x = jnp.reshape(x, (batch, gh * gw, p * p * channels))
    kernel = jnp.reshape(kernel, (p * p * channels, self.features))
    # [batch, patches, features] as one 3-D matmul: flattened to rows, the TPU compiler keeps
    # more for the backward pass (tests/test_step_memory.py).
    return ops.dense(x, kernel, bias, self.grad_reduce_dtype, flatten=False)


class EncoderSettings(BlockSettings, kw_only=True):
  """The blocks' settings and the encoder's own (see VisionTransformer's attributes)."""

  num_layers: int
  remat: bool = False
  scan: bool = False
  posemb: str = "learn"
  stochastic_depth: float = 0.0
  window_size: int = 0
  global_blocks: tuple[int, ...] = ()


class Encoder(EncoderSettings):
  """Position embeddings, `num_layers` blocks and the final LayerNorm (`Transformer/...`).

  Block i's stochastic depth uses key fold_in(k, i), k drawn once here: the same decisions with
  and without `scan` and `remat`.
  """

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool, example_ids: Ids = None, grid=None):
    """Returns (the final LayerNorm's output, each block's output, those through it)."""
    x = AddPositionEmbs(
      self.param_dtype, self.grad_reduce_dtype, self.posemb, name="posembed_input"
    )(x, grid)
    x = Dropout(rate=self.dropout_rate)(x, deterministic, example_ids)
    drop_path = None  # (rates [L], keys [L]) of stochastic depth
    if self.stochastic_depth > 0.0 and not deterministic:
      rates = jnp.asarray(
        stochastic_depth_rates(self.stochastic_depth, self.num_layers), jnp.float32
      )
      key = self.make_rng("dropout")
      keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(self.num_layers))
      drop_path = (rates, keys)
    block_kw = settings(self, BlockSettings)
    windows = self._windows(grid)
    block_cls = _ScannedEncoder1DBlock if self.scan else Encoder1DBlock
    if self.remat:
      # Recompute each block's activations in the backward pass; `deterministic` (argument 2,
      # counting self) is a Python bool and must stay static.
      block_cls = nn.remat(block_cls, prevent_cse=not self.scan, static_argnums=(2,))
    if self.scan:
      # The blocks' drop-path rates and keys are scanned (each block its own); the rest is
      # broadcast.
      args, in_axes = (deterministic, example_ids), nn.broadcast
      if drop_path is not None:
        args, in_axes = (*args, drop_path), (nn.broadcast, nn.broadcast, 0)
      x, blocks = nn.scan(
        block_cls,
        variable_axes={"params": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=in_axes,
        length=self.num_layers,
      )(name="encoderblock", **block_kw)(x, *args)
    else:
      blocks = []
      for i in range(self.num_layers):
        block_drop_path = None if drop_path is None else (drop_path[0][i], drop_path[1][i])
        x = block_cls(name=f"encoderblock_{i}", window=windows[i], grid=grid, **block_kw)(
          x, deterministic, example_ids, block_drop_path
        )
        blocks.append(x)
    encoder_norm = LayerNorm(
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      kernel=self.layer_norm_kernel,
      name="encoder_norm",
    )
    blocks = [blocks[i] for i in range(self.num_layers)]  # scanned: one array, layers first
    return encoder_norm(x), blocks, [encoder_norm(y) for y in blocks]

  def _windows(self, grid: tuple[int, int] | None) -> list[int]:
    """Each block's attention window (0: global): `window_size` but for `global_blocks`."""
    if not self.window_size:
      return [0] * self.num_layers
    if self.scan:
      raise ValueError("window_size needs scan=False (windowed and global blocks differ)")
    if grid is None:
      raise ValueError("window_size needs the patch grid (images, not tokens)")
    if not 0 < self.window_size:
      raise ValueError(f"window_size={self.window_size}; expected a positive number of patches")
    for i in self.global_blocks:
      if not -self.num_layers <= int(i) < self.num_layers:
        raise ValueError(f"global_blocks has {i}, outside the model's {self.num_layers} blocks")
    global_ = {int(i) % self.num_layers for i in self.global_blocks}
    return [0 if i in global_ else int(self.window_size) for i in range(self.num_layers)]


def settings(module: nn.Module, cls: type | None = None) -> dict[str, Any]:
  """`module`'s values of the fields `cls` (default: its own class) declares."""
  fields = dataclasses.fields(cls or type(module))
  return {f.name: getattr(module, f.name) for f in fields if f.init and f.name not in _FLAX}


_FLAX = ("parent", "name")  # the dataclass fields every flax module has


class VisionTransformer(EncoderSettings, kw_only=True):
  """ViT (and R50+ViT hybrid) classifier.

  Attributes:
    num_classes: width of the zero-initialised linear head; None for none (the logits are then
      the pre-logits, see vit_jax.models).
    patch_size: side of the square patches (on the ResNet feature map for hybrids).
    hidden_size: width D of every token.
    num_layers: number of Transformer blocks.
    mlp_dim: hidden width of each block's MLP.
    num_heads: attention heads per block.
    dropout_rate: dropout after the position embeddings, attention and in the MLP.
    attention_dropout_rate: dropout on the attention weights.
    classifier: 'token' (class token, index 0) or 'gap' (global average pool, no class token).
    representation_size: width of the Dense+tanh pre-logits layer used in pretraining, or None.
    resnet: None, or a mapping with `num_layers` (units per stage) and `width_factor`.
    head_bias_init: initial head bias (−10 for sigmoid pretraining).
    dtype: computation dtype; parameters are kept in `param_dtype`.
    remat: rematerialise each block in the backward pass.
    scan: run the blocks with nn.scan over stacked parameters (fast compilation of deep models).
    gelu_approximate: True (default): the tanh GELU the published weights were trained with;
      False: the exact erf GELU of timm and Hugging Face. No parameter depends on it.
    attention_kernel: 'auto', 'xla', 'cudnn' or 'cpu' (`ops.attention_path`); the same function
      up to rounding. Sowing attention weights or attention dropout use XLA.
    layer_norm_kernel: 'auto', 'xla' or 'cpu' (`ops.use_cpu_kernel`).
    grad_reduce_dtype: the dtype the parameters' gradients leave the backward pass in (and are
      summed across devices in) when wider than `dtype` (`ops.dense`); the ResNet stem ignores it.
    distill_token: DeiT's `dist_token` after the class token with its own head `head_dist`;
      needs classifier 'token'. The logits are the two heads' average (see `classify`).
    posemb: 'learn' (the paper's table) or 'sincos2d' (Beyer et al., 2022, `sincos2d_posemb`: no
      parameter, computed for the actual grid; vit_jax.checkpoint.with_posemb_table writes it
      into the parameters as a table).
    stochastic_depth: the largest drop-path rate (Huang et al., 2016), 0 for none; block i's is
      `stochastic_depth_rates(stochastic_depth, num_layers)[i]`.
    window_size: ViTDet's window attention (`window_attention`): blocks attend within windows of
      window_size×window_size patches, but for `global_blocks` (indices; negative from the
      end), which attend over the whole grid. 0: every block global. No parameter depends on it.
  """

  num_classes: int | None
  patch_size: int
  hidden_size: int
  classifier: str = "token"
  representation_size: int | None = None
  resnet: Any = None
  head_bias_init: float = 0.0
  distill_token: bool = False

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool, example_ids: Ids = None) -> Output:
    """`encode`, then `classify` (the contract of vit_jax.models)."""
    x, out = self.encode(images, train=train, example_ids=example_ids)
    return self.classify(x, out)

  def encode(
    self,
    images: jax.Array,
    *,
    train: bool,
    example_ids: Ids = None,
    corrupt_fn: Callable[[jax.Array], jax.Array] | None = None,
  ) -> tuple[jax.Array, dict[str, Any]]:
    """Eq. 1-4 up to the final LayerNorm: z_0 = [x_class; x_p E] + E_pos, then the blocks.

    `corrupt_fn` is applied to the patch embeddings x_p E [batch, patches, D] before the class
    token and the position embeddings (masked patch prediction, vit_jax.models.mpp).

    Returns every token after the final LayerNorm [batch, tokens, D] and `out` with `tokens`
    (the patch tokens of those, [batch, patches, D]), `blocks` (each block's output, its patch
    tokens on their grid [batch, H/p, W/p, D]; for hybrids the grid of the ResNet's feature
    map) and `normed_blocks` (the same through the final LayerNorm: the last is `tokens` on its
    grid), all at least float32.
    """
    if self.classifier not in ("token", "gap"):
      raise ValueError(f"classifier must be 'token' or 'gap', got {self.classifier!r}")
    if self.distill_token and self.classifier != "token":
      raise ValueError(
        f"distill_token=True needs classifier='token' (DeiT's two tokens), got {self.classifier!r}"
      )
    if self.posemb not in POSEMB_TYPES:
      raise ValueError(f"posemb={self.posemb!r}; expected one of {POSEMB_TYPES}")
    if not 0.0 <= self.stochastic_depth < 1.0:
      raise ValueError(f"stochastic_depth={self.stochastic_depth!r}; expected a rate in [0, 1)")
    x = images.astype(self.dtype)
    if self.resnet is not None:
      stages = tuple(self.resnet["num_layers"])
      x = resnet.resnet_stem(x, stages, self.resnet["width_factor"], self.dtype, self.param_dtype)
    grid = (x.shape[1] // self.patch_size, x.shape[2] // self.patch_size)
    x = PatchEmbedding(
      self.patch_size,
      self.hidden_size,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      grad_reduce_dtype=self.grad_reduce_dtype,
      name="embedding",
    )(x)
    if corrupt_fn is not None:
      x = corrupt_fn(x)
    batch, _, width = x.shape
    x = jnp.concatenate([*self._prefix_tokens(batch, width, x.dtype), x], axis=1)
    ids = jnp.arange(batch) if example_ids is None else example_ids
    x, blocks, normed = Encoder(**settings(self, Encoder), name="Transformer")(
      x, not train, ids, grid
    )
    prefix, wide = self._num_prefix_tokens, ops.wide_dtype(x.dtype)

    def maps(ys):  # [batch, tokens, D] each → [batch, gh, gw, D], the patch tokens
      return tuple(y[:, prefix:].reshape(batch, *grid, width).astype(wide) for y in ys)

    tokens = x[:, prefix:].astype(wide)
    return x, dict(tokens=tokens, blocks=maps(blocks), normed_blocks=maps(normed))

  @property
  def _num_prefix_tokens(self) -> int:
    return (1 + int(self.distill_token)) if self.classifier == "token" else 0

  def _prefix_tokens(self, batch: int, width: int, dtype: Dtype) -> list[jax.Array]:
    """`cls` (and `dist_token`, timm's init), each [batch, 1, width]."""
    names = ("cls", "dist_token")[: self._num_prefix_tokens]
    inits = (nn.initializers.zeros, nn.initializers.normal(stddev=0.02))
    tokens = [
      self.param(n, init, (1, 1, width), self.param_dtype)
      for n, init in zip(names, inits, strict=False)
    ]
    shape = (batch, 1, width)
    return [ops.broadcast_param(t, shape, dtype, self.grad_reduce_dtype) for t in tokens]

  def classify(self, x: jax.Array, out: dict[str, Any]) -> Output:
    """The head on `encode`'s x [batch, tokens, D]: the class token (or the mean, 'gap'),
    `pre_logits` if any, then `head`; with `distill_token` the logits are the average of `head`
    and `head_dist` (`out['class_logits']`, `out['dist_logits']`)."""
    if self.classifier == "token":  # static slices: see MultiHeadDotProductAttention
      ys = [
        jax.lax.index_in_dim(x, i, axis=1, keepdims=False) for i in range(self._num_prefix_tokens)
      ]
    else:
      ys = [jnp.mean(x, axis=1)]
    dense = functools.partial(
      Dense,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      grad_reduce_dtype=self.grad_reduce_dtype,
    )
    if self.representation_size is not None:
      pre_logits = dense(self.representation_size, name="pre_logits")  # one layer for both tokens
      ys = [jnp.tanh(pre_logits(y)) for y in ys]
    wide = ops.wide_dtype(ys[0].dtype)
    out["pre_logits"] = ys[0].astype(wide)
    if self.num_classes is None:
      return out["pre_logits"], out
    head = functools.partial(
      dense,
      self.num_classes,
      kernel_init=nn.initializers.zeros,
      bias_init=nn.initializers.constant(self.head_bias_init),
    )
    logits = [head(name=n)(y).astype(wide) for n, y in zip(("head", "head_dist"), ys, strict=False)]
    if not self.distill_token:
      return logits[0], out
    out["class_logits"], out["dist_logits"] = logits
    return (logits[0] + logits[1]) / 2, out
