"""The Vision Transformer (Dosovitskiy et al., 2021, §3.1) as Flax linen modules.

Module and parameter names are the published vit_jax checkpoint format (`embedding`, `cls`,
`Transformer/posembed_input/pos_embedding`, `Transformer/encoderblock_{i}/LayerNorm_0|
MultiHeadDotProductAttention_1|LayerNorm_2|MlpBlock_3`, `Transformer/encoder_norm`, `pre_logits`,
`head`), so a published `.npz` maps onto the tree without renaming. With `scan=True` the blocks
are one scanned `Transformer/encoderblock` whose leaves have a leading layer axis.

With `distill_token` (DeiT, Touvron et al. 2021) a second learned token `dist_token` [1, 1, D]
follows the class token (the position embedding then covers 2 + patches tokens) and feeds a second
head `head_dist`; the names are timm's and DeiT's, and without the token the tree is the published
one. The contract (`VisionTransformer.__call__`): with `train=True` the model returns the pair
(class-token logits, distillation-token logits), which the distillation objective weighs
(vit_jax.objectives.distill); with `train=False` their average, as DeiT predicts, so evaluators,
predict and export read one array of logits as for any ViT; `return_representation` gives the
class token's pre-logits, the token a model without distillation has.

Computation runs in `dtype` (e.g. bfloat16) while parameters stay in `param_dtype` (float32).
Attention weights are sown into the `intermediates` collection when the caller makes it mutable
(`model.apply(..., mutable=['intermediates'])`).

Dropout draws each example's mask from the layer's 'dropout' key and the example's id
(`example_ids`, default its row; `Dropout`, `ops.dropout`), so an example is dropped the same
way in any batch, micro-batch or sharding (the trainer's invariance, vit_jax.train); so does
stochastic depth (`stochastic_depth`, `ops.drop_path_keep`), which drops whole residual branches.

Two parts of the "better plain ViT baselines" (Beyer et al., 2022) and AugReg (Steiner et al.,
2021) recipes, off by default: fixed 2-D sin-cos position embeddings (`posemb='sincos2d'`,
`sincos2d_posemb`: no parameter, computed for the actual patch grid, so any resolution and
aspect ratio without resizing) and stochastic depth (Huang et al., 2016).

Layout for speed, not for the parameters (which keep the checkpoint format): the Dense layers run
as 2-D matmuls over flattened tokens, the Q/K/V projections as one matmul, the attention core
in heads-major layout with a hand-written backward pass (`ops.attention`; instead, on NVIDIA
GPUs in bf16 cuDNN's fused attention and on a one-device CPU in float32 the C++ kernel of
`vit_jax/kernels/cpu.py`: `attention_kernel`), and the LayerNorms and the tanh GELU with one
each (`ops.layer_norm`, `ops.gelu_tanh`; the LayerNorms, like the attention, in C++ on a
one-device CPU: `layer_norm_kernel`). The numerics and the choice of kernel live in
vit_jax.models.ops; what each part costs is in docs/benchmarks.md.

This file must not import TensorFlow.
"""

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.kernels import cpu as cpu_kernels
from vit_jax.models import ops, resnet

Dtype = Any

_xavier = nn.initializers.xavier_uniform()
_tiny_normal = nn.initializers.normal(stddev=1e-6)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis with flax's parameters (`scale` ones, `bias` zeros) and epsilon.

  Computes `ops.layer_norm` in float32 and returns `dtype`; a drop-in for `nn.LayerNorm` in the
  checkpoint format. `kernel` (ops.LAYER_NORM_KERNELS): 'auto' runs the C++ kernel of `cpu_kernels`
  on a one-device CPU in float32 (`ops.use_cpu_kernel`), 'cpu' insists, 'xla' never.
  """

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
  """Dropout with a mask per example (`ops.dropout`); no parameters, like `nn.Dropout`.

  `example_ids` int [n] names the examples whose rows `x` holds (None: row i is example i).
  """

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
  """The kernel and bias of a DenseGeneral, created but not applied.

  Same names, shapes and initial values as `nn.DenseGeneral` (Xavier over the kernel flattened to
  [inputs, outputs], zero bias): the attention applies them as 2-D matmuls (`ops.matmul_2d`).
  """

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
  """Multi-head self-attention with query/key/value kernels [D, heads, D/heads].

  The three projections run as one matmul (their kernels concatenated at apply time). The
  attention core runs per `attention_kernel` (see `ops.attention_path`): cuDNN's fused attention on
  [batch, tokens, heads, head_dim], the C++ kernel of `cpu_kernels` on the projections' output
  [batch, tokens, 3, heads, head_dim], or XLA matmuls and softmax in heads-major layout
  [batch, heads, tokens, head_dim] with a hand-written backward pass (`ops.attention`). The
  parameters are those of Flax's `nn.MultiHeadDotProductAttention` (query/key/value/out,
  DenseGeneral layout).
  """

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
  """Dense → GELU → Dense, with dropout (the matmuls over flattened tokens, `ops.dense`).

  The published weights were trained with the tanh approximation of GELU (flax's default,
  `gelu_approximate=True`); timm and Hugging Face default to the exact (erf) GELU, which
  `gelu_approximate=False` computes.
  """

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


class Encoder1DBlock(nn.Module):
  """A pre-LayerNorm Transformer block: x + MSA(LN(x)), then x + MLP(LN(x)) (Eq. 2–3).

  With `drop_path` (rate r, key), stochastic depth: each residual branch of each example is
  kept with probability 1 - r and then scaled by 1/(1 - r), else dropped (the example's block
  output is then its input, on that branch). The two branches decide independently, under
  fold_in(key, 0) (attention) and fold_in(key, 1) (MLP), per example id (`ops.drop_path_keep`);
  the decisions, bool [2, batch], are sown as `drop_path_keep` in `intermediates` when that
  collection is mutable.
  """

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

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    deterministic: bool,
    example_ids: jax.Array | None = None,
    drop_path: DropPath | None = None,
  ) -> jax.Array:
    """x: [batch, tokens, width] → the same; example_ids int [batch] or None (the rows);
    drop_path: None (no stochastic depth), or (rate, key) for training."""
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

    y = LayerNorm(name="LayerNorm_0", **ln_kw)(x)
    y = MultiHeadDotProductAttention(
      self.num_heads,
      self.attention_dropout_rate,
      attention_kernel=self.attention_kernel,
      name="MultiHeadDotProductAttention_1",
      **kw,
    )(y, deterministic, example_ids)
    y = Dropout(rate=self.dropout_rate)(y, deterministic, example_ids)
    x = x + branch(y, 0)
    y = LayerNorm(name="LayerNorm_2", **ln_kw)(x)
    y = MlpBlock(
      self.mlp_dim,
      self.dropout_rate,
      gelu_approximate=self.gelu_approximate,
      name="MlpBlock_3",
      **kw,
    )(y, deterministic, example_ids)
    return x + branch(y, 1)


class _ScannedEncoder1DBlock(Encoder1DBlock):
  """The same block in nn.scan's (carry, output) calling convention; with `keep_outputs` the
  output is the block's output too (stacked by the scan: [layers, batch, tokens, width])."""

  keep_outputs: bool = False

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    deterministic: bool,
    example_ids: jax.Array | None = None,
    drop_path: DropPath | None = None,
  ) -> tuple[jax.Array, jax.Array | None]:
    y = super().__call__(x, deterministic, example_ids, drop_path)
    return y, (y if self.keep_outputs else None)


def stochastic_depth_rates(stochastic_depth: float, num_layers: int) -> np.ndarray:
  """Each block's drop-path rate, float [num_layers]: growing linearly with depth from 0 at the
  first block to `stochastic_depth` at the last, DeiT's convention (timm's
  `linspace(0, drop_path_rate, depth)`). A one-block model's is 0."""
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
  """The `posemb='sincos2d'` table as a learned one is laid out: [1, prefix + gh*gw, width],
  float64, zero rows for the class (and any other prefix) token, then `sincos2d_posemb`.

  The class token gets no position embedding, as in big_vision (which adds the table before
  prepending its class token) and MoCo v3 (a zero row): a zero row here.
  """
  table = sincos2d_posemb(grid, width)
  return np.concatenate([np.zeros((num_prefix_tokens, width)), table])[None]


class AddPositionEmbs(nn.Module):
  """Adds position embeddings [1, tokens, width] (Eq. 1): learned ('learn', the parameter
  `pos_embedding`) or fixed 2-D sin-cos ones for the patch grid ('sincos2d', `fixed_posemb`: no
  parameter; the tokens before the grid's, the class token, get zeros)."""

  param_dtype: Dtype = jnp.float32
  grad_reduce_dtype: Dtype | None = None
  posemb: str = "learn"

  @nn.compact
  def __call__(self, x: jax.Array, grid: tuple[int, int] | None = None) -> jax.Array:
    """x: [batch, tokens, width]; grid: (gh, gw), the patch grid of the last gh*gw tokens
    (needed by 'sincos2d')."""
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
  """Non-overlapping patches, flattened and projected: a conv with kernel = stride = patch.

  The kernel keeps the conv layout [patch, patch, channels, width] of the checkpoints, but the
  projection runs as one matmul over patches gathered by a reshape and transpose of the (small)
  image: the same numbers as the VALID conv (which drops the pixels past the last whole patch),
  and a plain matmul, with its cheaper weight gradient, on every backend.
  """

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


class Encoder(nn.Module):
  """Position embeddings, `num_layers` blocks and the final LayerNorm (`Transformer/...`).

  With `stochastic_depth` > 0, in training, block i drops its residual branches at the rate
  `stochastic_depth_rates(stochastic_depth, num_layers)[i]` under the key fold_in(k, i), k drawn
  once here from the 'dropout' rng: the same decisions with `scan` (the rates and keys are
  scanned inputs) as without, and under `remat`.
  """

  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  remat: bool = False
  scan: bool = False
  gelu_approximate: bool = True
  attention_kernel: str = "auto"
  layer_norm_kernel: str = "auto"
  grad_reduce_dtype: Dtype | None = None
  posemb: str = "learn"
  stochastic_depth: float = 0.0

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    deterministic: bool,
    example_ids: jax.Array | None = None,
    layers: tuple[int, ...] = (),
    norm_layers: bool = False,
    grid: tuple[int, int] | None = None,
  ) -> jax.Array | tuple[jax.Array, list[jax.Array]]:
    """x: [batch, tokens, width] → [batch, tokens, width]; example_ids int [batch] or None.

    With `layers` (block indices in [0, num_layers)) it returns (output, [the output of each
    of those blocks, [batch, tokens, width]]), each through the final LayerNorm if
    `norm_layers`. `grid` (gh, gw) is the patch grid of the last gh*gw tokens ('sincos2d').
    """
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
    block_kw = dict(
      mlp_dim=self.mlp_dim,
      num_heads=self.num_heads,
      dropout_rate=self.dropout_rate,
      attention_dropout_rate=self.attention_dropout_rate,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      gelu_approximate=self.gelu_approximate,
      attention_kernel=self.attention_kernel,
      layer_norm_kernel=self.layer_norm_kernel,
      grad_reduce_dtype=self.grad_reduce_dtype,
    )
    block_cls = _ScannedEncoder1DBlock if self.scan else Encoder1DBlock
    if self.scan and layers:
      block_cls = functools.partial(block_cls, keep_outputs=True)
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
      x, outputs = nn.scan(
        block_cls,
        variable_axes={"params": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=in_axes,
        length=self.num_layers,
      )(name="encoderblock", **block_kw)(x, *args)
      kept = [outputs[i] for i in layers]
    else:
      outputs = {}
      for i in range(self.num_layers):
        block_drop_path = None if drop_path is None else (drop_path[0][i], drop_path[1][i])
        x = block_cls(name=f"encoderblock_{i}", **block_kw)(
          x, deterministic, example_ids, block_drop_path
        )
        outputs[i] = x
      kept = [outputs[i] for i in layers]
    encoder_norm = LayerNorm(
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      kernel=self.layer_norm_kernel,
      name="encoder_norm",
    )
    if not layers:
      return encoder_norm(x)
    return encoder_norm(x), [encoder_norm(y) if norm_layers else y for y in kept]


def _layer_indices(layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
  """Block indices in [0, num_layers) (negative ones count from the end); one line if not."""
  out = []
  for i in layers:
    if not -num_layers <= int(i) < num_layers:
      raise ValueError(
        f"feature layer {i} outside the model's {num_layers} blocks "
        f"(0..{num_layers - 1}, or -1 for the last)"
      )
    out.append(int(i) % num_layers)
  if not out:
    raise ValueError("feature_layers is empty: name at least one block (e.g. (-1,))")
  return tuple(out)


class VisionTransformer(nn.Module):
  """ViT (and R50+ViT hybrid) classifier.

  Attributes:
    num_classes: width of the zero-initialised linear head; None returns the representation.
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
    gelu_approximate: the MLP's GELU; True (default) is the tanh approximation the published
      weights were trained with, False the exact erf GELU that timm and Hugging Face use by
      default (and that matches them exactly). No parameter depends on it.
    attention_kernel: the attention core: 'auto' (cuDNN's fused attention on NVIDIA GPUs for
      bf16/fp16, the C++ kernel of `cpu_kernels` on a one-device CPU backend for float32, XLA
      elsewhere), 'xla', 'cudnn' or 'cpu'. The same function up to rounding; no parameter
      depends on it. Sowing attention weights or attention dropout use XLA.
    layer_norm_kernel: the LayerNorms: 'auto' (the C++ kernel of `cpu_kernels` on a one-device
      CPU backend for float32, XLA elsewhere), 'xla' or 'cpu'; the same function up to rounding.
    grad_reduce_dtype: the dtype in which the parameters' gradients leave the backward pass, and
      so are summed across devices, when it is wider than `dtype` (bfloat16 compute with
      'float32': the weight gradients' matmuls accumulate into float32; `ops.dense`,
      `ops.broadcast_param`); otherwise, and for a ResNet stem, the dtype autodiff gives them.
    distill_token: DeiT's distillation token `dist_token` after the class token, with its own
      head `head_dist` (initialised as `head`); needs classifier 'token'. With `train=True` the
      logits are the pair (class head, distillation head), with `train=False` their average
      (see `__call__`).
    posemb: the position embeddings: 'learn' (the paper's learned table,
      `Transformer/posembed_input/pos_embedding`) or 'sincos2d' (fixed 2-D sin-cos embeddings of
      Beyer et al., 2022, `sincos2d_posemb`: no parameter, computed for the actual patch grid,
      so any resolution and aspect ratio needs no resizing; the class token gets none).
      vit_jax.checkpoint.with_posemb_table writes a sincos2d model's table into its parameters,
      as the published files and `posemb='learn'` models have it.
    stochastic_depth: the largest drop-path rate (Huang et al., 2016), 0 for none: in training,
      each example's two residual branches in block i are dropped at the rate
      `stochastic_depth_rates(stochastic_depth, num_layers)[i]` (0 at the first block, growing
      linearly to `stochastic_depth` at the last, as DeiT and timm schedule it), kept ones
      scaled by 1/(1 - rate), decided per example id under the 'dropout' rng.
  """

  num_classes: int | None
  patch_size: int
  hidden_size: int
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  classifier: str = "token"
  representation_size: int | None = None
  resnet: Any = None
  head_bias_init: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  remat: bool = False
  scan: bool = False
  gelu_approximate: bool = True
  attention_kernel: str = "auto"
  layer_norm_kernel: str = "auto"
  grad_reduce_dtype: Dtype | None = None
  distill_token: bool = False
  posemb: str = "learn"
  stochastic_depth: float = 0.0

  @nn.compact
  def __call__(
    self,
    images: jax.Array,
    *,
    train: bool,
    return_representation: bool = False,
    corrupt_fn: Callable[[jax.Array], jax.Array] | None = None,
    return_tokens: bool = False,
    example_ids: jax.Array | None = None,
    feature_layers: Sequence[int] | None = None,
    feature_norm: bool = False,
  ) -> jax.Array | list[jax.Array]:
    """Classifies images, or returns the token maps of chosen blocks (`feature_layers`).

    Args:
      images: [batch, height, width, 3], values in [-1, 1].
      train: enables dropout and stochastic depth (needs the 'dropout' rng).
      return_representation: return the pre-head representation [batch, R or D] instead (with
        `distill_token`, the class token's: the representation every ViT gives).
      corrupt_fn: applied to the patch embeddings [batch, patches, D] before the class token
        and position embeddings are added (masked patch prediction, vit_jax.models.mpp); it may create
        parameters of the calling module. None: no change.
      return_tokens: return the encoder's output for the patch tokens [batch, patches, D]
        (at least float32, after the final LayerNorm, class token dropped) instead of the logits.
      example_ids: int [batch], each image's id: its dropout masks and stochastic depth's
        decisions are a function of the id and the 'dropout' rng only (the trainer passes the
        index in the global batch). None: the row.
      feature_layers: block indices (0 is the first block, negative ones count from the last:
        -1 is the last) whose outputs to return as token maps instead of the logits: a list, in
        this order, of [batch, H/p, W/p, hidden_size] arrays (at least float32), the patch
        tokens on their grid (for hybrids, the grid of the ResNet's feature map), class token
        left out. `vit_jax.models.forward_intermediates` is the call to use.
      feature_norm: pass each map through the encoder's final LayerNorm (`encoder_norm`); the
        last block's map is then the `return_tokens` output on its grid.

    Returns:
      Logits [batch, num_classes] in float32, float64 for a float64 model (or the
      representation, the patch tokens, or the list of token maps). With `distill_token`:
      `train=True` gives the pair (class-token logits, distillation-token logits), each
      [batch, num_classes]; `train=False` gives (class + distillation) / 2 (DeiT's prediction).
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
      x = resnet.resnet_stem(
        x,
        tuple(self.resnet["num_layers"]),
        self.resnet["width_factor"],
        self.dtype,
        self.param_dtype,
      )
    layers = ()
    if feature_layers is not None:
      layers = _layer_indices(feature_layers, self.num_layers)
    grid = (x.shape[1] // self.patch_size, x.shape[2] // self.patch_size)
    # Linear projection of flattened patches (Eq. 1).
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
    if self.classifier == "token":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, width), self.param_dtype)
      cls = ops.broadcast_param(cls, (batch, 1, width), x.dtype, self.grad_reduce_dtype)
      prefix_tokens = [cls]
      if self.distill_token:  # initialised as DeiT's (timm: trunc_normal, std 0.02)
        init = nn.initializers.normal(stddev=0.02)
        dist = self.param("dist_token", init, (1, 1, width), self.param_dtype)
        prefix_tokens.append(
          ops.broadcast_param(dist, (batch, 1, width), x.dtype, self.grad_reduce_dtype)
        )
      x = jnp.concatenate([*prefix_tokens, x], axis=1)
    x = Encoder(
      num_layers=self.num_layers,
      mlp_dim=self.mlp_dim,
      num_heads=self.num_heads,
      dropout_rate=self.dropout_rate,
      attention_dropout_rate=self.attention_dropout_rate,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      remat=self.remat,
      scan=self.scan,
      gelu_approximate=self.gelu_approximate,
      attention_kernel=self.attention_kernel,
      layer_norm_kernel=self.layer_norm_kernel,
      grad_reduce_dtype=self.grad_reduce_dtype,
      posemb=self.posemb,
      stochastic_depth=self.stochastic_depth,
      name="Transformer",
    )(
      x,
      not train,
      jnp.arange(batch) if example_ids is None else example_ids,
      layers,
      feature_norm,
      grid,
    )
    prefix = (1 + int(self.distill_token)) if self.classifier == "token" else 0
    if layers:
      return [
        y[:, prefix:].reshape(batch, *grid, width).astype(ops.wide_dtype(y.dtype)) for y in x[1]
      ]
    if return_tokens:
      return x[:, prefix:].astype(ops.wide_dtype(x.dtype))
    dist = None
    if self.classifier == "token":  # (static slices: see MultiHeadDotProductAttention)
      if self.distill_token:
        dist = jax.lax.index_in_dim(x, 1, axis=1, keepdims=False)
      x = jax.lax.index_in_dim(x, 0, axis=1, keepdims=False)
    else:
      x = jnp.mean(x, axis=1)
    dense = functools.partial(
      Dense,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      grad_reduce_dtype=self.grad_reduce_dtype,
    )
    if self.representation_size is not None:
      pre_logits = dense(self.representation_size, name="pre_logits")
      x = jnp.tanh(pre_logits(x))
      if dist is not None:  # the same layer for both tokens
        dist = jnp.tanh(pre_logits(dist))
    if return_representation or self.num_classes is None:
      return x.astype(ops.wide_dtype(x.dtype))
    head = functools.partial(
      dense,
      self.num_classes,
      kernel_init=nn.initializers.zeros,
      bias_init=nn.initializers.constant(self.head_bias_init),
    )
    logits = head(name="head")(x)
    logits = logits.astype(ops.wide_dtype(logits.dtype))
    if dist is None:
      return logits
    dist_logits = head(name="head_dist")(dist)
    dist_logits = dist_logits.astype(ops.wide_dtype(dist_logits.dtype))
    if train:  # both, for the distillation objective to weigh
      return logits, dist_logits
    return (logits + dist_logits) / 2
