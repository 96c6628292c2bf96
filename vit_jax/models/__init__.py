"""The models: ViT and its R50 hybrids (vit, resnet), BiT ResNets (bit), the numerics behind them
(ops), masked patch prediction (mpp) and segmentation (segmentation) around them.

  presets  the architectures by name ('ViT-B_16', alias 'B/16', ...): `get_model_config`
  build    a preset or model config as a Flax module: `get_model`, `forward_intermediates`

The names below are the package's API (`models.get_model("B/16", num_classes=10)`). This file
only names things, and must not import TensorFlow.
"""

from vit_jax.models.build import forward_intermediates, get_model
from vit_jax.models.presets import (
  ALIASES,
  MODEL_CONFIGS,
  bit_config,
  get_model_config,
  is_bit,
  known_overrides,
  resolve_name,
  vit_config,
)

__all__ = [
  "ALIASES",
  "MODEL_CONFIGS",
  "bit_config",
  "forward_intermediates",
  "get_model",
  "get_model_config",
  "is_bit",
  "known_overrides",
  "resolve_name",
  "vit_config",
]
