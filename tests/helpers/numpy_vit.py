"""A plain float64 numpy forward pass of the ViT and the R50+ViT hybrid, from the paper's equations.

Written from Dosovitskiy et al. (2021), §3.1, Eq. 1-4, and the BiT ResNet of the hybrids, reading
nothing but the parameter tree (the published checkpoint names; the tree is the only input about
the model: depth, widths, heads, patch size, classifier, pre-logits and ResNet stages are all read
off its keys and shapes). Nothing here imports or calls vit_jax: it is the independent side of
tests/test_reference_forward.py.

  z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos                      (Eq. 1)
  z'_l = MSA(LN(z_{l-1})) + z_{l-1}                                   (Eq. 2)
  z_l = MLP(LN(z'_l)) + z'_l                                          (Eq. 3)
  y = LN(z_L^0)  (class token; 'gap': the mean of LN(z_L) over tokens) (Eq. 4)
  logits = head(tanh(pre_logits(y)))  (pre-logits only where the tree has them)

MSA is softmax(q k^T / sqrt(d_head)) v per head, then the output projection; MLP is
Dense -> GELU -> Dense. Stochastic depth (Huang et al., 2016), given its decisions, multiplies
each example's MSA and MLP terms of Eq. 2-3 by a scale: 1/(1 - rate) if kept, 0 if dropped.
The hybrid's patches are 1x1 (or p x p) patches of the feature map of a ResNet: a
weight-standardised 7x7/2 conv, GroupNorm, ReLU and a 3x3/2 max-pool, then stages of
post-activation bottleneck units (GroupNorm after every conv, ReLU after the residual sum), the
first unit of every stage but the first with stride 2, all convs and the pool 'SAME'-padded.

Constants are the published models': LayerNorm epsilon 1e-6 and GroupNorm epsilon 1e-6 with 32
groups (flax's defaults, which the checkpoints were trained with), weight standardisation
(w - mean) / (std + 1e-5) as in the official vit_jax hybrid code.
"""

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

LAYER_NORM_EPSILON = 1e-6
GROUP_NORM_EPSILON = 1e-6
GROUP_NORM_GROUPS = 32
WEIGHT_STANDARDISATION_EPSILON = 1e-5

Params = Mapping[str, Any]


def as_float64(params: Params) -> dict[str, Any]:
  """The parameter tree as nested dicts of float64 numpy arrays."""
  if isinstance(params, Mapping):
    return {key: as_float64(value) for key, value in params.items()}
  return np.asarray(params, np.float64)


def layer_norm(x: np.ndarray, p: Params) -> np.ndarray:
  """(x - mean) / sqrt(var + eps) * scale + bias over the last axis."""
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + LAYER_NORM_EPSILON) * p["scale"] + p["bias"]


def gelu(x: np.ndarray, approximate: bool = True) -> np.ndarray:
  """GELU: the tanh approximation (the published weights') or the exact x * Phi(x)."""
  if approximate:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
  erf = np.vectorize(math.erf, otypes=[np.float64])
  return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def dense(x: np.ndarray, p: Params) -> np.ndarray:
  return x @ p["kernel"] + p["bias"]


def self_attention(x: np.ndarray, p: Params) -> np.ndarray:
  """Multi-head self-attention; kernels [D, heads, d_head] and out [heads, d_head, D]."""
  q, k, v = (
    np.einsum("btc,chd->bthd", x, p[name]["kernel"]) + p[name]["bias"]
    for name in ("query", "key", "value")
  )
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  heads = np.einsum("bhqk,bkhd->bqhd", weights, v)
  return np.einsum("bqhd,hdc->bqc", heads, p["out"]["kernel"]) + p["out"]["bias"]


def encoder_block(
  z: np.ndarray, p: Params, gelu_approximate: bool = True, branch_scales: np.ndarray | None = None
) -> np.ndarray:
  """One pre-LN Transformer block, Eq. 2 and 3; `branch_scales` [2, batch] (stochastic depth)
  multiplies each example's MSA term (row 0) and MLP term (row 1); None: 1."""
  s = np.ones((2, z.shape[0])) if branch_scales is None else np.asarray(branch_scales, np.float64)
  msa = self_attention(layer_norm(z, p["LayerNorm_0"]), p["MultiHeadDotProductAttention_1"])
  z = s[0, :, None, None] * msa + z
  mlp = p["MlpBlock_3"]
  y = gelu(dense(layer_norm(z, p["LayerNorm_2"]), mlp["Dense_0"]), gelu_approximate)
  return s[1, :, None, None] * dense(y, mlp["Dense_1"]) + z


def patches(x: np.ndarray, p: int) -> np.ndarray:
  """[b, H, W, c] -> [b, (H/p)(W/p), p*p*c]: non-overlapping patches in row-major grid order,
  each flattened (row, column, channel); pixels past the last whole patch are dropped."""
  b, h, w, c = x.shape
  gh, gw = h // p, w // p
  x = x[:, : gh * p, : gw * p].reshape(b, gh, p, gw, p, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, gh * gw, p * p * c)


def _same_padding(size: int, k: int, stride: int) -> tuple[int, int]:
  """'SAME' padding: ceil(size / stride) outputs, the odd pixel of padding at the end."""
  out = -(-size // stride)
  total = max((out - 1) * stride + k - size, 0)
  return total // 2, total - total // 2


def _windows(x: np.ndarray, k: int, stride: int, fill: float):
  """Pads x [b, h, w, c] 'SAME' with `fill`; yields (i, j, the [b, oh, ow, c] inputs at kernel
  offset (i, j) of every output position)."""
  (top, bottom), (left, right) = (_same_padding(s, k, stride) for s in x.shape[1:3])
  x = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=fill)
  oh, ow = (x.shape[1] - k) // stride + 1, (x.shape[2] - k) // stride + 1
  for i in range(k):
    for j in range(k):
      rows, cols = (
        slice(i, i + stride * (oh - 1) + 1, stride),
        slice(j, j + stride * (ow - 1) + 1, stride),
      )
      yield i, j, x[:, rows, cols]


def std_conv(x: np.ndarray, kernel: np.ndarray, stride: int) -> np.ndarray:
  """A bias-free 'SAME' conv with its kernel [k, k, c_in, c_out] weight-standardised per output."""
  kernel = kernel - kernel.mean(axis=(0, 1, 2))
  kernel = kernel / (np.sqrt((kernel**2).mean(axis=(0, 1, 2))) + WEIGHT_STANDARDISATION_EPSILON)
  return sum(window @ kernel[i, j] for i, j, window in _windows(x, kernel.shape[0], stride, 0.0))


def max_pool(x: np.ndarray, k: int = 3, stride: int = 2) -> np.ndarray:
  """k x k max-pool, 'SAME' (padding never wins the max)."""
  return np.max([window for _, _, window in _windows(x, k, stride, -np.inf)], axis=0)


def group_norm(x: np.ndarray, p: Params) -> np.ndarray:
  """GroupNorm over (height, width, channels of the group), 32 groups, then scale and bias."""
  b, h, w, c = x.shape
  g = x.reshape(b, h, w, GROUP_NORM_GROUPS, c // GROUP_NORM_GROUPS)
  mean = g.mean(axis=(1, 2, 4), keepdims=True)
  var = ((g - mean) ** 2).mean(axis=(1, 2, 4), keepdims=True)
  g = (g - mean) / np.sqrt(var + GROUP_NORM_EPSILON)
  return g.reshape(x.shape) * p["scale"] + p["bias"]


def relu(x: np.ndarray) -> np.ndarray:
  return np.maximum(x, 0.0)


def bottleneck(x: np.ndarray, p: Params, stride: int) -> np.ndarray:
  """Post-activation bottleneck: 1x1 -> 3x3 (strided) -> 1x1, GroupNorm after each conv, ReLU
  after the first two and after the sum with the (projected, where the tree has one) input."""
  residual = x
  if "conv_proj" in p:
    residual = group_norm(std_conv(x, p["conv_proj"]["kernel"], stride), p["gn_proj"])
  y = relu(group_norm(std_conv(x, p["conv1"]["kernel"], 1), p["gn1"]))
  y = relu(group_norm(std_conv(y, p["conv2"]["kernel"], stride), p["gn2"]))
  y = group_norm(std_conv(y, p["conv3"]["kernel"], 1), p["gn3"])
  return relu(residual + y)


def _numbered(params: Params, pattern: str) -> list[Any]:
  """The values of keys `pattern` (with one group, a number) in the order of that number, which
  must run 0.. or 1.. without gaps."""
  found = {int(m.group(1)): v for k, v in params.items() if (m := re.fullmatch(pattern, k))}
  order = sorted(found)
  if order:
    assert order == list(range(order[0], order[0] + len(order))), f"{pattern}: {order}"
  return [found[i] for i in order]


def resnet(images: np.ndarray, params: Params) -> np.ndarray:
  """The hybrid's ResNet: root conv, GroupNorm, ReLU, max-pool, then the stages `block{s}`."""
  x = relu(group_norm(std_conv(images, params["conv_root"]["kernel"], 2), params["gn_root"]))
  x = max_pool(x)
  for s, stage in enumerate(_numbered(params, r"block(\d+)")):
    for u, unit in enumerate(_numbered(stage, r"unit(\d+)")):
      x = bottleneck(x, unit, stride=2 if s > 0 and u == 0 else 1)
  return x


def forward(
  params: Params,
  images: np.ndarray,
  gelu_approximate: bool = True,
  branch_scales: np.ndarray | None = None,
) -> np.ndarray:
  """The ViT (or R50+ViT hybrid, where the tree has `conv_root`) in float64.

  Args:
    params: the model's parameter tree (unrolled blocks `Transformer/encoderblock_{i}`).
    images: [batch, height, width, 3].
    gelu_approximate: the MLP's GELU, tanh approximation (True) or exact.
    branch_scales: [blocks, 2, batch], stochastic depth's scale of each block's MSA and MLP
      term for each example (`encoder_block`); None: none.

  Returns:
    Logits [batch, classes] (without a head: the representation), float64.
  """
  params = as_float64(params)
  x = np.asarray(images, np.float64)
  if "conv_root" in params:
    x = resnet(x, params)
  embedding = params["embedding"]
  p = embedding["kernel"].shape[0]
  z = patches(x, p) @ embedding["kernel"].reshape(-1, embedding["kernel"].shape[-1])
  z = z + embedding["bias"]
  token = "cls" in params  # the class-token classifier; without one, 'gap'
  if token:
    cls = np.broadcast_to(params["cls"], (z.shape[0], 1, z.shape[2]))
    z = np.concatenate([cls, z], axis=1)
  encoder = params["Transformer"]
  assert "encoderblock" not in encoder, "scanned blocks: unstack them first"
  z = z + encoder["posembed_input"]["pos_embedding"]
  for i, block in enumerate(_numbered(encoder, r"encoderblock_(\d+)")):
    z = encoder_block(
      z, block, gelu_approximate, None if branch_scales is None else branch_scales[i]
    )
  z = layer_norm(z, encoder["encoder_norm"])
  y = z[:, 0] if token else z.mean(axis=1)
  if "pre_logits" in params:
    y = np.tanh(dense(y, params["pre_logits"]))
  if "head" not in params:
    return y
  return dense(y, params["head"])
