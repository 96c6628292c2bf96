"""The models: ViT and its R50 hybrids (vit, resnet), BiT ResNets (bit), the numerics behind them
(ops), masked patch prediction (mpp), segmentation (segmentation) and detection (detection)
around them.

  presets  the architectures by name ('ViT-B_16', alias 'B/16', ...): `get_model_config`
  build    a preset or model config as a Flax module: `get_model`

Every model answers `logits, out = model.apply({'params': params}, images, train=...,
example_ids=None)`, big_vision's contract: no flag changes what a model returns. `out` names
what the model computed, and under jax.jit what a caller does not read is never computed:

    pre_logits     the representation [batch, R] the linear probes and few-shot evaluators read:
                   the Dense+tanh `pre_logits` layer's output, else the class token (or the
                   tokens' mean, 'gap'); BiT: the pooled features; MPP: the mean patch token;
                   segmentation: the spatial mean of the last map its head reads;
                   detection: the spatial mean of the last map
    tokens         ViT: the patch tokens after the final LayerNorm [batch, patches, D]
    blocks         each block's output map, the patch tokens on their grid [batch, h, w, C]
                   (ViT: the class token left out), in block order (timm's
                   forward_intermediates; dense prediction reads them)
    normed_blocks  the same as the dense heads read them: a ViT's each through the final
                   LayerNorm (the last is `tokens` on its grid), a BiT's last through the final
                   GroupNorm → ReLU (the map its pool averages)

All are at least float32. The logits are the classifier's [batch, num_classes] (float32;
DeiT's distillation token: the two heads' average, each in `out['class_logits']`,
`out['dist_logits']`), the per-patch predictions of masked patch prediction (`out['kind']`:
which patches it corrupted, vit_jax.models.mpp), the per-pixel ones of segmentation, or the
per-location ones of detection (`out['detections']`: the decoded boxes, vit_jax.models.detection). A model without a head (`num_classes=None`) returns its pre-logits as its
logits, as big_vision does: export, predict and the FLOP count read the one array either way.

The names below are the package's API (`models.get_model("B/16", num_classes=10)`). This file
only names things, and must not import TensorFlow.
"""

from vit_jax.models.build import get_model
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
  "get_model",
  "get_model_config",
  "is_bit",
  "known_overrides",
  "resolve_name",
  "vit_config",
]
