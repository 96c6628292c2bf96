"""Which parameters are weight-decayed (by name, the same with scan on and off); gradient clipping."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from vit_jax import models, sharding
from vit_jax.train import optim


def _decayed_names(scan: bool, name: str = "B/16") -> tuple[set[str], set[str]]:
  model = models.get_model(name, num_classes=1000, scan=scan)
  params = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, 224, 224, 3)), train=False)["params"]
  )
  mask = optim.decay_mask(params)
  decayed, kept = set(), set()
  for path, flag in jax.tree_util.tree_leaves_with_path(mask):
    # Without scan each block has its own index; with scan one stacked block stands for all.
    key = re.sub(r"encoderblock(_\d+)?/", "encoderblock/", sharding.path_name(path))
    (decayed if flag else kept).add(key)
  return decayed, kept


def test_vit_b16_decays_kernels_only_with_and_without_scan():
  decayed, kept = _decayed_names(scan=False)
  assert (decayed, kept) == _decayed_names(scan=True)
  assert decayed == {
    "embedding/kernel",
    "Transformer/encoderblock/MultiHeadDotProductAttention_1/query/kernel",
    "Transformer/encoderblock/MultiHeadDotProductAttention_1/key/kernel",
    "Transformer/encoderblock/MultiHeadDotProductAttention_1/value/kernel",
    "Transformer/encoderblock/MultiHeadDotProductAttention_1/out/kernel",
    "Transformer/encoderblock/MlpBlock_3/Dense_0/kernel",
    "Transformer/encoderblock/MlpBlock_3/Dense_1/kernel",
    "head/kernel",
  }
  # Rank >= 2 but not decayed: the class token, position embeddings and the q/k/v biases.
  for name in (
    "cls",
    "Transformer/posembed_input/pos_embedding",
    "Transformer/encoderblock/MultiHeadDotProductAttention_1/query/bias",
    "Transformer/encoderblock/LayerNorm_0/scale",
    "Transformer/encoder_norm/bias",
  ):
    assert name in kept


def test_decay_patterns_config_field_is_applied():
  params = {
    "cls": np.ones((1, 1, 4), np.float32),
    "Dense_0": {"kernel": np.ones((4, 4), np.float32), "bias": np.ones(4, np.float32)},
  }
  grads = jax.tree_util.tree_map(np.zeros_like, params)

  def updates(**fields):
    config = ml_collections.ConfigDict(dict(name="sgd", momentum=0.0, weight_decay=0.1, **fields))
    tx = optim.make_optimizer(config, optax.constant_schedule(1.0), grad_clip_norm=None)
    return tx.update(grads, tx.init(params), params)[0]

  default = updates()
  np.testing.assert_allclose(default["Dense_0"]["kernel"], -0.1)
  np.testing.assert_allclose(default["Dense_0"]["bias"], 0.0)
  np.testing.assert_allclose(default["cls"], 0.0)
  custom = updates(decay_patterns=(r"^cls$", r"bias$"))
  np.testing.assert_allclose(custom["Dense_0"]["kernel"], 0.0)
  np.testing.assert_allclose(custom["Dense_0"]["bias"], -0.1)
  np.testing.assert_allclose(custom["cls"], -0.1)
  none = updates(decay_patterns=())
  assert all(np.all(u == 0) for u in jax.tree_util.tree_leaves(none))


def test_adam_first_moment_dtype():
  """optimizer.mu_dtype: bfloat16 narrows Adam's first moment (big_vision's recipes), float32
  keeps it in the parameters' dtype (float64 in a float64 run); the second moment stays there."""
  for params, mu_dtype, want in [
    ({"w": np.ones(3, np.float32)}, "bfloat16", jnp.bfloat16),
    ({"w": np.ones(3, np.float32)}, "float32", jnp.float32),
    ({"w": jax.ShapeDtypeStruct((3,), jnp.float64)}, "float32", jnp.float64),
  ]:
    config = ml_collections.ConfigDict(
      dict(name="adam", b1=0.9, b2=0.999, mu_dtype=mu_dtype, weight_decay=0.0)
    )
    tx = optim.make_optimizer(config, optax.constant_schedule(1.0), grad_clip_norm=None)
    with jax.enable_x64(want == jnp.float64):
      adam = jax.eval_shape(tx.init, params)[0]
    assert adam.mu["w"].dtype == want and adam.nu["w"].dtype == params["w"].dtype
  config.mu_dtype = "float16"
  with pytest.raises(ValueError, match=r"^optimizer.mu_dtype='float16'; expected"):
    optim.make_optimizer(config, optax.constant_schedule(1.0), grad_clip_norm=None)


def _sgd_updates(grads, clip):
  config = ml_collections.ConfigDict(dict(name="sgd", momentum=0.0, weight_decay=0.0))
  tx = optim.make_optimizer(config, optax.constant_schedule(1.0), grad_clip_norm=clip)
  params = jax.tree_util.tree_map(np.zeros_like, grads)
  return tx.update(grads, tx.init(params), params)[0]


def _global_norm(tree) -> float:
  return float(np.sqrt(sum(np.sum(np.float64(x) ** 2) for x in jax.tree_util.tree_leaves(tree))))


def test_gradient_clipping_scales_to_the_clip_norm_and_spares_small_gradients():
  rng = np.random.default_rng(0)
  grads = {
    "Dense_0": {"kernel": rng.normal(size=(4, 3)), "bias": rng.normal(size=3)},
    "cls": rng.normal(size=(1, 1, 4)),
  }
  grads = jax.tree_util.tree_map(lambda x: x.astype(np.float32), grads)
  norm = _global_norm(grads)
  assert norm > 2.0
  eps = float(np.finfo(np.float32).eps)
  # Above the threshold: the SGD update (lr 1) is -g scaled to the clip norm, one factor for all
  # leaves (the direction is kept).
  clipped = _sgd_updates(grads, clip=1.0)
  assert abs(_global_norm(clipped) - 1.0) <= 16 * eps
  leaves = jax.tree_util.tree_leaves(grads)
  for got, g in zip(jax.tree_util.tree_leaves(clipped), leaves, strict=True):
    np.testing.assert_allclose(got, -np.float64(g) / norm, rtol=16 * eps, atol=16 * eps / norm)
  # Below it (and with clipping off), the update is -g exactly.
  for clip in (2 * norm, None):
    for got, g in zip(jax.tree_util.tree_leaves(_sgd_updates(grads, clip)), leaves, strict=True):
      np.testing.assert_array_equal(got, -g)
