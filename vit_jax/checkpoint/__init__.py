"""Checkpoints: parameter files in the published layouts, and the trainer's Orbax state.

  npz          `.npz` / `.safetensors` files: read any published layout, write vit_jax's
  layouts      big_vision names and scan stacking, BiT's prefix (pure renames of flat names)
  timm_hf      timm and Hugging Face state dicts (names, qkv split, configs)
  adapt        fitting pretrained parameters to a model: position embeddings (resized, or a
               sincos2d model's table written for `save`), head, pre_logits
  train_state  the trainer's Orbax checkpoints (async saves, keep-N, resume, data position)
  restore_faults  what a failed restore of a training step says about that step (evidence that
               it is broken, or an error to retry)
  storage_wait  a restore or save that waits on storage: a line every 30 s, a stop honoured
  local_tier   frequent saves of each process's own shards to its own disk, and restoring the
               newest step of either tier
  loader       any of the above, with the architecture that goes with it

The names below are the public API; `from vit_jax import checkpoint` is all a user needs:

  params = checkpoint.load("ViT-B_16.npz")          # or a trainer workdir, or a step directory
  loaded = checkpoint.load_model("<workdir>")       # .model, .params, .model_config, .config
  checkpoint.save(params, "model.npz")              # the published vit_jax layout
  # a posemb='sincos2d' model: its computed table written first, as the published files have it
  checkpoint.save(checkpoint.with_posemb_table(params, model_config, 224), "model.npz")
"""

from vit_jax.checkpoint.adapt import (
  fit_posemb,
  ignore_sincos_table,
  image_grid,
  load_pretrained,
  num_prefix_tokens,
  patch_grid,
  resize_posemb,
  with_posemb_table,
)
from vit_jax.checkpoint.layouts import POSEMB
from vit_jax.checkpoint.loader import (
  Loaded,
  load,
  load_backbone,
  load_model,
  model_config_from_params,
  representation_model,
  saved_config,
)
from vit_jax.checkpoint.npz import (
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
