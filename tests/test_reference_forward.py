"""The whole ViT against an independent float64 numpy forward pass (tests/helpers/numpy_vit.py).

test_models.py measures the float32 model against the same Flax model run in float64, which
checks rounding but not structure: a wrong block order, a missing residual, the position
embedding added in the wrong place, a missing final LayerNorm or a misplaced class token would be
in both. Here the reference is written from the paper's equations (§3.1, Eq. 1-4) and the ResNet
of the hybrids in plain numpy, reading only the parameter tree, so it shares no code with
vit_jax. Small random models (the 'testing' preset: class token, 'gap', a pre-logits layer, and an
R50-style hybrid), with every parameter random (the model initialises the head, the class token
and each unit's last GroupNorm scale to zero, which would hide them), are held to it:

- float32 Flax logits within `FLOAT32_TOLERANCE` of the reference, both on the path the model
  takes in this 8-device test process ('auto': XLA) and on the one a one-device CPU takes
  ('auto': the C++ attention and LayerNorm kernels of vit_jax/kernels/cpu.py);
- float64 Flax logits within `FLOAT64_TOLERANCE`: the sharp check that the two are one function;
- a reference fed a broken model (two blocks swapped, no position embedding, ...) fails both, by
  far: the comparisons are not vacuous.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import numpy_vit
from vit_jax import models
from vit_jax.kernels import cpu as cpu_kernels
from vit_jax.models import ops

_EPS32 = float(np.finfo(np.float32).eps)
# Errors are relative to max |reference logit|. A float32 forward pass rounds each activation
# once per operation; LayerNorm keeps the residual stream at unit scale, so the error of a logit
# is a sum of O(eps) relative errors over the operations on its path (two blocks of matmuls of
# at most 64 terms, softmax, GELU, two LayerNorms per block and the final one, the head): a few
# tens of eps in the worst case; measured 1.2-8.7 eps (at most 1.0e-6), XLA and the C++ kernels
# alike. 300 eps is generous for any correct float32 evaluation, and still far below what a
# structural mistake does: the mutations below move the logits by 0.3-1.5 of their scale, the
# subtlest (the exact GELU for the tanh one) by 4e-4, ~10x the bound.
FLOAT32_TOLERANCE = 300 * _EPS32
# The same reasoning in float64 (eps 2.2e-16) gives ~1e-13, measured at most 1.8e-15; 1e-10
# leaves a wide margin for the ResNet's longer path and is still ~1000x below float32 rounding:
# nothing but the same function (up to float64 rounding) agrees so closely.
FLOAT64_TOLERANCE = 1e-10

_NUM_CLASSES = 5
# name -> (overrides of the 'testing' preset, image height and width). Non-square images, so a
# transposed patch grid cannot pass; the hybrid's stages (2 units, then 1) have units with and
# without a projection, a strided stage, and odd 'SAME' paddings.
_CASES = {
  "token": (dict(), (16, 24)),
  "gap": (dict(classifier="gap"), (16, 24)),
  "pre_logits": (dict(representation_size=16), (16, 24)),
  "hybrid": (dict(patch_size=1, resnet=dict(num_layers=(2, 1), width_factor=0.5)), (32, 24)),
}


def _relative_error(got, want) -> float:
  """max |got - want| / max |want| (float64)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.abs(got - want).max() / np.abs(want).max())


@functools.cache
def _case(name):
  """(float32 model, perturbed float32 params as numpy, float32 images, reference logits)."""
  overrides, (height, width) = _CASES[name]
  model = models.get_model("testing", num_classes=_NUM_CLASSES, **overrides)
  rng = np.random.default_rng(1)
  images = rng.uniform(-1.0, 1.0, (2, height, width, 3)).astype(np.float32)
  # The tree's names and shapes from the model's init, traced but not run (compiling the random
  # initialisers costs ~10 s of CPU for the hybrid); the values, the init's mean (ones for the
  # norms' scales, zeros elsewhere) plus N(0, 0.3^2) noise, so that no parameter is zero (the
  # head, the class token, the last GroupNorm of each unit) and none at a symmetric point.
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), images)

  def value(path, leaf):
    mean = np.float32(path[-1].key == "scale")
    return mean + np.float32(0.3) * rng.standard_normal(leaf.shape, np.float32)

  params = jax.tree_util.tree_map_with_path(value, shapes["params"])
  reference = numpy_vit.forward(params, images)
  assert reference.shape == (2, _NUM_CLASSES) and reference.dtype == np.float64
  return model, params, images, reference


def _float32_logits(name):
  """The float32 model's logits, traced now: under the kernels this process's devices select."""
  model, params, images, _ = _case(name)
  logits = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False)[0])(params, images)
  assert logits.dtype == jnp.float32
  return np.asarray(logits)


_float32_auto_logits = functools.cache(_float32_logits)  # on this 8-device process: XLA


@functools.cache
def _float64_logits(name):
  model, params, images, _ = _case(name)
  with jax.enable_x64(True):
    model64 = model.clone(dtype=jnp.float64, param_dtype=jnp.float64)
    params64 = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    fn = jax.jit(lambda p, x: model64.apply({"params": p}, x, train=False)[0])
    logits = fn(params64, np.asarray(images, np.float64))
    assert logits.dtype == jnp.float64
    return np.asarray(logits)


def test_the_cases_cover_each_variant():
  """The parameter trees are what the case names say (the reference reads them off the tree)."""
  trees = {name: _case(name)[1] for name in _CASES}
  assert "cls" in trees["token"] and "cls" not in trees["gap"]
  assert "pre_logits" in trees["pre_logits"] and "pre_logits" not in trees["token"]
  hybrid = trees["hybrid"]
  assert "conv_root" in hybrid and "conv_root" not in trees["token"]
  assert "conv_proj" in hybrid["block1"]["unit1"] and "conv_proj" not in hybrid["block1"]["unit2"]
  assert hybrid["embedding"]["kernel"].shape[:2] == (1, 1)  # 1x1 patches of the feature map
  # A 32x24 image: /2 (root conv), /2 (pool), /2 (second stage) -> 4x3 tokens and the class one.
  assert hybrid["Transformer"]["posembed_input"]["pos_embedding"].shape[1] == 4 * 3 + 1
  assert not np.any(_case("token")[1]["head"]["kernel"] == 0)  # moved off the zero init


@pytest.mark.parametrize("path", ["auto", "auto_one_device"])
@pytest.mark.parametrize("name", list(_CASES))
def test_float32_model_matches_numpy_reference(name, path, monkeypatch):
  """float32 logits within float32's error of the reference, on XLA ('auto' in this 8-device
  process, the same program as an `attention_kernel='xla', layer_norm_kernel='xla'` clone) and on
  the C++ kernels ('auto' on a one-device CPU)."""
  model, _, _, reference = _case(name)
  head_dim = model.hidden_size // model.num_heads
  if path == "auto_one_device":
    reason = cpu_kernels.unavailable_reason()
    if reason:
      pytest.skip(f"the C++ kernels are unavailable: {reason} (test_cpu_kernels fails on it)")
    monkeypatch.setattr(ops.jax, "device_count", lambda: 1)
  want = "cpu" if path == "auto_one_device" else "xla"
  assert (model.attention_kernel, model.layer_norm_kernel) == ("auto", "auto")
  assert ops.attention_path("auto", jnp.float32, head_dim) == want
  assert ops.use_cpu_kernel("layer_norm_kernel", "auto", jnp.float32) == (want == "cpu")
  logits = _float32_auto_logits(name) if path == "auto" else _float32_logits(name)
  error = _relative_error(logits, reference)
  assert error <= FLOAT32_TOLERANCE, (name, path, error)


@pytest.mark.parametrize("name", list(_CASES))
def test_float64_model_matches_numpy_reference(name):
  """The float64 Flax model (XLA) and the float64 reference are one function."""
  error = _relative_error(_float64_logits(name), _case(name)[3])
  assert error <= FLOAT64_TOLERANCE, (name, error)


def _swap(tree, a, b):
  tree[a], tree[b] = tree[b], tree[a]


def _blocks_swapped(p, monkeypatch):
  _swap(p["Transformer"], "encoderblock_0", "encoderblock_1")


def _no_position_embedding(p, monkeypatch):
  embedding = p["Transformer"]["posembed_input"]
  embedding["pos_embedding"] = np.zeros_like(embedding["pos_embedding"])


def _layer_norms_swapped(p, monkeypatch):
  _swap(p["Transformer"]["encoderblock_0"], "LayerNorm_0", "LayerNorm_2")


def _query_key_swapped(p, monkeypatch):
  _swap(p["Transformer"]["encoderblock_1"]["MultiHeadDotProductAttention_1"], "query", "key")


def _class_token_zeroed(p, monkeypatch):
  p["cls"] = np.zeros_like(p["cls"])


def _no_final_norm(p, monkeypatch):
  norm = p["Transformer"]["encoder_norm"]
  norm["scale"], norm["bias"] = np.ones_like(norm["scale"]), np.zeros_like(norm["bias"])


def _exact_gelu(p, monkeypatch):
  gelu = numpy_vit.gelu
  monkeypatch.setattr(numpy_vit, "gelu", lambda x, approximate=True: gelu(x, approximate=False))


def _group_norms_swapped(p, monkeypatch):
  _swap(p["block1"]["unit2"], "gn1", "gn2")


def _padding_first(p, monkeypatch):
  same = numpy_vit._same_padding
  monkeypatch.setattr(numpy_vit, "_same_padding", lambda *a: same(*a)[::-1])


# name -> (case, the change to the reference's parameters or to the reference itself).
_MUTATIONS = {
  "blocks_swapped": ("token", _blocks_swapped),
  "no_position_embedding": ("token", _no_position_embedding),
  "layer_norms_swapped": ("token", _layer_norms_swapped),
  "query_key_swapped": ("token", _query_key_swapped),
  "class_token_zeroed": ("token", _class_token_zeroed),
  "no_final_norm": ("gap", _no_final_norm),
  "exact_gelu": ("pre_logits", _exact_gelu),  # the smallest change here: ~10x the float32 bound
  "hybrid_group_norms_swapped": ("hybrid", _group_norms_swapped),
  "hybrid_odd_padding_first": ("hybrid", _padding_first),  # 'SAME' pads the odd pixel last
}


@pytest.mark.parametrize("mutation", list(_MUTATIONS))
def test_a_broken_reference_fails_both_comparisons(mutation, monkeypatch):
  """The reference of a slightly different model is outside both tolerances, so the comparisons
  above can fail: each mutation is a mistake an implementation could make."""
  name, mutate = _MUTATIONS[mutation]
  _, params, images, reference = _case(name)
  broken = numpy_vit.as_float64(params)
  mutate(broken, monkeypatch)
  broken = numpy_vit.forward(broken, images)
  float32_error = _relative_error(_float32_auto_logits(name), broken)
  float64_error = _relative_error(_float64_logits(name), broken)
  assert float32_error > 2 * FLOAT32_TOLERANCE, (mutation, float32_error)
  assert float64_error > 1e4 * FLOAT64_TOLERANCE, (mutation, float64_error)
