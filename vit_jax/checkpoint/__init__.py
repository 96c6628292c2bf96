"""Checkpoints: parameter files in the published layouts, and the trainer's Orbax state.

  weights  published parameter files (vit_jax, big_vision, BiT `.npz`; timm and Hugging Face
           `.safetensors`): reading, writing, fitting them to a model
  state    the trainer's fault-tolerant state: a workdir's Orbax checkpoints, the local tier
  loader   any checkpoint, a weights file or a workdir, with the architecture that goes with it

The names below are the public API; `from vit_jax import checkpoint` is all a user needs:

  params = checkpoint.load("ViT-B_16.npz")          # or a trainer workdir, or a step directory
  loaded = checkpoint.load_model("<workdir>")       # .model, .params, .model_config, .config
  checkpoint.save(params, "model.npz")              # the published vit_jax layout
  # a posemb='sincos2d' model: its computed table written first, as the published files have it
  checkpoint.save(checkpoint.with_posemb_table(params, model_config, 224), "model.npz")

The trainer uses vit_jax.checkpoint.state's modules by name.
"""

from vit_jax.checkpoint.loader import (
  Loaded,
  load,
  load_backbone,
  load_model,
  model_config_from_params,
  representation_model,
  saved_config,
)
from vit_jax.checkpoint.weights.adapt import (
  fit_posemb,
  ignore_sincos_table,
  image_grid,
  load_pretrained,
  num_prefix_tokens,
  patch_grid,
  resize_posemb,
  with_posemb_table,
)
from vit_jax.checkpoint.weights.layouts import POSEMB
from vit_jax.checkpoint.weights.npz import (
  WEIGHTS_CONFIG_FILE,
  file_layout,
  flatten_params,
  is_params_file,
  read_foreign_config,
  save,
  save_safetensors,
  stack_encoder_blocks,
  unflatten_params,
  unstack_encoder_blocks,
)

__all__ = [
  "POSEMB",
  "WEIGHTS_CONFIG_FILE",
  "Loaded",
  "file_layout",
  "fit_posemb",
  "flatten_params",
  "ignore_sincos_table",
  "image_grid",
  "is_params_file",
  "load",
  "load_backbone",
  "load_model",
  "load_pretrained",
  "model_config_from_params",
  "num_prefix_tokens",
  "patch_grid",
  "read_foreign_config",
  "representation_model",
  "resize_posemb",
  "save",
  "save_safetensors",
  "saved_config",
  "stack_encoder_blocks",
  "unflatten_params",
  "unstack_encoder_blocks",
  "with_posemb_table",
]
