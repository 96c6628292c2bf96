"""Which parameters are weight-decayed: chosen by name, the same with scan on and off."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vit_jax import models, optim, sharding


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
