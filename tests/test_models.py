"""Tests of the ViT model family: exact sizes, layouts and the pod-oriented options."""

import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import xla_env
from vit_jax import checkpoint, models
from vit_jax.models import bit

# Parameters with 1000 classes at 224px, token classifier, no representation layer; a preset added
# without a count here fails test_every_preset_has_a_pinned_count. Where each figure comes from:
# - the ViTs and R50 hybrids: the MODEL_SIZES of google-research/vision_transformer's
#   vit_jax/models_test.py (the released models' code), the same figures;
# - BiT-R50x1/R101x1/R50x3/R152x2: timm's resnetv2_{50x1,101x1,50x3,152x2}_bit;
# - ViT-testing, ViT-demo and BiT-R26x1 have no outside counterpart (the official 'testing' preset is another
#   architecture, 21,390 parameters): test_vit_counts_follow_the_architecture and
#   test_bit_counts_follow_the_architecture derive them (and re-derive the others) from Table 1
#   and the ResNetV2 layout, so none of these numbers is only the code's own output.
PINNED_COUNTS = {
  "ViT-Ti_16": 5_717_416,
  "ViT-S_16": 22_050_664,
  "ViT-S_32": 22_878_952,
  "ViT-B_8": 86_576_872,
  "ViT-B_16": 86_567_656,
  "ViT-B_32": 88_224_232,
  "ViT-L_16": 304_326_632,
  "ViT-L_32": 306_535_400,
  "ViT-H_14": 632_045_800,
  "R50+ViT-B_16": 98_659_112,
  "R50+ViT-L_32": 328_994_856,
  "ViT-testing": 152_136,
  "ViT-demo": 469_032,
  "BiT-R50x1": 25_549_352,
  "BiT-R101x1": 44_541_480,
  "BiT-R50x3": 217_319_080,
  "BiT-R152x2": 236_335_208,
  "BiT-R26x1": 4_517_768,
}


def _param_shapes(model, image_size=224):
  images = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
  return jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), images)["params"]


def _count(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def _init(model, image_size=32, batch=2, seed=0):
  images = jax.random.uniform(jax.random.key(seed + 1), (batch, image_size, image_size, 3))
  images = images * 2 - 1
  params = jax.jit(lambda x: model.init(jax.random.key(seed), x, train=False))(images)["params"]
  return params, images


def _output(model, output="logits", **kw):
  """fn(params, images): the model's logits, or its `out[output]` (and the state, if `mutable`)."""

  def fn(p, x):
    result = model.apply({"params": p}, x, train=False, **kw)
    (logits, out), state = result if "mutable" in kw else (result, None)
    y = logits if output == "logits" else out[output]
    return y if state is None else (y, state)

  return fn


def _apply(model, params, images, output="logits", **kw):
  return jax.jit(_output(model, output, **kw))(params, images)


def _randomize(params, seed=3, scale=0.05):
  """Replaces every leaf by noise, so zero-initialised heads and scales do not hide mistakes.
  (One compiled program for the whole tree: op by op, a hybrid's hundred leaves compiled a
  hundred programs.)"""

  @jax.jit
  def noise(params):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [
      scale * jax.random.normal(k, x.shape, x.dtype) + (x if x.ndim == 1 else 0)
      for k, x in zip(keys, leaves, strict=True)
    ]
    return jax.tree.unflatten(treedef, leaves)

  return noise(params)


def _max_error(x, exact) -> float:
  return float(np.max(np.abs(np.asarray(x, np.float64) - exact)))


def _assert_as_accurate(ours, reference, exact, dtype=jnp.float32, ulps=4, scale=None):
  """`ours` is at most twice as far from `exact` (float64) as `reference`, the plain XLA/flax path
  computed in the same `dtype`, plus a floor of a few ulps of the largest exact value.

  Two low-precision implementations of one function agree only to about their own rounding
  error, which depends on the CPU (AVX2 and AVX-512 kernels round differently); measured against
  float64, each is held to the error the plain path actually has on this machine.

  Returns:
    (our error, the reference's error), maxima of absolute differences.
  """
  exact = np.asarray(exact, np.float64)
  ours_error, reference_error = _max_error(ours, exact), _max_error(reference, exact)
  scale = float(np.abs(exact).max()) if scale is None else scale
  floor = ulps * float(jnp.finfo(dtype).eps) * scale
  assert ours_error <= 2 * reference_error + floor, (ours_error, reference_error, floor)
  return ours_error, reference_error


def _assert_trees_as_accurate(ours, reference, exact, ulps=4):
  """`_assert_as_accurate` leaf by leaf, each leaf's floor from its own scale, except a leaf
  that is zero in exact arithmetic (the key biases' gradient: softmax ignores a constant added
  to every logit): its float32 values are rounding noise of computations at the scale of the
  whole tree, so its floor comes from the tree's largest value."""
  leaves = [jax.tree.leaves(t) for t in (ours, reference, exact)]
  assert len({len(x) for x in leaves}) == 1
  tree_scale = max(float(np.abs(np.asarray(c)).max()) for c in leaves[2])
  for a, b, c in zip(*leaves, strict=True):
    zero = float(np.abs(np.asarray(c)).max()) <= 1e-12 * tree_scale
    _assert_as_accurate(a, b, c, ulps=ulps, scale=tree_scale if zero else None)


def _apply64(model, params, images, output="logits", **kw):
  """The model in float64 (XLA kernels), as the exact value float32 results are measured against."""
  with jax.enable_x64(True):
    model64 = model.clone(
      dtype=jnp.float64, param_dtype=jnp.float64, attention_kernel="xla", layer_norm_kernel="xla"
    )
    params64 = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    fn = jax.jit(_output(model64, output, **kw))
    return jax.tree.map(np.asarray, fn(params64, np.asarray(images, np.float64)))


def test_every_preset_has_a_pinned_count():
  assert set(models.MODEL_CONFIGS) == set(PINNED_COUNTS)


@pytest.mark.parametrize("name", sorted(PINNED_COUNTS))
def test_parameter_count(name):
  assert _count(_param_shapes(models.get_model(name, num_classes=1000))) == PINNED_COUNTS[name]


def _vit_count(patch_size, hidden, mlp_dim, num_layers, num_classes=1000, image_size=224):
  """Parameters of a ViT (token classifier) from its architecture (paper Eq. 1-4)."""
  tokens = (image_size // patch_size) ** 2 + 1
  embedding = patch_size * patch_size * 3 * hidden + hidden
  attention = 4 * (hidden * hidden + hidden)  # query, key, value, out: kernels and biases
  mlp = hidden * mlp_dim + mlp_dim + mlp_dim * hidden + hidden
  block = 2 * hidden + attention + 2 * hidden + mlp  # two LayerNorms (scale, bias)
  head = hidden * num_classes + num_classes
  return embedding + hidden + tokens * hidden + num_layers * block + 2 * hidden + head


def _bit_count(block_units, width_factor=1, base_width=64, num_classes=1000):
  """Parameters of a BiT ResNetV2 from its architecture: a bias-free 7x7 root conv; pre-activation
  bottleneck units (GroupNorm + 1x1, GroupNorm + 3x3, GroupNorm + 1x1 to 4x the width) whose
  first unit per block has a 1x1 projection; a final GroupNorm; a 1x1 conv head with bias."""
  width = base_width * width_factor
  total, channels = 7 * 7 * 3 * width, width
  for b, units in enumerate(block_units):
    mid = width * 2**b
    out = 4 * mid
    for u in range(units):
      total += 2 * channels + channels * mid  # a: GroupNorm of the unit's input, 1x1 conv
      total += 2 * mid + 9 * mid * mid  # b
      total += 2 * mid + mid * out  # c
      total += channels * out if u == 0 else 0  # the projection
      channels = out
  return total + 2 * channels + channels * num_classes + num_classes


def test_vit_counts_follow_the_architecture():
  vits = [n for n in PINNED_COUNTS if n.startswith("ViT-")]
  assert len(vits) == 11
  for name in vits:
    c = models.get_model_config(name)
    formula = _vit_count(c.patch_size, c.hidden_size, c.mlp_dim, c.num_layers)
    assert formula == PINNED_COUNTS[name], name


def test_bit_counts_follow_the_architecture():
  for name, (depth, factor, base) in {
    "BiT-R50x1": (50, 1, 64),
    "BiT-R101x1": (101, 1, 64),
    "BiT-R50x3": (50, 3, 64),
    "BiT-R152x2": (152, 2, 64),
    "BiT-R26x1": (26, 1, 32),
  }.items():
    # ResNet-N has N = 3 * units + 2 layers: the root conv and the head besides the bottlenecks.
    units = {26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[depth]
    assert 3 * sum(units) + 2 == depth
    c = models.get_model_config(name)
    assert (tuple(c.block_units), c.width_factor, c.base_width) == (units, factor, base), name
    assert _bit_count(units, factor, base) == PINNED_COUNTS[name], name


def test_table1_shapes():
  for size, (width, mlp, heads, layers) in {
    "B": (768, 3072, 12, 12),
    "L": (1024, 4096, 16, 24),
    "H": (1280, 5120, 16, 32),
  }.items():
    config = models.get_model_config(f"{size}/{14 if size == 'H' else 16}")
    assert (config.hidden_size, config.mlp_dim, config.num_heads, config.num_layers) == (
      width,
      mlp,
      heads,
      layers,
    )


def test_published_layout_b16():
  shapes = _param_shapes(models.get_model("ViT-B_16", num_classes=1000, representation_size=768))
  flat = {k: v.shape for k, v in _flatten(shapes).items()}
  assert flat["embedding/kernel"] == (16, 16, 3, 768)
  assert flat["cls"] == (1, 1, 768)
  assert flat["Transformer/posembed_input/pos_embedding"] == (1, 197, 768)
  block = "Transformer/encoderblock_11/"
  assert flat[block + "MultiHeadDotProductAttention_1/query/kernel"] == (768, 12, 64)
  assert flat[block + "MultiHeadDotProductAttention_1/out/kernel"] == (12, 64, 768)
  assert flat[block + "MlpBlock_3/Dense_0/kernel"] == (768, 3072)
  assert flat[block + "LayerNorm_2/scale"] == (768,)
  assert flat["Transformer/encoder_norm/bias"] == (768,)
  assert flat["pre_logits/kernel"] == (768, 768)
  assert flat["head/kernel"] == (768, 1000)
  assert "Transformer/encoderblock_12/LayerNorm_0/scale" not in flat


def _flatten(tree, prefix=""):
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{key}/"))
    else:
      out[f"{prefix}{key}"] = value
  return out


def test_hybrid_layout_and_forward():
  flat = _flatten(_param_shapes(models.get_model("R50+ViT-B_16", num_classes=5), image_size=64))
  assert flat["conv_root/kernel"].shape == (7, 7, 3, 64)
  assert flat["block3/unit9/conv3/kernel"].shape == (1, 1, 256, 1024)
  assert flat["block2/unit1/gn_proj/scale"].shape == (512,)
  assert "block1/unit2/conv_proj/kernel" not in flat  # same width and stride: no projection
  assert flat["embedding/kernel"].shape == (1, 1, 1024, 768)
  # 64px / 16 = a 4x4 grid plus the class token.
  assert flat["Transformer/posembed_input/pos_embedding"].shape == (1, 17, 768)
  # A narrow hybrid runs forward (and its ResNet has an effect on the logits).
  small = models.get_model(
    "testing", num_classes=5, patch_size=1, resnet=dict(num_layers=(1, 1), width_factor=0.5)
  )
  params, images = _init(small, image_size=32)
  params = _randomize(params)
  logits = _apply(small, params, images)
  assert logits.shape == (2, 5) and np.all(np.isfinite(logits))
  exact = _apply64(small, params, images)
  conv2 = params["block2"]["unit1"]["conv2"]
  # Weight standardisation makes a conv invariant to scaling its kernel: scaled, the logits stay
  # (as accurate as the unscaled float32 logits are).
  conv2["kernel"] = conv2["kernel"] * 3.0
  _assert_as_accurate(_apply(small, params, images), logits, exact)
  conv2["kernel"] = conv2["kernel"] + jax.random.normal(jax.random.key(9), conv2["kernel"].shape)
  assert not np.allclose(_apply(small, params, images), logits)


def test_fresh_head_is_zero_and_logits_are_float32():
  model = models.get_model("testing", num_classes=7)
  params, images = _init(model)
  assert not np.any(params["head"]["kernel"]) and not np.any(params["head"]["bias"])
  logits = _apply(model, params, images)
  assert logits.dtype == jnp.float32 and logits.shape == (2, 7)
  np.testing.assert_array_equal(logits, 0.0)


def test_sigmoid_head_bias_init():
  model = models.get_model("testing", num_classes=3, head_bias_init=-10.0)
  params, images = _init(model)
  np.testing.assert_array_equal(_apply(model, params, images), -10.0)


_EPS32 = float(np.finfo(np.float32).eps)


def test_gap_classifier_is_the_head_of_the_mean_token():
  """classifier='gap': no class token; the logits are the head applied to the mean over the
  encoder's output tokens, taken from the same forward pass (captured) and averaged here."""
  model = models.get_model("testing", num_classes=3, classifier="gap")
  params, images = _init(model)
  assert "cls" not in params
  assert params["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 64, 32)
  params = _randomize(params, scale=0.3)
  capture = jax.jit(
    lambda p, x: model.apply(
      {"params": p}, x, train=False, capture_intermediates=lambda m, _: m.name == "Transformer"
    )
  )
  (logits, _), state = capture(params, images)
  tokens = np.float64(state["intermediates"]["Transformer"]["__call__"][0][0])
  assert tokens.shape == (2, 64, 32)  # [batch, patches, width]: 8x8 patches, no class token
  kernel, bias = np.float64(params["head"]["kernel"]), np.float64(params["head"]["bias"])
  pooled = tokens.mean(axis=1)
  expected = pooled @ kernel + bias
  # float32 rounding of a 64-term mean, then of a 32-term dot product plus bias (n * eps bounds).
  pool_bound = 64 * _EPS32 * np.abs(tokens).mean(axis=1)
  bound = pool_bound @ np.abs(kernel) + 33 * _EPS32 * (np.abs(pooled) @ np.abs(kernel) + abs(bias))
  assert np.all(np.abs(logits - expected) <= bound)
  assert np.abs(expected).max() > 100 * bound.max()  # the head is not zero: a real comparison
  # ... and not what the class-token readout (token 0) would give.
  assert np.abs(expected - (tokens[:, 0] @ kernel + bias)).min() > 100 * bound.max()
  rep = _apply(model, params, images, "pre_logits")
  assert rep.shape == (2, 32) and np.all(np.abs(rep - pooled) <= pool_bound)


def test_representation_layer():
  model = models.get_model("testing", num_classes=3, representation_size=16)
  params, images = _init(model)
  rep = _apply(model, _randomize(params), images, "pre_logits")
  assert rep.shape == (2, 16)
  assert np.all(np.abs(rep) <= 1.0)  # tanh
  assert _apply(models.get_model("testing", num_classes=None), params, images).shape == (2, 32)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("head_dim", [8, 40])  # the transposed and the direct key/value gradients
def test_attention_backward_equals_autodiff(dtype, head_dim):
  """The hand-written backward pass of the attention core is the gradient of its forward."""
  from vit_jax.models.ops import TRANSPOSED_BWD_MAX_HEAD_DIM, attention, attention_weights

  assert 8 <= TRANSPOSED_BWD_MAX_HEAD_DIM < 40  # one case on each side

  def plain(q, k, v):
    return jnp.einsum("bhqk,bhkd->bhqd", attention_weights(q, k), v)

  shape = (2, 3, 9, head_dim)
  q, k, v = (
    jax.random.normal(jax.random.key(i), shape, jnp.float32).astype(dtype) for i in range(3)
  )
  cotangent = jax.random.normal(jax.random.key(3), shape, jnp.float32).astype(dtype)
  exact_out, exact_grads = _np_attention_vjp(
    *(np.float64(np.float32(t)) for t in (q, k, v)), np.float64(np.float32(cotangent))
  )
  _assert_as_accurate(attention(q, k, v), plain(q, k, v), exact_out, dtype)
  ours = jax.vjp(attention, q, k, v)[1](cotangent)
  reference = jax.vjp(plain, q, k, v)[1](cotangent)
  for a, b, exact in zip(ours, reference, exact_grads, strict=True):
    assert a.dtype == dtype
    _assert_as_accurate(np.float32(a), np.float32(b), exact, dtype)


def _np_attention_vjp(q, k, v, d_out):
  """softmax(q k^T / sqrt(d)) v and its gradients, in numpy float64, written from the formulas."""
  scale = 1.0 / np.sqrt(q.shape[-1])
  logits = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  d_weights = np.einsum("bhqd,bhkd->bhqk", d_out, v)
  d_logits = weights * (d_weights - np.sum(d_weights * weights, -1, keepdims=True))
  d_q = np.einsum("bhqk,bhkd->bhqd", d_logits, k) * scale
  d_k = np.einsum("bhqk,bhqd->bhkd", d_logits, q) * scale
  d_v = np.einsum("bhqk,bhqd->bhkd", weights, d_out)
  return np.einsum("bhqk,bhkd->bhqd", weights, v), (d_q, d_k, d_v)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_norm_equals_flax_and_its_backward_equals_autodiff(dtype):
  """The LayerNorm with a hand-written backward pass: flax's function, parameters and gradients."""
  from vit_jax.models.vit import LayerNorm

  x = (3.0 + 2.0 * jax.random.normal(jax.random.key(0), (2, 5, 48))).astype(dtype)
  ours = LayerNorm(dtype=dtype)
  reference = nn.LayerNorm(dtype=dtype)
  params = ours.init(jax.random.key(1), x)["params"]
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(
    jnp.shape, reference.init(jax.random.key(1), x)["params"]
  )
  params = {
    "scale": 1.0 + jax.random.normal(jax.random.key(2), (48,)),
    "bias": jax.random.normal(jax.random.key(3), (48,)),
  }
  cotangent = jax.random.normal(jax.random.key(4), x.shape).astype(dtype)

  def vjp(module):
    out, pullback = jax.vjp(lambda p, x: module.apply({"params": p}, x), params, x)
    return out, pullback(cotangent)

  (out, (d_params, d_x)), (ref_out, (ref_d_params, ref_d_x)) = vjp(ours), vjp(reference)
  assert out.dtype == d_x.dtype == dtype and d_params["scale"].dtype == jnp.float32
  # The exact values in float64, from the formulas (epsilon 1e-6, flax's).
  x64, g64 = np.float64(np.float32(x)), np.float64(np.float32(cotangent))
  mean, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
  x_hat = (x64 - mean) / np.sqrt(var + 1e-6)
  scale64, bias64 = np.float64(params["scale"]), np.float64(params["bias"])
  d_x_hat = g64 * scale64
  exact_d_x = (
    d_x_hat - d_x_hat.mean(-1, keepdims=True) - x_hat * (d_x_hat * x_hat).mean(-1, keepdims=True)
  ) / np.sqrt(var + 1e-6)
  _assert_as_accurate(np.float32(out), np.float32(ref_out), x_hat * scale64 + bias64, dtype)
  _assert_as_accurate(np.float32(d_x), np.float32(ref_d_x), exact_d_x, dtype)
  for name, exact in (("scale", (g64 * x_hat).sum((0, 1))), ("bias", g64.sum((0, 1)))):
    _assert_as_accurate(d_params[name], ref_d_params[name], exact, dtype)


def test_tanh_gelu_is_flax_gelu_and_its_backward_a_gradient():
  """The tanh GELU, forward and backward, as accurate as flax's GELU and its autodiff, measured
  against the formula in float64 (central differences for the derivative), in float32 and
  bfloat16. In a child compiled as users' programs are (tests/helpers/xla_env.py): the suite's
  legacy fusion emitters compute tanh less accurately (measured: the gradient's error 1.9e-5
  there, for flax's GELU as for ours)."""
  code = (
    "import sys; from tests import test_models as t; [t.check_tanh_gelu(d) for d in sys.argv[1:]]"
  )
  proc = subprocess.run(
    [sys.executable, "-c", code, "float32", "bfloat16"],
    cwd=pathlib.Path(__file__).parents[1],
    env=xla_env.child_env(optimize=True, JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]


def check_tanh_gelu(dtype: str):
  from vit_jax.models.ops import gelu_tanh

  dtype = jnp.dtype(dtype)

  x = (4.0 * jax.random.normal(jax.random.key(0), (64, 33))).astype(dtype)
  cotangent = jax.random.normal(jax.random.key(1), x.shape).astype(dtype)
  out, pullback = jax.vjp(gelu_tanh, x)
  ref_out, ref_pullback = jax.vjp(lambda x: nn.gelu(x, approximate=True), x)
  (d_x,), (ref_d_x,) = pullback(cotangent), ref_pullback(cotangent)
  assert out.dtype == d_x.dtype == dtype

  def gelu64(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))

  x64, h = np.float64(np.float32(x)), 1e-5
  _assert_as_accurate(np.float32(out), np.float32(ref_out), gelu64(x64), dtype)
  assert _max_error(np.float32(out), gelu64(x64)) < (1e-5 if dtype == jnp.float32 else 5e-2)
  exact = np.float64(np.float32(cotangent)) * (gelu64(x64 + h) - gelu64(x64 - h)) / (2 * h)
  ours_error = np.max(np.abs(np.float32(d_x) - exact))
  autodiff_error = np.max(np.abs(np.float32(ref_d_x) - exact))
  assert ours_error <= max(autodiff_error, 1e-6 if dtype == jnp.float32 else 1e-2)
  assert ours_error < (1e-5 if dtype == jnp.float32 else 5e-2)


def test_attention_matches_flax_reference():
  """Our fused attention equals Flax's own MultiHeadDotProductAttention on the same params."""
  from vit_jax.models.vit import MultiHeadDotProductAttention

  x = jax.random.normal(jax.random.key(0), (2, 9, 32))
  ours = MultiHeadDotProductAttention(num_heads=4)
  params = ours.init(jax.random.key(1), x, True)["params"]
  params = _randomize(params, scale=0.3)
  reference = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=32, out_features=32)
  with jax.enable_x64(True):  # flax's module in float64: the exact value
    exact = reference.clone(dtype=jnp.float64, param_dtype=jnp.float64).apply(
      {"params": jax.tree.map(lambda a: np.asarray(a, np.float64), params)},
      *(np.asarray(x, np.float64),) * 2,
      deterministic=True,
    )
    exact = np.asarray(exact)
  _assert_as_accurate(
    ours.apply({"params": params}, x, True),
    reference.apply({"params": params}, x, x, deterministic=True),
    exact,
  )


def test_attention_kernel_auto_is_xla_off_gpu_and_cudnn_refuses_clearly():
  assert models.get_model_config("testing").attention_kernel == "auto"
  xla = models.get_model("testing", num_classes=4, attention_kernel="xla")
  auto = models.get_model("testing", num_classes=4, dtype="bfloat16")
  params, images = _init(xla)
  assert jax.tree.structure(params) == jax.tree.structure(_init(auto)[0])
  params = _randomize(params)
  bf16_xla = xla.clone(dtype=jnp.bfloat16)
  # On this (CPU) backend 'auto' is the XLA path, bit for bit, in bf16 too.
  np.testing.assert_array_equal(_apply(auto, params, images), _apply(bf16_xla, params, images))
  cudnn = models.get_model("testing", num_classes=4, attention_kernel="cudnn")
  with pytest.raises(ValueError, match="attention_kernel='cudnn' needs an NVIDIA GPU.*'cpu'"):
    _apply(cudnn, params, images)
  with pytest.raises(ValueError, match="attention_kernel='flash'; expected one of"):
    _apply(xla.clone(attention_kernel="flash"), params, images)


def test_fused_attention_branch_layout(monkeypatch):
  """The cuDNN branch's plumbing ([batch, tokens, heads, head_dim]; 65 tokens, so padded to 66
  with the pad key masked), run through jax's XLA attention (cuDNN needs a GPU): same logits and
  gradients as the heads-major XLA path."""
  from vit_jax.models import ops

  model = models.get_model("testing", num_classes=4)
  params, images = _init(model)
  params = _randomize(params, scale=0.3)

  def loss_and_grads(model=model, params=params, images=images):
    def loss(p):
      return jnp.sum(jnp.sin(model.apply({"params": p}, images, train=False)[0]))

    return jax.jit(jax.value_and_grad(loss))(params)

  reference = loss_and_grads()
  with jax.enable_x64(True):
    exact = loss_and_grads(
      model.clone(dtype=jnp.float64, param_dtype=jnp.float64, attention_kernel="xla"),
      jax.tree.map(lambda a: np.asarray(a, np.float64), params),
      np.asarray(images, np.float64),
    )
    exact = jax.tree.map(np.asarray, exact)
  calls = []

  fused = ops.cudnn_attention

  def spy(q, k, v):
    calls.append(q.shape)
    return fused(q, k, v)

  monkeypatch.setattr(ops, "attention_path", lambda *a: "cudnn")
  monkeypatch.setattr(ops, "cudnn_attention", spy)
  monkeypatch.setattr(ops, "FUSED_IMPLEMENTATION", "xla")
  fused_result = loss_and_grads()
  assert calls == [(2, 65, 2, 16)] * 2  # both layers; [batch, tokens, heads, head_dim]
  # jax's attention is another float32 algorithm than the heads-major path (its own softmax):
  # their errors differ by a factor that depends on the compilation (3.2x at XLA's level 0:
  # 9.1e-6 against 2.9e-6 for a loss of size ~1), hence a floor of 16 ulps; a layout or padding
  # mistake moves them by their own size (the heads of k reversed: an error of 0.41).
  _assert_trees_as_accurate(fused_result, reference, exact, ulps=16)
  # Sowing the weights (analysis) keeps the XLA path, which has them.
  _, state = _apply(model, params, images, mutable=["intermediates"])
  assert len(calls) == 2 and "intermediates" in state


def test_sown_attention_weights_and_same_logits():
  model = models.get_model("testing", num_classes=4)
  params, images = _init(model)
  params = _randomize(params)
  fused = _apply(model, params, images)
  logits, state = _apply(model, params, images, mutable=["intermediates"])
  _assert_as_accurate(logits, fused, _apply64(model, params, images))
  weights = state["intermediates"]["Transformer"]["encoderblock_1"][
    "MultiHeadDotProductAttention_1"
  ]["attention_weights"][0]
  assert weights.shape == (2, 2, 65, 65)  # [batch, heads, queries, keys]: 8x8 patches + class
  # Each row sums to 1 up to the float32 rounding of a softmax and of a 65-term sum.
  np.testing.assert_allclose(np.float64(weights).sum(-1), 1.0, rtol=0, atol=2 * 65 * _EPS32)


def test_scan_matches_unrolled_layers():
  unrolled = models.get_model("testing", num_classes=4)
  scanned = models.get_model("testing", num_classes=4, scan=True, remat=True)
  params, images = _init(unrolled)
  params = _randomize(params)
  stacked = checkpoint.stack_encoder_blocks(params)
  assert jax.tree.structure(stacked) == jax.tree.structure(_init(scanned)[0])
  _assert_as_accurate(
    _apply(scanned, stacked, images),
    _apply(unrolled, params, images),
    _apply64(unrolled, params, images),
  )
  # Attention weights are sown per layer under scan too, stacked on a leading axis.
  _, state = _apply(scanned, stacked, images, mutable=["intermediates"])
  weights = state["intermediates"]["Transformer"]["encoderblock"]["MultiHeadDotProductAttention_1"][
    "attention_weights"
  ][0]
  assert weights.shape == (2, 2, 2, 65, 65)


def test_remat_gives_the_same_gradients():
  """Remat recomputes the forward pass, dropout masks included, inside the backward one."""
  plain = models.get_model("testing", num_classes=4, dropout_rate=0.1)
  params, images = _init(plain)
  params = _randomize(params)
  rngs = {"dropout": jax.random.key(5)}

  def grads(model, p, x=images):
    def loss(p):
      return jnp.sum(model.apply({"params": p}, x, train=True, rngs=rngs)[0] ** 2)

    return jax.jit(jax.grad(loss))(p)

  # Without dropout both are measured against float64 (where dropout would draw other masks).
  no_dropout = plain.clone(dropout_rate=0.0)
  with jax.enable_x64(True):
    exact = grads(
      no_dropout.clone(dtype=jnp.float64, param_dtype=jnp.float64),
      jax.tree.map(lambda a: np.asarray(a, np.float64), params),
      np.asarray(images, np.float64),
    )
    exact = jax.tree.map(np.asarray, exact)  # numpy float64: jax would truncate it outside x64
  g_plain = grads(no_dropout, params)
  _assert_trees_as_accurate(grads(no_dropout.clone(remat=True), params), g_plain, exact)
  # With dropout, remat and plain agree to what the plain path's float32 error allows; another
  # mask in the recomputation would change the gradients by far more.
  with_dropout = grads(plain, params), grads(plain.clone(remat=True), params)
  for got, want, ref, ex in zip(
    *map(jax.tree.leaves, (*with_dropout, g_plain, exact)), strict=True
  ):
    tol = 4 * _max_error(ref, ex) + 8 * _EPS32 * float(np.abs(ex).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
  changed = jax.tree.map(lambda a, b: np.abs(a - b).max(), with_dropout[0], g_plain)
  assert max(jax.tree.leaves(changed)) > 1e-3  # the dropout case differs: masks were applied


def test_dropout_only_in_training():
  model = models.get_model("testing", num_classes=4, dropout_rate=0.3, attention_dropout_rate=0.3)
  params, images = _init(model)
  params = _randomize(params)
  ev1 = _apply(model, params, images)
  ev2 = _apply(model, params, images)
  np.testing.assert_array_equal(ev1, ev2)
  train_apply = jax.jit(
    lambda p, x, k: model.apply({"params": p}, x, train=True, rngs={"dropout": k})[0]
  )
  tr = lambda seed: train_apply(params, images, jax.random.key(seed))  # noqa: E731
  np.testing.assert_array_equal(tr(1), tr(1))
  assert not np.allclose(tr(1), tr(2))
  assert not np.allclose(tr(1), ev1)


def test_bfloat16_computation_keeps_float32_params():
  fp32 = models.get_model("testing", num_classes=4)
  bf16 = models.get_model("testing", num_classes=4, dtype="bfloat16")
  params, images = _init(bf16)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  params = _randomize(params)
  out16 = _apply(bf16, params, images)
  out32 = _apply(fp32, params, images)
  assert out16.dtype == jnp.float32
  np.testing.assert_allclose(out16, out32, atol=0.05 * np.abs(out32).max())
  assert not np.array_equal(out16, out32)  # really computed in bf16


def test_unknown_names_are_clear_errors():
  with pytest.raises(KeyError, match="ViT-X_16"):
    models.get_model("ViT-X_16", num_classes=10)
  with pytest.raises(TypeError, match="hiden_size"):
    models.get_model("B/16", num_classes=10, hiden_size=3)
  with pytest.raises(ValueError, match="classifier"):
    _init(models.get_model("testing", num_classes=2, classifier="tok"))


def test_aliases_and_config_input():
  assert models.resolve_name("B/16") == "ViT-B_16"
  assert models.resolve_name("R50+B/16") == "R50+ViT-B_16"
  config = models.get_model_config("testing")
  config.image_size = 32  # read by checkpoint.load_pretrained, not a module field
  model = models.get_model(config, num_classes=2, dropout_rate=0.1)
  assert model.dropout_rate == 0.1 and model.hidden_size == 32


def test_exact_gelu_option_keeps_the_parameters_and_changes_only_the_activation():
  from vit_jax.models.vit import MlpBlock

  assert models.get_model_config("testing").gelu_approximate  # the published weights' tanh GELU
  tanh = models.get_model("testing", num_classes=4)
  exact = models.get_model("testing", num_classes=4, gelu_approximate=False)
  params, images = _init(tanh)
  assert jax.tree.structure(params) == jax.tree.structure(_init(exact)[0])
  params = _randomize(params, scale=0.5)
  diff = np.abs(_apply(exact, params, images) - _apply(tanh, params, images)).max()
  assert 1e-6 < diff < 0.05  # the two GELUs differ by at most ~5e-4 per unit
  # The MLP alone computes Dense_1(erf-GELU(Dense_0(x))).
  x = jax.random.normal(jax.random.key(2), (2, 5, 8))
  mlp = MlpBlock(mlp_dim=16, gelu_approximate=False)
  p = _randomize(mlp.init(jax.random.key(0), x, True)["params"], scale=0.5)

  def by_hand(x, p, erf):
    h = x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"]
    h = 0.5 * h * (1.0 + erf(h / np.sqrt(2.0)))
    return h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]

  import scipy.special

  exact = by_hand(np.float64(x), jax.tree.map(np.float64, p), scipy.special.erf)
  _assert_as_accurate(
    mlp.apply({"params": p}, x, True), by_hand(x, p, jax.scipy.special.erf), exact
  )


# ---------------------------------------------------------------------------------------------
# BiT ResNets (vit_jax.models.bit).


def _tiny_bit(num_classes=4, **overrides):
  """A two-block BiT of base width 32: the R26x1 preset cut to (1, 2) units."""
  return models.get_model("R26x1", num_classes, block_units=(1, 2), **overrides)


@pytest.fixture(scope="module")
def tiny_bit():
  """(model, fresh params, random params, images [2, 18, 18, 3]); compiled once per module."""
  model = _tiny_bit()
  # 18px: odd feature maps after the root (9, then 5 after the pool), so padding matters.
  images = np.random.default_rng(1).uniform(-1, 1, (2, 18, 18, 3)).astype(np.float32)
  # Random values drawn on the host: jitting the initialisers costs more than the tests.
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), images)
  rng = np.random.default_rng(0)

  def draw(path, leaf):
    noise = 0.3 * rng.standard_normal(leaf.shape).astype(np.float32)
    return noise + (1.0 if "gamma" in jax.tree_util.keystr(path) else 0.0)

  params = jax.tree_util.tree_map_with_path(draw, shapes["params"])
  fresh = dict(params, head=jax.tree.map(np.zeros_like, params["head"]))
  return model, fresh, params, images


def test_bit_published_layout_r50x1():
  flat = {k: v.shape for k, v in _flatten(_param_shapes(models.get_model("R50x1", 1000))).items()}
  assert flat["root_block/standardized_conv2d/kernel"] == (7, 7, 3, 64)
  unit = "block1/unit01/"
  assert flat[unit + "a/group_norm/gamma"] == (64,)  # pre-activation: the unit's input width
  assert flat[unit + "a/standardized_conv2d/kernel"] == (1, 1, 64, 64)
  assert flat[unit + "a/proj/standardized_conv2d/kernel"] == (1, 1, 64, 256)
  assert flat[unit + "b/standardized_conv2d/kernel"] == (3, 3, 64, 64)
  assert flat[unit + "c/group_norm/beta"] == (64,)
  assert flat[unit + "c/standardized_conv2d/kernel"] == (1, 1, 64, 256)
  assert flat["block2/unit01/a/group_norm/gamma"] == (256,)
  assert flat["block2/unit01/a/proj/standardized_conv2d/kernel"] == (1, 1, 256, 512)
  assert flat["block3/unit06/c/standardized_conv2d/kernel"] == (1, 1, 256, 1024)
  assert flat["block4/unit03/b/standardized_conv2d/kernel"] == (3, 3, 512, 512)
  assert flat["group_norm/gamma"] == (2048,)
  assert flat["head/conv2d/kernel"] == (1, 1, 2048, 1000)
  assert flat["head/conv2d/bias"] == (1000,)
  # Only a block's first unit changes width or stride, so only it has a projection.
  assert [k for k in flat if "/proj/" in k] == [
    f"block{b}/unit01/a/proj/standardized_conv2d/kernel" for b in (1, 2, 3, 4)
  ]
  assert "block4/unit04/a/group_norm/gamma" not in flat


def test_bit_representation_shapes():
  model = models.get_model("R26x1", num_classes=None)
  for size in (32, 64, 224):  # downsampled by 32 (and padded), then pooled
    images = jax.ShapeDtypeStruct((2, size, size, 3), jnp.float32)
    shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), images)
    rep, _ = jax.eval_shape(lambda v, x: model.apply(v, x, train=False), shapes, images)
    assert rep.shape == (2, 4 * 32 * 8) and rep.dtype == jnp.float32


def test_bit_fresh_head_is_zero_and_representation(tiny_bit):
  model, fresh, params, images = tiny_bit
  np.testing.assert_array_equal(_apply(model, fresh, images), 0.0)
  rep = _apply(model, params, images, "pre_logits")
  assert rep.shape == (2, 4 * 32 * 2)
  assert np.all(rep >= 0)  # GroupNorm → ReLU → average pool
  head = params["head"]["conv2d"]
  kernel, bias = np.float64(head["kernel"][0, 0]), np.float64(head["bias"])
  rep64 = np.float64(rep)
  # The float32 rounding bound of a 256-term dot product plus a bias.
  bound = 257 * _EPS32 * (np.abs(rep64) @ np.abs(kernel) + np.abs(bias))
  assert np.all(np.abs(_apply(model, params, images) - (rep64 @ kernel + bias)) <= bound)

  head = bit._Head(3).init(jax.random.key(0), jnp.zeros((1, 8)))["params"]["conv2d"]
  assert not np.any(head["kernel"]) and not np.any(head["bias"])  # the fresh head is zero
  biased = bit._Head(3, bias_init=-10.0).init(jax.random.key(0), jnp.zeros((1, 8)))
  np.testing.assert_array_equal(biased["params"]["conv2d"]["bias"], -10.0)


def _np_reference_bit(params, images, block_units, eps_ws=1e-10, eps_gn=1e-5):
  """A plain numpy BiT forward pass written from the paper and the BiT code, not vit_jax.models.bit; in
  the dtype of `images` and `params` (float64: the exact value, float32: the plain path)."""

  def conv(x, kernel, stride):
    kernel = kernel - kernel.mean(axis=(0, 1, 2))
    kernel = kernel / np.sqrt((kernel**2).mean(axis=(0, 1, 2)) + eps_ws)
    k = kernel.shape[0]
    lo = (k - 1) // 2
    x = np.pad(x, ((0, 0), (lo, k - 1 - lo), (lo, k - 1 - lo), (0, 0)))
    out_h = (x.shape[1] - k) // stride + 1
    out_w = (x.shape[2] - k) // stride + 1
    out = np.zeros((x.shape[0], out_h, out_w, kernel.shape[-1]), x.dtype)
    for i in range(k):
      for j in range(k):
        patch = x[:, i : i + stride * out_h : stride, j : j + stride * out_w : stride]
        out += patch @ kernel[i, j]
    return out

  def gn_relu(x, p):
    b, h, w, c = x.shape
    g = x.reshape(b, h, w, 32, c // 32)
    g = (g - g.mean(axis=(1, 2, 4), keepdims=True)) / np.sqrt(
      g.var(axis=(1, 2, 4), keepdims=True) + eps_gn
    )
    return np.maximum(g.reshape(x.shape) * p["gamma"] + p["beta"], 0)

  x = conv(images, params["root_block"]["standardized_conv2d"]["kernel"], 2)
  x = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))  # zeros, then a 3x3/2 max-pool
  h, w = (x.shape[1] - 3) // 2 + 1, (x.shape[2] - 3) // 2 + 1
  x = np.max(
    [x[:, i : i + 2 * h : 2, j : j + 2 * w : 2] for i in range(3) for j in range(3)], axis=0
  )
  for b, units in enumerate(block_units):
    for u in range(units):
      p = params[f"block{b + 1}"][f"unit{u + 1:02d}"]
      stride = 2 if b > 0 and u == 0 else 1
      pre = gn_relu(x, p["a"]["group_norm"])
      shortcut = x
      if "proj" in p["a"]:
        shortcut = conv(pre, p["a"]["proj"]["standardized_conv2d"]["kernel"], stride)
      y = conv(pre, p["a"]["standardized_conv2d"]["kernel"], 1)
      y = conv(gn_relu(y, p["b"]["group_norm"]), p["b"]["standardized_conv2d"]["kernel"], stride)
      y = conv(gn_relu(y, p["c"]["group_norm"]), p["c"]["standardized_conv2d"]["kernel"], 1)
      x = y + shortcut
  rep = gn_relu(x, params["group_norm"]).mean(axis=(1, 2))
  return rep @ params["head"]["conv2d"]["kernel"][0, 0] + params["head"]["conv2d"]["bias"]


def test_bit_matches_a_numpy_reference(tiny_bit):
  model, _, params, images = tiny_bit
  ours = _apply(model, params, images)
  exact = _np_bit64(params, images)
  assert np.abs(exact).max() > 0.1
  plain = _np_reference_bit(jax.tree.map(np.float32, params), np.float32(images), (1, 2))
  assert plain.dtype == np.float32
  _assert_as_accurate(ours, plain, exact)


def _np_bit64(params, images):
  as64 = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  return _np_reference_bit(as64, np.asarray(images, np.float64), (1, 2))


def test_bit_weight_standardisation_and_bf16(tiny_bit):
  model, _, params, images = tiny_bit
  logits = _apply(model, params, images)
  scaled = jax.tree.map(lambda x: x, params)
  conv = scaled["block2"]["unit01"]["b"]["standardized_conv2d"]
  conv["kernel"] = conv["kernel"] * 3.0 + 1.0  # standardisation removes scale and offset
  # As accurate as the unchanged kernel's logits (their float32 error, against float64).
  _assert_as_accurate(_apply(model, scaled, images), logits, _np_bit64(params, images))
  out16 = _apply(_tiny_bit(dtype="bfloat16"), params, images)
  assert out16.dtype == jnp.float32 and not np.array_equal(out16, logits)
  np.testing.assert_allclose(out16, logits, atol=0.05 * np.abs(logits).max())


def test_bit_config_errors_and_overrides():
  with pytest.raises(TypeError, match="dropout_rate"):
    models.get_model("R50x1", 10, dropout_rate=0.1)  # a ViT field
  with pytest.raises(ValueError, match="48 channels do not split into 32 groups"):
    images = jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32)
    model = models.get_model("R26x1", 2, base_width=48)
    jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), images)
  config = models.get_model_config("R50x3")
  assert models.is_bit(config) and not models.is_bit(models.get_model_config("B/16"))
  assert models.known_overrides(config, dropout_rate=0.0, dtype="bfloat16") == {"dtype": "bfloat16"}
  model = models.get_model(config, 10)
  assert model.width_factor == 3 and tuple(model.block_units) == (3, 4, 6, 3)
