"""Model presets by name: ViT-Ti/S/B/L/H, the R50 hybrids, BiT ResNets, and the CPU-sized ones.

Presets are the architecture only (paper Table 1; BiT's ResNetV2 depths and widths); training-time
choices (dropout, stochastic depth, dtype, remat, scan, head bias) come from the stage configs as
overrides. A BiT config is recognised by its `block_units` field (`is_bit`) and has no ViT-only
fields. vit_jax.models.build makes the Flax module. This file must not import TensorFlow.
"""

import difflib
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

# name -> factory of the preset's ConfigDict. Every name must have a pinned parameter count in
# tests/test_models.py.
MODEL_CONFIGS: dict[str, Callable[[], ml_collections.ConfigDict]] = {}

# Short names used in config strings: 'B/16' -> 'ViT-B_16', 'R50+B/16' -> 'R50+ViT-B_16'.
ALIASES: dict[str, str] = {}


def _register(name: str, alias: str):
  def wrap(factory):
    MODEL_CONFIGS[name] = factory
    ALIASES[alias] = name
    return factory

  return wrap


def vit_config(name, patch_size, hidden_size, mlp_dim, num_heads, num_layers, resnet=None):
  """A model ConfigDict with every field, for the given architecture (defaults elsewhere)."""
  return ml_collections.ConfigDict(
    dict(
      name=name,
      patch_size=patch_size,
      hidden_size=hidden_size,
      mlp_dim=mlp_dim,
      num_heads=num_heads,
      num_layers=num_layers,
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
      classifier="token",
      representation_size=ml_collections.FieldReference(None, field_type=int),
      resnet=resnet,
      head_bias_init=0.0,
      dtype="float32",
      param_dtype="float32",
      remat=False,
      scan=False,
      # The published weights use the tanh approximation; timm and Hugging Face the exact GELU.
      gelu_approximate=True,
      # The attention core's kernel (ops.ATTENTION_KERNELS); 'auto': cuDNN on GPUs (bf16),
      # the C++ kernel of vit_jax/kernels/cpu.py on a one-device CPU (float32).
      attention_kernel="auto",
      # The LayerNorms' (ops.LAYER_NORM_KERNELS); 'auto': C++ on a one-device CPU (float32).
      layer_norm_kernel="auto",
      # The dtype the gradients are summed across devices in, where wider than `dtype`
      # (ops.gradient_dtype): 'bfloat16' keeps a bf16 model's as autodiff gives them.
      grad_reduce_dtype="bfloat16",
      # DeiT's distillation token and head (vit.VisionTransformer; the objective is
      # vit_jax.objectives.distill, chosen by config.distill.teacher).
      distill_token=False,
      # Position embeddings (vit.POSEMB_TYPES): the paper's learned table, or 'sincos2d', the
      # fixed 2-D sin-cos ones of Beyer et al. (2022), with no parameter.
      posemb="learn",
      # Stochastic depth (Huang et al., 2016): the drop-path rate of the last block, 0 at the
      # first, linear in between (vit.stochastic_depth_rates); 0.0: none. Training only.
      stochastic_depth=0.0,
      # ViTDet's window attention (vit.window_attention): windows of window_size×window_size
      # patches in every block but `global_blocks`; 0: every block global. No parameters.
      window_size=0,
      global_blocks=(),
    )
  )


# name, alias, patch, (hidden, mlp, heads, layers) — ViT paper Table 1 and its Ti/S follow-ups.
_WIDTHS = {
  "Ti": (192, 768, 3, 12),
  "S": (384, 1536, 6, 12),
  "B": (768, 3072, 12, 12),
  "L": (1024, 4096, 16, 24),
  "H": (1280, 5120, 16, 32),
}
for _size, _patch in [
  ("Ti", 16),
  ("S", 16),
  ("S", 32),
  ("B", 8),
  ("B", 16),
  ("B", 32),
  ("L", 16),
  ("L", 32),
  ("H", 14),
]:
  _name = f"ViT-{_size}_{_patch}"
  _register(_name, f"{_size}/{_patch}")(
    lambda n=_name, p=_patch, w=_WIDTHS[_size]: vit_config(n, p, *w)
  )


@_register("R50+ViT-B_16", "R50+B/16")
def _r50_b16():
  # A ResNet-50 cut to 3 stages with (3, 4, 9) units downsamples by 2^(1+3) = 16, so 1x1 patches
  # on its feature map give the /16 tokens of ViT-B/16.
  resnet = ml_collections.ConfigDict(dict(num_layers=(3, 4, 9), width_factor=1))
  return vit_config("R50+ViT-B_16", 1, *_WIDTHS["B"], resnet=resnet)


@_register("R50+ViT-L_32", "R50+L/32")
def _r50_l32():
  # The full four-stage ResNet-50 (3, 4, 6, 3) downsamples by 2^(1+4) = 32.
  resnet = ml_collections.ConfigDict(dict(num_layers=(3, 4, 6, 3), width_factor=1))
  return vit_config("R50+ViT-L_32", 1, *_WIDTHS["L"], resnet=resnet)


@_register("ViT-testing", "testing")
def _testing():
  """A two-layer ViT that 2 CPU cores train in seconds (tests, `runlocal`)."""
  return vit_config("ViT-testing", 4, 32, 64, 2, 2)


@_register("ViT-demo", "demo")
def _demo():
  """The CPU demo's ViT (experiments/demo.py; the bundled datasets' default): 4x4 patches of
  32px images (64 tokens and the class token), four blocks of width 64: 2 CPU cores train it on
  Fashion-MNIST in minutes."""
  return vit_config("ViT-demo", 4, 64, 256, 4, 4)


def bit_config(name, block_units, width_factor=1, base_width=64):
  """A BiT ResNet ConfigDict (bit.ResNetV2 fields, defaults elsewhere)."""
  return ml_collections.ConfigDict(
    dict(
      name=name,
      block_units=tuple(block_units),
      width_factor=width_factor,
      base_width=base_width,
      head_bias_init=0.0,
      dtype="float32",
      param_dtype="float32",
    )
  )


# BiT (Kolesnikov et al., 2020): units per block of ResNet-26/50/101/152, and the released widths.
_BIT_UNITS = {26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
for _depth, _factor in [(50, 1), (101, 1), (50, 3), (152, 2)]:
  _name = f"BiT-R{_depth}x{_factor}"
  _register(_name, f"R{_depth}x{_factor}")(
    lambda n=_name, d=_depth, f=_factor: bit_config(n, _BIT_UNITS[d], f)
  )


@_register("BiT-R26x1", "R26x1")
def _bit_r26():
  """A narrow ResNet-26 of the BiT family (base width 32, the least GroupNorm's 32 groups allow)
  that 2 CPU cores train on 32px images (experiments/scale_study.py)."""
  return bit_config("BiT-R26x1", _BIT_UNITS[26], 1, base_width=32)


def is_bit(config: Mapping[str, Any]) -> bool:
  """Whether a model config (or its dict) describes a BiT ResNet rather than a ViT."""
  return "block_units" in config


def known_overrides(config: Mapping[str, Any], **overrides) -> dict[str, Any]:
  """The `overrides` that are fields of `config`: e.g. `representation_size` and `dropout_rate`
  for a ViT, none of them for a BiT ResNet, which has neither."""
  return {k: v for k, v in overrides.items() if k in config}


def resolve_name(name: str) -> str:
  """Maps an alias ('B/16') or a preset name ('ViT-B_16') to the preset name."""
  if name in MODEL_CONFIGS:
    return name
  if name in ALIASES:
    return ALIASES[name]
  known = [*MODEL_CONFIGS, *ALIASES]
  close = difflib.get_close_matches(name, known, n=1)
  hint = f"; did you mean {close[0]!r}?" if close else ""
  raise KeyError(
    f"unknown model {name!r}{hint} (known: {sorted(MODEL_CONFIGS)} or {sorted(ALIASES)})"
  )


def get_model_config(name: str) -> ml_collections.ConfigDict:
  """Returns a fresh, unlocked copy of the preset `name` (or its alias)."""
  return MODEL_CONFIGS[resolve_name(name)]()
