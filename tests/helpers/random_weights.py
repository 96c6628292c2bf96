"""Random weights: for comparisons with other implementations (the slow timm / HF tests), and
as a published-layout .npz for stages to start from."""

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import checkpoint, models


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


def random_npz(path: str, seed: int, **model_fields) -> str:
  """A 'testing' ViT's parameters, random (LayerNorm scales 1), as a published-layout .npz;
  shapes from jax.eval_shape, so nothing is compiled for it."""
  model = models.get_model("testing", num_classes=10, **model_fields)
  shapes = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)["params"]
  )
  rng = np.random.default_rng(seed)
  checkpoint.save(
    jax.tree_util.tree_map_with_path(
      lambda path, s: (
        np.ones(s.shape, s.dtype)
        if path[-1].key == "scale"
        else rng.normal(0.0, 0.05, s.shape).astype(s.dtype)
      ),
      shapes,
    ),
    path,
  )
  return path
