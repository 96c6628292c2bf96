"""The ViT's numerics below the modules: custom-VJP ops and where each one runs.

`attention`, `layer_norm` and `gelu_tanh` compute their flax counterparts' functions with
backward passes XLA compiles into fewer, cheaper fusions; `dropout` and `drop_path_keep` decide
per example id, not per row; `attention_path` and `use_cpu_kernel` choose between XLA, cuDNN and
the C++ kernels of vit_jax.kernels.cpu. vit_jax.models.vit calls these through this module's
attributes (experiments/benchmarks/ablate_step.py swaps one).

This file must not import TensorFlow.
"""

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import random as jax_random

from vit_jax.kernels import cpu as cpu_kernels

Dtype = Any


def wide_dtype(dtype: Dtype) -> Any:
  """At least float32 (float64 stays): the dtype of softmax, LayerNorm statistics, logits."""
  return jnp.promote_types(dtype, jnp.float32)


def dropout(x: jax.Array, rate: float, key: jax.Array, example_ids: jax.Array) -> jax.Array:
  """Inverted dropout whose mask for example i is bernoulli(fold_in(key, example_ids[i])).

  Unlike `nn.Dropout`, an example's mask does not depend on its row, so it is the same in any
  batch, micro-batch or sharding. The bits are those of `jax.random.bernoulli(fold_in(key, id),
  float32(1 - rate), example's shape)` (a float32 draw under JAX_ENABLE_X64 too), computed in x's
  own shape (`keep_mask`): drawn through a vmap, the TPU compiler kept ~4 bytes per element for
  the backward pass (tests/test_step_memory.py, docs/pod_planning.md).

  Args:
    x: [n·k, ...]: the rows of n examples, example i owning rows i·k .. i·k + k − 1 (k = 1 for
      [batch, ...]; k = tokens for an MLP's flattened tokens).
    rate: the probability of dropping an element.
    key: the layer's key (a threefry key, typed or raw uint32 [2]).
    example_ids: int [n], one id per example.
  """
  n = example_ids.shape[0]
  rows = x.shape[0] // n
  keep = 1.0 - rate
  keys = jax.vmap(jax.random.fold_in, (None, 0))(key, example_ids)
  if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
    keys = jax.random.key_data(keys)
  if keys.shape[-1:] != (2,) or not jax.config.jax_threefry_partitionable:
    raise ValueError(
      "ops.dropout draws threefry bits (jax_threefry_partitionable, jax's default); the key "
      f"has data of shape {keys.shape[1:]} (jax_default_prng_impl="
      f"{jax.config.jax_default_prng_impl!r})"
    )
  row_keys = jnp.repeat(keys, rows, axis=0, total_repeat_length=x.shape[0])  # [n·k, 2]
  return jax.lax.select(keep_mask(x.shape, rows, row_keys, keep), x / keep, jnp.zeros_like(x))


def drop_path_keep(rate: jax.Array | float, key: jax.Array, example_ids: jax.Array) -> jax.Array:
  """bool [n]: whether each example keeps a residual branch under stochastic depth (Huang et
  al., 2016): uniform(fold_in(key, example_ids[i])) >= rate, drawn in float32 as `dropout`'s.
  `rate` may be traced (a scanned block's)."""
  keys = jax.vmap(jax.random.fold_in, (None, 0))(key, example_ids)
  uniform = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
  return uniform >= jnp.asarray(rate, jnp.float32)


def keep_mask(shape: tuple[int, ...], rows: int, row_keys: jax.Array, keep: float) -> jax.Array:
  """bool `shape` [n·k, ...]: the bits `jax.random.bernoulli(key, float32(keep), per-example
  shape)` gives under each row's example's key, `row_keys` uint32 [n·k, 2]; `rows` is k."""
  # jax.random.bernoulli's steps with the partitionable threefry (jax._src.random): the 64-bit
  # counter of an element is its index in the example's row-major order (under 2**32: its high
  # word is 0), the bits are the hash's two words xor'ed, their top 23 bits make a float32 in
  # [1, 2), less 1 it is compared with `keep`.
  per_row = math.prod(shape[1:])
  index = jax.lax.broadcasted_iota(jnp.uint32, shape, 0) % np.uint32(rows) * np.uint32(per_row)
  stride = per_row
  for axis in range(1, len(shape)):
    stride //= shape[axis]
    index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(stride)
  # Keys [n·k, 1, ...], broadcast by the hash itself: on the CPU it runs as a loop over its
  # rounds, whose state would otherwise hold the keys at x's size too.
  key_shape = (shape[0],) + (1,) * (len(shape) - 1)
  k1, k2 = (row_keys[:, i].reshape(key_shape) for i in (0, 1))
  bits1, bits2 = jax_random.threefry2x32_p.bind(k1, k2, jnp.zeros(shape, jnp.uint32), index)
  one = np.array(1.0, np.float32).view(np.uint32)
  floats = jax.lax.bitcast_convert_type(((bits1 ^ bits2) >> np.uint32(9)) | one, jnp.float32)
  return floats - np.float32(1.0) < np.float32(keep)


def matmul_2d(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
  """x [..., n] @ kernel [n, m] + bias [m] as one 2-D matmul over the flattened rows: the 2-D
  weight gradient runs faster on XLA:CPU (docs/benchmarks.md)."""
  rows = x.reshape(-1, x.shape[-1])
  return (rows @ kernel + bias).reshape(*x.shape[:-1], kernel.shape[-1])


def gradient_dtype(compute_dtype: Dtype, grad_reduce_dtype: Dtype | None) -> Any:
  """The dtype the parameters' gradients leave the backward pass (and are summed across devices)
  in: `grad_reduce_dtype` where wider than `compute_dtype`, else `compute_dtype`."""
  compute = jnp.dtype(compute_dtype)
  if grad_reduce_dtype is None:
    return compute
  reduce = jnp.dtype(grad_reduce_dtype)
  return reduce if reduce.itemsize > compute.itemsize else compute


def dense(
  x: jax.Array, kernel: jax.Array, bias: jax.Array, grad_reduce_dtype=None, flatten: bool = True
) -> jax.Array:
  """x [..., n] @ kernel [n, m] + bias [m] in x's dtype, the parameters cast to it; with
  `flatten` as one 2-D matmul over the flattened rows (`matmul_2d`).

  The parameters' gradients are computed in `gradient_dtype(x.dtype, grad_reduce_dtype)`: with
  bf16 `x` and float32 `grad_reduce_dtype` the weight gradient's matmul accumulates into float32
  (`_dense_wide`), so the partial sums the devices add up are float32; otherwise plain autodiff.
  """
  wide = gradient_dtype(x.dtype, grad_reduce_dtype)
  if wide == x.dtype:
    return _affine(x, kernel.astype(x.dtype), bias.astype(x.dtype), flatten)
  return _dense_wide(x, kernel, bias, wide, flatten)


def dense_params(dtype: Dtype, grad_reduce_dtype, *params: jax.Array) -> tuple[jax.Array, ...]:
  """`params` cast to `dtype` where their gradients stay in it, else kept (the wide path); a
  layer stacking its parameters does so on the cast copy: TPU memory differs with the order."""
  if gradient_dtype(dtype, grad_reduce_dtype) == jnp.dtype(dtype):
    return tuple(p.astype(dtype) for p in params)
  return params


def _affine(x, kernel, bias, flatten):
  return matmul_2d(x, kernel, bias) if flatten else x @ kernel + bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _dense_wide(x, kernel, bias, wide, flatten):
  return _affine(x, kernel.astype(x.dtype), bias.astype(x.dtype), flatten)


def _dense_wide_fwd(x, kernel, bias, wide, flatten):
  # The parameters themselves are kept (they live anyway), not a cast copy: the backward pass
  # casts the kernel again, a conversion XLA fuses into the matmul that reads it.
  return _dense_wide(x, kernel, bias, wide, flatten), (x, kernel, bias)


def _dense_wide_bwd(wide, flatten, residuals, d_y):
  x, kernel, bias = residuals
  if flatten:
    x_in, d_in = x.reshape(-1, x.shape[-1]), d_y.reshape(-1, d_y.shape[-1])
  else:
    x_in, d_in = x, d_y
  rows = tuple(range(x_in.ndim - 1))
  d_x = (d_in @ kernel.astype(x.dtype).T).reshape(x.shape)
  d_kernel = jax.lax.dot_general(x_in, d_in, ((rows, rows), ((), ())), preferred_element_type=wide)
  d_bias = jnp.sum(d_in.astype(wide), axis=rows)
  return d_x, d_kernel.astype(kernel.dtype), d_bias.astype(bias.dtype)


_dense_wide.defvjp(_dense_wide_fwd, _dense_wide_bwd)


def broadcast_param(
  param: jax.Array, shape: tuple[int, ...], dtype: Dtype, grad_reduce_dtype=None
) -> jax.Array:
  """`param` cast to `dtype` and broadcast to `shape`, its gradient summed in
  `gradient_dtype(dtype, grad_reduce_dtype)` (see `dense`)."""
  wide = gradient_dtype(dtype, grad_reduce_dtype)
  if wide == jnp.dtype(dtype):
    return jnp.broadcast_to(param.astype(dtype), shape)
  return _broadcast_wide(param, shape, jnp.dtype(dtype), wide)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _broadcast_wide(param, shape, dtype, wide):
  return jnp.broadcast_to(param.astype(dtype), shape)


def _broadcast_wide_fwd(param, shape, dtype, wide):
  # A zero-size array carries the parameter's shape and dtype to the backward pass.
  return _broadcast_wide(param, shape, dtype, wide), jnp.zeros((*param.shape, 0), param.dtype)


def _broadcast_wide_bwd(shape, dtype, wide, like, d_y):
  param_shape = like.shape[:-1]
  lead = d_y.ndim - len(param_shape)
  axes = tuple(range(lead)) + tuple(
    lead + i for i, n in enumerate(param_shape) if n == 1 and d_y.shape[lead + i] != 1
  )
  d_param = jnp.sum(d_y.astype(wide), axis=axes).reshape(param_shape)
  return (d_param.astype(like.dtype),)


_broadcast_wide.defvjp(_broadcast_wide_fwd, _broadcast_wide_bwd)


def scaled_queries(q: jax.Array) -> jax.Array:
  """q / sqrt(head_dim): the logits' scale applied to the [.., tokens, head_dim] queries.

  Scaling the queries instead of the [.., tokens, tokens] logits is the same product up to
  rounding (exactly the same when head_dim is a power of 4, as in every preset but H/14) and
  touches head_dim/tokens as many numbers.
  """
  return q * (1.0 / math.sqrt(q.shape[-1]))


def softmax_weights(q_scaled: jax.Array, k: jax.Array) -> jax.Array:
  """softmax(q_scaled k^T) over keys, in at least float32: [b, h, q, d], [b, h, k, d] → [b, h, q, k]."""
  logits = jnp.einsum("bhqd,bhkd->bhqk", q_scaled, k)
  return jax.nn.softmax(logits.astype(wide_dtype(logits.dtype)), axis=-1).astype(q_scaled.dtype)


def attention_weights(q: jax.Array, k: jax.Array) -> jax.Array:
  """softmax(q k^T / sqrt(head_dim)) over keys (`softmax_weights`)."""
  return softmax_weights(scaled_queries(q), k)


@jax.custom_vjp
def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """softmax(q k^T / sqrt(d)) v for [batch, heads, tokens, head_dim] inputs.

  The same function as the autodiff of `attention_weights` and one einsum, with a hand-written
  backward pass (`_attention_bwd`) that reuses the forward's softmax weights and scaled queries.
  """
  return jnp.einsum("bhqk,bhkd->bhqd", attention_weights(q, k), v)


def _attention_fwd(q, k, v):
  q_scaled = scaled_queries(q)
  weights = softmax_weights(q_scaled, k)
  return jnp.einsum("bhqk,bhkd->bhqd", weights, v), (q_scaled, k, v, weights)


# Head dims up to this take the transposed form of the key/value gradients in `_attention_bwd`.
TRANSPOSED_BWD_MAX_HEAD_DIM = 32


def _attention_bwd(residuals, d_out):
  """Gradients of `attention`: d_q = d_logits k, d_k = d_logits^T q, d_v = weights^T d_out.

  d_k and d_v contract the [q, k] matrices over their query (non-minor) dimension. For head dims
  up to `TRANSPOSED_BWD_MAX_HEAD_DIM` they are computed transposed (d_k^T = q^T d_logits),
  transposing only the thin [tokens, head_dim] operands, behind optimization barriers so that XLA
  does not fold the transposes back into the matmuls; for wider heads the transposes cost more
  than they save and the matmuls contract directly (the direct form is autodiff's). The
  measurements behind the rule: docs/benchmarks.md.
  """
  q, k, v, weights = residuals  # q is scaled: the logits are q k^T.
  d_weights = jnp.einsum("bhqd,bhkd->bhqk", d_out, v)
  w32 = weights.astype(wide_dtype(weights.dtype))
  d_logits = w32 * (d_weights - jnp.sum(d_weights * w32, axis=-1, keepdims=True))
  d_logits = d_logits.astype(q.dtype)
  d_q = scaled_queries(jnp.einsum("bhqk,bhkd->bhqd", d_logits, k))
  if q.shape[-1] > TRANSPOSED_BWD_MAX_HEAD_DIM:
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


attention.defvjp(_attention_fwd, _attention_bwd)


ATTENTION_KERNELS = ("auto", "xla", "cudnn", "cpu")


FUSED_IMPLEMENTATION = "cudnn"  # jax.nn.dot_product_attention's; tests run the code on "xla"


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """cuDNN's fused (flash) attention, forward and backward, on [batch, tokens, heads, head_dim].

  jax (0.10-0.11) refuses to train cuDNN attention on an odd number of tokens (197 for a /16 model
  at 224px with its class token), so odd sequences get one zero token that the keys' padding
  mask (`key_value_seq_lengths`) hides, and its output row is dropped.
  """
  batch, tokens = q.shape[:2]
  if tokens % 2 == 0:
    return jax.nn.dot_product_attention(q, k, v, implementation=FUSED_IMPLEMENTATION)
  pad = ((0, 0), (0, 1), (0, 0), (0, 0))
  lengths = jnp.full((batch,), tokens, jnp.int32)
  out = jax.nn.dot_product_attention(
    jnp.pad(q, pad),
    jnp.pad(k, pad),
    jnp.pad(v, pad),
    query_seq_lengths=lengths,
    key_value_seq_lengths=lengths,
    implementation=FUSED_IMPLEMENTATION,
  )
  return out[:, :tokens]


def use_cpu_kernel(field: str, kernel: str, dtype: Dtype) -> bool:
  """Whether `field` = kernel runs vit_jax.kernels.cpu's C++: 'auto' on a one-device CPU backend
  in float32 when built (they have no sharding rule), 'cpu' insists."""
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


def attention_kernel_for_mesh(kernel: str, mesh: Any) -> str:
  """'auto' becomes 'xla' on a mesh with a 'model' axis > 1: jax cannot partition cuDNN's fused
  attention along heads (nor the C++ kernels)."""
  if kernel == "auto" and dict(mesh.shape).get("model", 1) > 1:
    return "xla"
  return kernel


def attention_path(kernel: str, dtype: Dtype, head_dim: int) -> str:
  """Where `attention_kernel` = kernel runs this block's attention core: 'cudnn', 'cpu' or 'xla'.

  'auto': cuDNN on an NVIDIA GPU for bf16/fp16 with head dim a multiple of 8 up to 128, C++ as
  `use_cpu_kernel` says, else XLA. 'cudnn' and 'cpu' insist.
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
  if use_cpu_kernel("attention_kernel", kernel, dtype):
    return "cpu"
  low_precision = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  fits = head_dim % 8 == 0 and head_dim <= 128
  if kernel == "auto" and backend == "gpu" and low_precision and fits:
    return "cudnn"
  return "xla"


# flax's nn.LayerNorm default, the published checkpoints' value; the C++ kernel's too.
LAYER_NORM_EPSILON = cpu_kernels.LAYER_NORM_EPSILON
LAYER_NORM_KERNELS = ("auto", "xla", "cpu")


@jax.custom_vjp
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
  """(x - mean) / sqrt(var + 1e-6) * scale + bias over the last axis, statistics in float32
  (or wider, `wide`).

  The function of flax's `nn.LayerNorm` (variance as the mean of squared deviations, where flax
  by default uses E[x^2] - E[x]^2; the two agree to float32 rounding), with a hand-written
  backward pass: two row means for the input gradient and two column sums for the parameters.
  Autodiff of the same forward gives XLA:CPU more small fusions and materialises `scale`
  broadcast to the activations' shape (what it saves: docs/benchmarks.md).
  """
  return layer_norm_forward(x, scale, bias)[0]


def layer_norm_forward(x, scale, bias):
  """(y in x's dtype, mean, 1/std): the output and the row statistics, [..., 1] in `wide_dtype`."""
  wide = wide_dtype(x.dtype)
  x32 = x.astype(wide)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  centered = x32 - mean
  rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + LAYER_NORM_EPSILON)
  y = centered * rstd * scale.astype(wide) + bias.astype(wide)
  return y.astype(x.dtype), mean, rstd


def _layer_norm_fwd(x, scale, bias):
  y, mean, rstd = layer_norm_forward(x, scale, bias)
  # Save the statistics as computed here: without the barrier XLA:CPU fuses their row reductions
  # into the backward pass's fusions again, recomputing them (docs/benchmarks.md).
  mean, rstd = jax.lax.optimization_barrier((mean, rstd))
  return y, (x, mean, rstd, scale)


def _layer_norm_bwd(residuals, d_y):
  x, mean, rstd, scale = residuals
  wide = wide_dtype(x.dtype)
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


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


@jax.custom_vjp
def gelu_tanh(x: jax.Array) -> jax.Array:
  """The tanh approximation of GELU (`nn.gelu(x, approximate=True)`, the same numbers) with a
  hand-written backward pass that keeps only `x` and recomputes the tanh from it.

  Autodiff of the same forward keeps the tanh as well, written out by the forward pass and read
  back by the backward one ([tokens, mlp_dim] floats per block; docs/benchmarks.md).
  """
  return nn.gelu(x, approximate=True)


def _gelu_tanh_fwd(x):
  return gelu_tanh(x), x


def _gelu_tanh_bwd(x, d_y):
  c = math.sqrt(2.0 / math.pi)
  wide = wide_dtype(x.dtype)
  x32 = x.astype(wide)
  t = jnp.tanh(c * (x32 + 0.044715 * x32 * x32 * x32))
  slope = 0.5 * (1.0 + t) + 0.5 * x32 * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x32 * x32)
  return ((d_y.astype(wide) * slope).astype(x.dtype),)


gelu_tanh.defvjp(_gelu_tanh_fwd, _gelu_tanh_bwd)
