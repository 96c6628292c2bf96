"""A checkpoint under analysis: its model, and the attention statistics of batches of images.

`load` reads any checkpoint a stage may start from, as `vit_jax.linear_probe` and
`vit_jax.predict` do. `Subject.attention_statistics` reduces the sown attention weights on the
devices to what the figures need: the [layers, batch, heads, T, T] weights never reach the host.

Single process: the parameters and batches are sharded over the local devices of a
('data', 'fsdp', 'model') mesh. This file must not import TensorFlow.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from vit_jax import checkpoint, inference, models, sharding
from vit_jax.analysis import metrics

ATTENTION = "MultiHeadDotProductAttention_1"


@dataclasses.dataclass
class Subject:
  """A loaded checkpoint and the geometry of its tokens.

  Attributes:
    model: the headless module (float32, no dropout) that the statistics run.
    params: its parameters, placed on `mesh`.
    checkpoint_params: the checkpoint's parameters as numpy arrays (embedding, position
      embeddings at the resolution they were trained at).
    model_config: the architecture.
    image_size: the side of the square input.
    pp: the evaluation preprocessing spec (vit_jax.inference.preprocess).
    grid: (gh, gw), the token grid at `image_size`.
    posemb_grid: (gh, gw) of the checkpoint's own position embeddings.
    stride: input pixels per grid step.
    num_prefix_tokens: 1 with a class token, else 0.
    mesh: the device mesh.
  """

  model: Any
  params: Any
  checkpoint_params: dict[str, Any]
  model_config: ml_collections.ConfigDict
  image_size: int
  pp: str
  grid: tuple[int, int]
  posemb_grid: tuple[int, int]
  stride: int
  num_prefix_tokens: int
  mesh: jax.sharding.Mesh

  @property
  def num_layers(self) -> int:
    return int(self.model_config.num_layers)

  @property
  def num_heads(self) -> int:
    return int(self.model_config.num_heads)

  @property
  def is_hybrid(self) -> bool:
    return self.model_config.get("resnet") is not None

  def batch_multiple(self) -> int:
    """Batch sizes must be multiples of this (the batch shards of the mesh)."""
    return sharding.num_batch_shards(self.mesh)

  def attention_statistics(
    self, images: np.ndarray, valid: np.ndarray, residual_weight: float = 0.5
  ) -> dict[str, np.ndarray]:
    """Of preprocessed images [batch, S, S, 3] (batch a multiple of `batch_multiple()`) and
    `valid` bool [batch]: `distance_sum` [layers, heads] (each image's mean attention distance in
    pixels, summed over the valid images), `prefix_share_sum` [layers, heads] (the same for the
    attention the patches give the class token), `rollout` [batch, gh * gw]
    (metrics.attention_rollout, identity weight `residual_weight`), as numpy arrays."""
    batch_sharding = sharding.batch_sharding(self.mesh, images.ndim)
    images = jax.device_put(jnp.asarray(images, jnp.float32), batch_sharding)
    valid = jax.device_put(jnp.asarray(valid, jnp.float32), sharding.batch_sharding(self.mesh))
    out = self._statistics(self.params, images, valid, residual_weight)
    return {k: np.asarray(v) for k, v in out.items()}

  @functools.cached_property
  def _statistics(self):
    grid, stride, prefix = self.grid, self.stride, self.num_prefix_tokens

    @functools.partial(jax.jit, static_argnums=3)
    def statistics(params, images, valid, residual_weight):
      attention = attention_weights(self.model, params, images)  # [L, B, H, T, T]
      distance, share = metrics.mean_attention_distance(attention, grid, stride, prefix)
      per_image = jnp.stack([distance.mean(-1), share.mean(-1)])  # [2, L, B, H]
      sums = jnp.einsum("slbh,b->slh", per_image, valid)
      rollout, _ = metrics.attention_rollout(attention, residual_weight, prefix)
      return dict(distance_sum=sums[0], prefix_share_sum=sums[1], rollout=rollout)

    return statistics


def attention_weights(model: Any, params: Any, images: jax.Array) -> jax.Array:
  """The sown attention weights of every block: [layers, batch, heads, tokens, tokens] float32."""
  _, state = model.apply({"params": params}, images, train=False, mutable=["intermediates"])
  encoder = state["intermediates"]["Transformer"]
  if "encoderblock" in encoder:  # scanned: one entry with a leading layer axis
    (stacked,) = encoder["encoderblock"][ATTENTION]["attention_weights"]
    return stacked.astype(jnp.float32)
  layers = sorted(
    (k for k in encoder if k.startswith("encoderblock_")), key=lambda k: int(k.split("_")[-1])
  )
  return jnp.stack([encoder[k][ATTENTION]["attention_weights"][0] for k in layers]).astype(
    jnp.float32
  )


def load(
  path: str,
  model: str | None = None,
  image_size: int = 0,
  fsdp: int = 1,
  model_parallel: int = 1,
) -> Subject:
  """The Subject of a workdir, step directory or `.npz`; `model`: a preset for a checkpoint
  without `config.json` (hybrids need one); `image_size` 0: the saved dataset's, else the
  position embeddings'; `fsdp`, `model_parallel`: mesh axis sizes, the rest is 'data'."""
  explicit = models.get_model_config(model) if model else None
  model_config, params, saved = checkpoint.load_backbone(path, explicit)
  # Analysis in float32 whatever the training dtype: bf16 attention weights are too coarse.
  model_config.dtype = "float32"
  dataset = saved.get("dataset") if saved is not None else None
  native = dataset.image_size if dataset and dataset.get("image_size") else None
  if isinstance(native, (list, tuple)):
    native = native[0] if native[0] == native[1] else None
  native = native or inference.native_image_size(params, model_config)
  image_size = image_size or native
  prefix = checkpoint.num_prefix_tokens(params)
  sincos = model_config.get("posemb", "learn") == "sincos2d"
  # Fixed sin-cos embeddings run from the model's own function (`run_params` has no table); the
  # figures read them as the table they are at the native size.
  table = checkpoint.with_posemb_table(params, model_config, native) if sincos else params
  posemb = table["Transformer"]["posembed_input"]["pos_embedding"]
  posemb_config = ml_collections.ConfigDict(dict(model_config.to_dict(), image_size=native))
  posemb_grid = checkpoint.patch_grid(posemb_config, posemb.shape[1] - prefix)

  mesh_config = ml_collections.ConfigDict(dict(data=-1, fsdp=fsdp, model=model_parallel))
  mesh = sharding.make_mesh(mesh_config, jax.local_devices())
  module, run_params = checkpoint.representation_model(model_config, params, "pooled", image_size)
  if sincos:
    grid = checkpoint.image_grid(model_config, image_size)
  else:
    tokens = run_params["Transformer"]["posembed_input"]["pos_embedding"].shape[1]
    grid_config = ml_collections.ConfigDict(dict(model_config.to_dict(), image_size=image_size))
    grid = checkpoint.patch_grid(grid_config, tokens - prefix)
  run_params = jax.device_put(run_params, sharding.tree_shardings(run_params, mesh))
  logging.info(
    "analysis: %s from %s at %dpx: %dx%d tokens of %d px, %d layers x %d heads",
    model_config.get("name"),
    path,
    image_size,
    *grid,
    inference.token_stride(model_config),
    model_config.num_layers,
    model_config.num_heads,
  )
  return Subject(
    model=module,
    params=run_params,
    checkpoint_params=table,
    model_config=model_config,
    image_size=int(image_size),
    pp=(dataset.get("pp_eval") if dataset else None) or inference.DEFAULT_PP,
    grid=grid,
    posemb_grid=posemb_grid,
    stride=inference.token_stride(model_config),
    num_prefix_tokens=prefix,
    mesh=mesh,
  )
