"""Random weights for comparisons with other implementations (the slow timm / HF tests)."""

import jax
import jax.numpy as jnp
import numpy as np


def random_params(model, image_size: int, seed: int = 0):
  """Random float32 values for every leaf of `model`, the head included (zero in a real init):
  LayerNorm scales near 1, everything else N(0, 0.02²)."""
  images = jnp.zeros((1, image_size, image_size, 3))
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), images, train=False))["params"]
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    noise = rng.standard_normal(leaf.shape, np.float32)
    return 1.0 + 0.1 * noise if "scale" in jax.tree_util.keystr(path) else 0.02 * noise

  return jax.tree_util.tree_map_with_path(draw, shapes)
