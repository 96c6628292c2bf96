"""Parameter files in the published layouts, and fitting their parameters to a model.

  npz       `.npz` / `.safetensors` files: read any published layout, write vit_jax's
  layouts   big_vision names and scan stacking, BiT's prefix (pure renames of flat names)
  timm_hf   timm and Hugging Face state dicts (names, qkv split, configs)
  adapt     fitting pretrained parameters to a model: position embeddings (resized, or a
            sincos2d model's table written for `save`), head, pre_logits

Their public names are vit_jax.checkpoint's. Nothing here reads the trainer's state.
"""
