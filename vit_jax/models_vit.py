"""The Vision Transformer (Dosovitskiy et al., 2021, §3.1) as Flax linen modules.

Module and parameter names are the published vit_jax checkpoint format (`embedding`, `cls`,
`Transformer/posembed_input/pos_embedding`, `Transformer/encoderblock_{i}/LayerNorm_0|
MultiHeadDotProductAttention_1|LayerNorm_2|MlpBlock_3`, `Transformer/encoder_norm`, `pre_logits`,
`head`), so a published `.npz` maps onto the tree without renaming. With `scan=True` the blocks
are one scanned `Transformer/encoderblock` whose leaves have a leading layer axis.

Computation runs in `dtype` (e.g. bfloat16) while parameters stay in `param_dtype` (float32).
Attention weights are sown into the `intermediates` collection when the caller makes it mutable
(`model.apply(..., mutable=['intermediates'])`).

Layout for speed, not for the parameters (which keep the checkpoint format): the Dense layers run
as 2-D matmuls over flattened tokens, the Q/K/V projections as one matmul, the attention core
in heads-major layout with a hand-written backward pass (`_attention`; instead, on NVIDIA GPUs in
bf16 cuDNN's fused attention and on a one-device CPU in float32 the C++ kernel of
`vit_jax/cpu_kernels.py`: `attention_kernel`), and the LayerNorms and the tanh GELU with
one each (`_layer_norm`, `_gelu_tanh`; the LayerNorms, like the attention, in C++ on a
one-device CPU: `layer_norm_kernel`); see the profile in experiments/benchmark_model.py's
docstring.

This file must not import TensorFlow.
"""

import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import cpu_kernels, models_resnet

Dtype = Any

_xavier = nn.initializers.xavier_uniform()
_tiny_normal = nn.initializers.normal(stddev=1e-6)


def _wide(dtype: Dtype) -> Any:
  """The dtype of the numerically sensitive steps (softmax, LayerNorm statistics, GELU's
  gradient, the returned logits): at least float32, so bf16/fp16 computation widens to float32
  while a float64 model (the tests' reference runs, under JAX_ENABLE_X64) stays float64."""
  return jnp.promote_types(dtype, jnp.float32)


def _matmul_2d(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
  """x [..., n] @ kernel [n, m] + bias [m], run as one 2-D matmul over the flattened rows.

  The same numbers as a Dense on [batch, tokens, n]; XLA's CPU backend runs the backward pass of
  the 2-D form (the weight gradient contracts one dimension instead of batch and tokens) about
  2.5x faster for the ViT's shapes (experiments/benchmark_model.py).
  """
  rows = x.reshape(-1, x.shape[-1])
  return (rows @ kernel + bias).reshape(*x.shape[:-1], kernel.shape[-1])


def _scaled_queries(q: jax.Array) -> jax.Array:
  """q / sqrt(head_dim): the logits' scale applied to the [.., tokens, head_dim] queries.

  Scaling the queries instead of the [.., tokens, tokens] logits is the same product up to
  rounding (exactly the same when head_dim is a power of 4, as in every preset but H/14) and
  touches head_dim/tokens as many numbers.
  """
  return q * (1.0 / math.sqrt(q.shape[-1]))


def _softmax_weights(q_scaled: jax.Array, k: jax.Array) -> jax.Array:
  """softmax(q_scaled k^T) over keys, in at least float32: [b, h, q, d], [b, h, k, d] → [b, h, q, k]."""
  logits = jnp.einsum("bhqd,bhkd->bhqk", q_scaled, k)
  return jax.nn.softmax(logits.astype(_wide(logits.dtype)), axis=-1).astype(q_scaled.dtype)


def _attention_weights(q: jax.Array, k: jax.Array) -> jax.Array:
  """softmax(q k^T / sqrt(head_dim)) over keys (see `_softmax_weights`): [b, h, q, d], [b, h, k, d]
  → [b, h, q, k]."""
  return _softmax_weights(_scaled_queries(q), k)


@jax.custom_vjp
def _attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """softmax(q k^T / sqrt(d)) v for [batch, heads, tokens, head_dim] inputs.

  The same function as the autodiff of `_attention_weights` and one einsum, with a hand-written
  backward pass (`_attention_bwd`) that reuses the forward's softmax weights and scaled queries.
  """
  return jnp.einsum("bhqk,bhkd->bhqd", _attention_weights(q, k), v)


def _attention_fwd(q, k, v):
  q_scaled = _scaled_queries(q)
  weights = _softmax_weights(q_scaled, k)
  return jnp.einsum("bhqk,bhkd->bhqd", weights, v), (q_scaled, k, v, weights)


# Head dims up to this take the transposed form of the key/value gradients in `_attention_bwd`.
_TRANSPOSED_BWD_MAX_HEAD_DIM = 32


def _attention_bwd(residuals, d_out):
  """Gradients of `_attention`: d_q = d_logits k, d_k = d_logits^T q, d_v = weights^T d_out.

  d_k and d_v contract the [q, k] matrices over their query (non-minor) dimension. For head dims
  up to `_TRANSPOSED_BWD_MAX_HEAD_DIM` they are computed transposed (d_k^T = q^T d_logits),
  transposing only the thin [tokens, head_dim] operands, behind optimization barriers so that XLA
  does not fold the transposes back into the matmuls; for wider heads the transposes cost more
  than they save and the matmuls contract directly. Forward + backward of the core alone, fp32, 2
  CPU cores (XLA's Eigen matmuls), direct vs transposed: ViT-Ti/16's [32, 3, 197, 64] 54 vs 70
  ms, ViT-B/16's [8, 12, 197, 64] 49 vs 71 ms; the demo model's [128, 4, 65, 16] 28 vs 23 ms,
  [128, 2, 65, 32] 16.5 vs 15.3 ms. Inside the whole train step the choice made no measurable
  difference on that machine (step-by-step alternation, median of paired ratios transposed /
  direct: Ti/16 0.994 over 20 pairs, B/16 1.010 over 12), so the rule rests on the standalone
  figures. The direct form is the one autodiff produces.
  """
  q, k, v, weights = residuals  # q is scaled: the logits are q k^T.
  d_weights = jnp.einsum("bhqd,bhkd->bhqk", d_out, v)
  w32 = weights.astype(_wide(weights.dtype))
  d_logits = w32 * (d_weights - jnp.sum(d_weights * w32, axis=-1, keepdims=True))
  d_logits = d_logits.astype(q.dtype)
  d_q = _scaled_queries(jnp.einsum("bhqk,bhkd->bhqd", d_logits, k))
  if q.shape[-1] > _TRANSPOSED_BWD_MAX_HEAD_DIM:
    d_k = jnp.einsum("bhqk,bhqd->bhkd", d_logits, q)
    d_v = jnp.einsum("bhqk,bhqd->bhkd", weights, d_out)
    return d_q, d_k, d_v
  q_t, d_out_t = jax.lax.optimization_barrier(
    (jnp.swapaxes(q, -1, -2), jnp.swapaxes(d_out, -1, -2))
  )
  d_k_t, d_v_t = jax.lax.optimization_barrier(
    (
      jnp.einsum("bhdq,bhqk->bhdk", q_t, d_logits),
      jnp.einsum("bhdq,bhqk->bhdk", d_out_t, weights),
    )
  )
  d_k, d_v = jnp.swapaxes(d_k_t, -1, -2), jnp.swapaxes(d_v_t, -1, -2)
  return d_q, d_k, d_v


_attention.defvjp(_attention_fwd, _attention_bwd)


ATTENTION_KERNELS = ("auto", "xla", "cudnn", "cpu")


_FUSED_IMPLEMENTATION = "cudnn"  # jax.nn.dot_product_attention's; tests run the code on "xla"


def _cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """cuDNN's fused (flash) attention, forward and backward, on [batch, tokens, heads, head_dim].

  jax (0.10-0.11) refuses to train cuDNN attention on an odd number of tokens (197 for a /16 model
  at 224px with its class token), so odd sequences get one zero token that the keys' padding
  mask (`key_value_seq_lengths`) hides, and its output row is dropped.
  """
  batch, tokens = q.shape[:2]
  if tokens % 2 == 0:
    return jax.nn.dot_product_attention(q, k, v, implementation=_FUSED_IMPLEMENTATION)
  pad = ((0, 0), (0, 1), (0, 0), (0, 0))
  lengths = jnp.full((batch,), tokens, jnp.int32)
  out = jax.nn.dot_product_attention(
    jnp.pad(q, pad),
    jnp.pad(k, pad),
    jnp.pad(v, pad),
    query_seq_lengths=lengths,
    key_value_seq_lengths=lengths,
    implementation=_FUSED_IMPLEMENTATION,
  )
  return out[:, :tokens]


def _use_cpu_kernel(field: str, kernel: str, dtype: Dtype) -> bool:
  """Whether `field` = kernel ('auto', 'cpu' or another choice) runs vit_jax.cpu_kernels' C++.

  'auto' takes it on a CPU backend with one device for float32 when the kernels could be built
  (otherwise it logs why, once); 'cpu' insists, and fails clearly where it cannot run. The C++
  kernels have no sharding rule, hence one device: on a mesh of several XLA would gather their
  operands.
  """
  backend = jax.default_backend()
  float32 = jnp.dtype(dtype) == jnp.dtype(jnp.float32)
  if kernel == "cpu":
    if backend != "cpu" or not float32:
      raise ValueError(
        f"{field}='cpu' runs float32 on the CPU backend; here the backend is {backend!r} and "
        f"the dtype {jnp.dtype(dtype).name} (use 'auto' or 'xla')"
      )
    reason = cpu_kernels.unavailable_reason()
    if reason:
      raise ValueError(f"{field}='cpu': {reason}")
    return True
  if kernel == "auto" and backend == "cpu" and float32 and jax.device_count() == 1:
    if cpu_kernels.unavailable_reason() is None:
      return True
    cpu_kernels.warn_unavailable()
  return False


def _attention_path(kernel: str, dtype: Dtype, head_dim: int) -> str:
  """Where `attention_kernel` = kernel runs this block's attention core: 'cudnn', 'cpu' or 'xla'.

  'auto' picks cuDNN on an NVIDIA GPU for bf16/fp16 computation with a head dim cuDNN's flash
  attention takes (a multiple of 8, at most 128), the C++ kernel of `cpu_kernels` as
  `_use_cpu_kernel` says, and the XLA path everywhere else. 'cudnn' and 'cpu' insist, and fail
  clearly where they cannot run.
  """
  if kernel not in ATTENTION_KERNELS:
    raise ValueError(f"attention_kernel={kernel!r}; expected one of {ATTENTION_KERNELS}")
  backend = jax.default_backend()
  if kernel == "cudnn":
    if backend != "gpu":
      raise ValueError(
        f"attention_kernel='cudnn' needs an NVIDIA GPU; the default backend is "
        f"{backend!r} (use 'auto' or 'xla')"
      )
    return "cudnn"
  if _use_cpu_kernel("attention_kernel", kernel, dtype):
    return "cpu"
  low_precision = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  fits = head_dim % 8 == 0 and head_dim <= 128
  if kernel == "auto" and backend == "gpu" and low_precision and fits:
    return "cudnn"
  return "xla"


# flax's nn.LayerNorm default, the published checkpoints' value; the C++ kernel's too.
_LAYER_NORM_EPSILON = cpu_kernels.LAYER_NORM_EPSILON
LAYER_NORM_KERNELS = ("auto", "xla", "cpu")


@jax.custom_vjp
def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
  """(x - mean) / sqrt(var + 1e-6) * scale + bias over the last axis, statistics in float32
  (or wider, `_wide`).

  The function of flax's `nn.LayerNorm` (variance as the mean of squared deviations, where flax
  by default uses E[x^2] - E[x]^2; the two agree to float32 rounding), with a hand-written
  backward pass: two row means for the input gradient and two column sums for the parameters.
  Autodiff of the same forward gives XLA:CPU more small fusions and materialises `scale`
  broadcast to the activations' shape. fp32 train step on 2 CPU cores, both variants compiled in
  one process and timed in alternating rounds (medians; rounds vary by +-10% on that machine):
  with `_gelu_tanh` in place, ViT-Ti/16 3.48 -> 3.43 s, the demo's model 396 -> 386 ms.
  """
  return _layer_norm_forward(x, scale, bias)[0]


def _layer_norm_forward(x, scale, bias):
  """(y in x's dtype, mean, 1/std): the output and the row statistics, [..., 1] in `_wide`."""
  wide = _wide(x.dtype)
  x32 = x.astype(wide)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  centered = x32 - mean
  rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + _LAYER_NORM_EPSILON)
  y = centered * rstd * scale.astype(wide) + bias.astype(wide)
  return y.astype(x.dtype), mean, rstd


def _layer_norm_fwd(x, scale, bias):
  y, mean, rstd = _layer_norm_forward(x, scale, bias)
  # Save the statistics as computed here: without the barrier XLA:CPU fuses their row reductions
  # into the backward pass's fusions again (a standalone LayerNorm's forward + backward on Ti/16's
  # activations: 7.0 -> 6.1 ms). Train step on 2 cores, with against without, in-process A/Bs
  # (experiments/ablate_step.py's method, medians of 8-30 alternating rounds): ViT-Ti/16 -4.6%,
  # -6.6% and -0.5% in three runs, the demo's model 367 -> 351 ms; numerics unchanged.
  mean, rstd = jax.lax.optimization_barrier((mean, rstd))
  return y, (x, mean, rstd, scale)


def _layer_norm_bwd(residuals, d_y):
  x, mean, rstd, scale = residuals
  wide = _wide(x.dtype)
  x_hat = (x.astype(wide) - mean) * rstd
  d_y = d_y.astype(wide)
  g = d_y * scale.astype(wide)
  d_x = rstd * (
    g - jnp.mean(g, axis=-1, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=-1, keepdims=True)
  )
  rows = tuple(range(x.ndim - 1))
  d_scale = jnp.sum(d_y * x_hat, axis=rows).astype(scale.dtype)
  d_bias = jnp.sum(d_y, axis=rows).astype(scale.dtype)
  return d_x.astype(x.dtype), d_scale, d_bias


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis with flax's parameters (`scale` ones, `bias` zeros) and epsilon.

  Computes `_layer_norm` in float32 and returns `dtype`; a drop-in for `nn.LayerNorm` in the
  checkpoint format. `kernel` (LAYER_NORM_KERNELS): 'auto' runs the C++ kernel of `cpu_kernels`
  on a one-device CPU in float32 (`_use_cpu_kernel`), 'cpu' insists, 'xla' never.
  """

  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  kernel: str = "auto"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.kernel not in LAYER_NORM_KERNELS:
      raise ValueError(f"layer_norm_kernel={self.kernel!r}; expected one of {LAYER_NORM_KERNELS}")
    features = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (features,), self.param_dtype)
    bias = self.param("bias", nn.initializers.zeros, (features,), self.param_dtype)
    if _use_cpu_kernel("layer_norm_kernel", self.kernel, self.dtype):
      f32 = jnp.float32
      return cpu_kernels.layer_norm(x.astype(f32), scale.astype(f32), bias.astype(f32))
    return _layer_norm(x.astype(self.dtype), scale, bias)


@jax.custom_vjp
def _gelu_tanh(x: jax.Array) -> jax.Array:
  """The tanh approximation of GELU (`nn.gelu(x, approximate=True)`, the same numbers) with a
  hand-written backward pass that keeps only `x` and recomputes the tanh from it.

  Autodiff of the same forward keeps the tanh as well, written out by the forward pass and read
  back by the backward one ([tokens, mlp_dim] floats per block). fp32 train step on 2 CPU cores,
  measured as for `_layer_norm`: ViT-Ti/16 3.65 -> 3.48 s, the demo's model 410 -> 396 ms.
  """
  return nn.gelu(x, approximate=True)


def _gelu_tanh_fwd(x):
  return _gelu_tanh(x), x


def _gelu_tanh_bwd(x, d_y):
  c = math.sqrt(2.0 / math.pi)
  wide = _wide(x.dtype)
  x32 = x.astype(wide)
  t = jnp.tanh(c * (x32 + 0.044715 * x32 * x32 * x32))
  slope = 0.5 * (1.0 + t) + 0.5 * x32 * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x32 * x32)
  return ((d_y.astype(wide) * slope).astype(x.dtype),)


_gelu_tanh.defvjp(_gelu_tanh_fwd, _gelu_tanh_bwd)


class _Projection(nn.Module):
  """The kernel and bias of a DenseGeneral, created but not applied.

  Same names, shapes and initial values as `nn.DenseGeneral` (Xavier over the kernel flattened to
  [inputs, outputs], zero bias): the attention applies them as 2-D matmuls (`_matmul_2d`).
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


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head self-attention with query/key/value kernels [D, heads, D/heads].

  The three projections run as one matmul (their kernels concatenated at apply time). The
  attention core runs per `attention_kernel` (see `_attention_path`): cuDNN's fused attention on
  [batch, tokens, heads, head_dim], the C++ kernel of `cpu_kernels` on the projections' output
  [batch, tokens, 3, heads, head_dim], or XLA matmuls and softmax in heads-major layout
  [batch, heads, tokens, head_dim] with a hand-written backward pass (`_attention`). The
  parameters are those of Flax's `nn.MultiHeadDotProductAttention` (query/key/value/out,
  DenseGeneral layout).
  """

  num_heads: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  attention_kernel: str = "auto"

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    """x: [batch, tokens, width] → [batch, tokens, width]."""
    batch, tokens, width = x.shape
    heads = self.num_heads
    if width % heads:
      raise ValueError(f"hidden size {width} is not divisible by num_heads={heads}")
    head_dim = width // heads
    projections = [
      _Projection((width, heads, head_dim), 1, self.param_dtype, name=n)()
      for n in ("query", "key", "value")
    ]
    kernel = jnp.stack([k for k, _ in projections], axis=1).astype(self.dtype)  # [D, 3, h, d]
    bias = jnp.stack([b for _, b in projections], axis=0).astype(self.dtype)  # [3, h, d]
    qkv = _matmul_2d(x.astype(self.dtype), kernel.reshape(width, -1), bias.reshape(-1))
    qkv = qkv.reshape(batch, tokens, 3, heads, head_dim)
    sow = self.is_mutable_collection("intermediates")
    dropout = self.dropout_rate > 0.0 and not deterministic
    path = _attention_path(self.attention_kernel, self.dtype, head_dim)
    if path == "cudnn" and not (sow or dropout):
      out = _cudnn_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])  # [b, t, h, d]
      out = out.reshape(batch, tokens, width)
    elif path == "cpu" and not (sow or dropout):
      out = cpu_kernels.attention(qkv).reshape(batch, tokens, width)
    else:
      qkv = qkv.transpose(2, 0, 3, 1, 4)
      q, k, v = qkv[0], qkv[1], qkv[2]  # [batch, heads, tokens, head_dim]
      if sow:
        self.sow("intermediates", "attention_weights", _attention_weights(q, k))
      if dropout:
        weights = _attention_weights(q, k)
        weights = nn.Dropout(rate=self.dropout_rate)(weights, deterministic=False)
        out = jnp.einsum("bhqk,bhkd->bhqd", weights, v)
      else:
        out = _attention(q, k, v)
      out = out.transpose(0, 2, 1, 3).reshape(batch, tokens, width)
    out_kernel, out_bias = _Projection((heads, head_dim, width), 2, self.param_dtype, name="out")()
    return _matmul_2d(
      out, out_kernel.reshape(width, width).astype(self.dtype), out_bias.astype(self.dtype)
    )


class MlpBlock(nn.Module):
  """Dense → GELU → Dense, with dropout (the matmuls over flattened tokens, `_matmul_2d`).

  The published weights were trained with the tanh approximation of GELU (flax's default,
  `gelu_approximate=True`); timm and Hugging Face default to the exact (erf) GELU, which
  `gelu_approximate=False` computes.
  """

  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  gelu_approximate: bool = True

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    dense = functools.partial(
      nn.Dense,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      kernel_init=_xavier,
      bias_init=_tiny_normal,
    )
    rows = x.reshape(-1, x.shape[-1])
    y = dense(self.mlp_dim, name="Dense_0")(rows)
    y = _gelu_tanh(y) if self.gelu_approximate else nn.gelu(y, approximate=False)
    y = nn.Dropout(rate=self.dropout_rate)(y, deterministic=deterministic)
    y = dense(x.shape[-1], name="Dense_1")(y)
    return nn.Dropout(rate=self.dropout_rate)(y, deterministic=deterministic).reshape(x.shape)


class Encoder1DBlock(nn.Module):
  """A pre-LayerNorm Transformer block: x + MSA(LN(x)), then x + MLP(LN(x)) (Eq. 2–3)."""

  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  gelu_approximate: bool = True
  attention_kernel: str = "auto"
  layer_norm_kernel: str = "auto"

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    ln_kw = dict(kernel=self.layer_norm_kernel, **kw)
    y = LayerNorm(name="LayerNorm_0", **ln_kw)(x)
    y = MultiHeadDotProductAttention(
      self.num_heads,
      self.attention_dropout_rate,
      attention_kernel=self.attention_kernel,
      name="MultiHeadDotProductAttention_1",
      **kw,
    )(y, deterministic)
    y = nn.Dropout(rate=self.dropout_rate)(y, deterministic=deterministic)
    x = x + y
    y = LayerNorm(name="LayerNorm_2", **ln_kw)(x)
    y = MlpBlock(
      self.mlp_dim,
      self.dropout_rate,
      gelu_approximate=self.gelu_approximate,
      name="MlpBlock_3",
      **kw,
    )(y, deterministic)
    return x + y


class _ScannedEncoder1DBlock(Encoder1DBlock):
  """The same block in nn.scan's (carry, output) calling convention."""

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> tuple[jax.Array, None]:
    return super().__call__(x, deterministic), None


class AddPositionEmbs(nn.Module):
  """Adds learned 1-D position embeddings [1, tokens, width] (Eq. 1)."""

  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    pos_embedding = self.param(
      "pos_embedding",
      nn.initializers.normal(stddev=0.02),
      (1, x.shape[1], x.shape[2]),
      self.param_dtype,
    )
    return x + pos_embedding.astype(x.dtype)


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
    kernel = jnp.reshape(kernel, (p * p * channels, self.features)).astype(self.dtype)
    return x @ kernel + bias.astype(self.dtype)


class Encoder(nn.Module):
  """Position embeddings, `num_layers` blocks and the final LayerNorm (`Transformer/...`)."""

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

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    """x: [batch, tokens, width] → [batch, tokens, width]."""
    x = AddPositionEmbs(param_dtype=self.param_dtype, name="posembed_input")(x)
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
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
    )
    block_cls = _ScannedEncoder1DBlock if self.scan else Encoder1DBlock
    if self.remat:
      # Recompute each block's activations in the backward pass; `deterministic` (argument 2,
      # counting self) is a Python bool and must stay static.
      block_cls = nn.remat(block_cls, prevent_cse=not self.scan, static_argnums=(2,))
    if self.scan:
      x, _ = nn.scan(
        block_cls,
        variable_axes={"params": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=nn.broadcast,
        length=self.num_layers,
      )(name="encoderblock", **block_kw)(x, deterministic)
    else:
      for i in range(self.num_layers):
        x = block_cls(name=f"encoderblock_{i}", **block_kw)(x, deterministic)
    return LayerNorm(
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      kernel=self.layer_norm_kernel,
      name="encoder_norm",
    )(x)


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

  @nn.compact
  def __call__(
    self,
    images: jax.Array,
    *,
    train: bool,
    return_representation: bool = False,
    corrupt_fn: Callable[[jax.Array], jax.Array] | None = None,
    return_tokens: bool = False,
  ) -> jax.Array:
    """Classifies images.

    Args:
      images: [batch, height, width, 3], values in [-1, 1].
      train: enables dropout (needs the 'dropout' rng).
      return_representation: return the pre-head representation [batch, R or D] instead.
      corrupt_fn: applied to the patch embeddings [batch, patches, D] before the class token
        and position embeddings are added (masked patch prediction, vit_jax.mpp); it may create
        parameters of the calling module. None: no change.
      return_tokens: return the encoder's output for the patch tokens [batch, patches, D]
        (at least float32, after the final LayerNorm, class token dropped) instead of the logits.

    Returns:
      Logits [batch, num_classes] in float32, float64 for a float64 model (or the
      representation, or the patch tokens).
    """
    if self.classifier not in ("token", "gap"):
      raise ValueError(f"classifier must be 'token' or 'gap', got {self.classifier!r}")
    x = images.astype(self.dtype)
    if self.resnet is not None:
      x = models_resnet.resnet_stem(
        x,
        tuple(self.resnet["num_layers"]),
        self.resnet["width_factor"],
        self.dtype,
        self.param_dtype,
      )
    # Linear projection of flattened patches (Eq. 1).
    x = PatchEmbedding(
      self.patch_size,
      self.hidden_size,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name="embedding",
    )(x)
    if corrupt_fn is not None:
      x = corrupt_fn(x)
    batch, _, width = x.shape
    if self.classifier == "token":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, width), self.param_dtype)
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (batch, 1, width)), x], axis=1)
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
      name="Transformer",
    )(x, not train)
    if return_tokens:
      return (x[:, 1:] if self.classifier == "token" else x).astype(_wide(x.dtype))
    x = x[:, 0] if self.classifier == "token" else jnp.mean(x, axis=1)
    if self.representation_size is not None:
      x = nn.Dense(
        self.representation_size, dtype=self.dtype, param_dtype=self.param_dtype, name="pre_logits"
      )(x)
      x = jnp.tanh(x)
    if return_representation or self.num_classes is None:
      return x.astype(_wide(x.dtype))
    logits = nn.Dense(
      self.num_classes,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      kernel_init=nn.initializers.zeros,
      bias_init=nn.initializers.constant(self.head_bias_init),
      name="head",
    )(x)
    return logits.astype(_wide(logits.dtype))
