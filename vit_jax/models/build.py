"""Flax modules from a model preset or config: `get_model`. This file must not import TensorFlow."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from vit_jax.models import bit, ops, presets, vit

# Fields of a model ConfigDict that are not VisionTransformer attributes: the preset's name, and
# the image size that checkpoint.load_pretrained uses to lay out a non-square patch grid.
_NON_MODULE_FIELDS = ("name", "image_size")

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def get_model(
  name_or_config: str | ml_collections.ConfigDict,
  num_classes: int | None,
  mesh: Any = None,
  **overrides,
) -> nn.Module:
  """The `VisionTransformer` or BiT `ResNetV2` of a preset name ('ViT-B_16'), alias ('B/16') or
  model ConfigDict; `num_classes` None: headless. `mesh`, the one it will train on, decides
  where attention can run (`ops.attention_kernel_for_mesh`); `overrides`: any model field."""
  if isinstance(name_or_config, str):
    config = presets.get_model_config(name_or_config)
  else:
    config = ml_collections.ConfigDict(name_or_config.to_dict())
  fields = config.to_dict()
  unknown = set(overrides) - set(fields) - set(_NON_MODULE_FIELDS)
  if unknown:
    raise TypeError(f"unknown model override(s) {sorted(unknown)}; fields: {sorted(fields)}")
  fields.update(overrides)
  for key in _NON_MODULE_FIELDS:
    fields.pop(key, None)
  for key in ("dtype", "param_dtype", "grad_reduce_dtype"):
    if isinstance(fields.get(key), str):
      if fields[key] not in _DTYPES:
        raise ValueError(f"model {key}={fields[key]!r}; expected one of {sorted(_DTYPES)}")
      fields[key] = _DTYPES[fields[key]]
  if presets.is_bit(fields):
    fields["block_units"] = tuple(fields["block_units"])
    return bit.ResNetV2(num_classes=num_classes, **fields)
  if "global_blocks" in fields:
    fields["global_blocks"] = tuple(int(i) for i in fields["global_blocks"])
  if fields["resnet"] is not None:
    fields["resnet"] = dict(fields["resnet"])
  if mesh is not None:
    fields["attention_kernel"] = ops.attention_kernel_for_mesh(fields["attention_kernel"], mesh)
  return vit.VisionTransformer(num_classes=num_classes, **fields)
