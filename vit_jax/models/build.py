"""Flax modules from a model preset or config: `get_model`, and `forward_intermediates` for the
feature maps of chosen blocks. This file must not import TensorFlow.
"""

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
  """Builds the Flax module of a preset.

  Args:
    name_or_config: a preset name ('ViT-B_16', 'BiT-R50x1'), an alias ('B/16', 'R50x1'), or a
      model ConfigDict (e.g. `config.model` of a stage config).
    num_classes: width of the head; None for a headless model returning the representation.
    mesh: the jax.sharding.Mesh the model will be trained on, if any: it decides where the
      attention core can run (vit_jax.models.ops.attention_kernel_for_mesh).
    **overrides: any model field, e.g. `representation_size=768, dtype='bfloat16', scan=True`.

  Returns:
    The `VisionTransformer` (or BiT `ResNetV2`); call
    `model.apply({'params': params}, images, train=False)`, with `return_representation=True`
    for the pre-logits (ViT) or pooled features (BiT).
  """
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
  if fields["resnet"] is not None:
    fields["resnet"] = dict(fields["resnet"])
  if mesh is not None:
    fields["attention_kernel"] = ops.attention_kernel_for_mesh(fields["attention_kernel"], mesh)
  return vit.VisionTransformer(num_classes=num_classes, **fields)


def forward_intermediates(
  model: nn.Module,
  params: Any,
  images: Any,
  layers: tuple[int, ...] = (-1,),
  *,
  norm: bool = False,
) -> list[Any]:
  """The feature maps of chosen blocks of a ViT, hybrid or BiT ResNet (timm's
  `forward_intermediates` idea), for dense prediction.

  Args:
    model: from `get_model` (a `VisionTransformer` or `bit.ResNetV2`; its head is not used).
    params: the model's parameters.
    images: float [batch, height, width, 3] in [-1, 1].
    layers: block indices, 0 the first, negative ones from the last (-1: the last block).
    norm: ViT: each map through the encoder's final LayerNorm (the last block's map is then
      exactly the patch tokens the head reads, `return_tokens`); BiT: the last block's map
      through the final GroupNorm → ReLU (its spatial mean is the pooled representation).

  Returns:
    One float32 map per entry of `layers`: ViT and hybrids [batch, H/p, W/p, hidden_size] (the
    patch tokens on their grid, the class token left out); BiT [batch, H/s, W/s, channels] with
    s = 4, 8, 16, 32 for blocks 1 to 4.
  """
  return model.apply(
    {"params": params}, images, train=False, feature_layers=tuple(layers), feature_norm=norm
  )
