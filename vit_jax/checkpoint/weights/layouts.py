"""Maps the parameter names of other ViT `.npz` files onto the published vit_jax layout.

`to_vit_jax_layout` undoes, in this order: a `params/` or `opt/target/` prefix (big_vision, old
flax optimizers) or the `resnet/` prefix of the published BiT files (in memory a BiT tree starts
at `root_block`, like a ViT's at its modules; `with_bit_prefix` puts it back for writing);
big_vision's linen counters inside encoder blocks (`MultiHeadDotProductAttention_0`,
`LayerNorm_1`, `MlpBlock_0` -> the published `_1`, `_2`, `_3`); big_vision's position embedding
outside `Transformer/posembed_input` (`_convert_posemb`); GroupNorm `scale`/`bias` stored as
[1, 1, 1, C] by flax < 0.3.6 in hybrid files (flax #1721). Scan-stacked blocks stay stacked;
`stack_flat`/`unstack_flat` convert. Renames and reshapes only: no files, no TensorFlow.
"""

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

# The published layout's position embeddings [1, tokens, width] (class token first).
POSEMB = "Transformer/posembed_input/pos_embedding"

# big_vision (linen counters) -> published vit_jax (pre-linen counters), inside an encoder block.
_BLOCK_RENAMES = {
  "LayerNorm_0": "LayerNorm_0",
  "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
  "LayerNorm_1": "LayerNorm_2",
  "MlpBlock_0": "MlpBlock_3",
}
_PUBLISHED_BLOCK_MODULES = frozenset(_BLOCK_RENAMES.values())
_BLOCK_RE = re.compile(r"^(Transformer/encoderblock(?:_\d+)?)/([^/]+)/(.+)$")
_GROUPNORM_RE = re.compile(r"(^|/)gn(\d+|_root|_proj)/(scale|bias)$")
_STACKED = "Transformer/encoderblock/"
_UNSTACKED_RE = re.compile(r"^Transformer/encoderblock_(\d+)/(.+)$")
_PREFIXES = ("params/", "opt/target/", "resnet/")
BIT_PREFIX = "resnet/"


def to_vit_jax_layout(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """A new flat dict (`/`-separated names, as read from an `.npz`) in the published layout;
  ValueError for parameters with no faithful counterpart (MAP head, unknown block modules,
  position embeddings in two places)."""
  flat = _strip_prefix(flat)
  if any(k == "probe" or k.startswith("MAPHead_0/") for k in flat):
    raise ValueError(
      "checkpoint uses big_vision's MAP-head pooling (`MAPHead_0`/`probe`); this ViT supports "
      "classifier='token' or 'gap' only"
    )
  flat = _rename_block_modules(flat)
  flat = _convert_posemb(flat)
  return _squeeze_groupnorm(flat)


def is_bit(flat: Mapping[str, Any]) -> bool:
  """Whether flat parameter names (without `resnet/`) are those of a BiT ResNet."""
  return any(k.startswith("root_block/") for k in flat)


def with_bit_prefix(flat: Mapping[str, Any]) -> dict[str, Any]:
  """BiT names as the published files have them (`resnet/...`); other layouts are unchanged."""
  if not is_bit(flat):
    return dict(flat)
  return {BIT_PREFIX + k: v for k, v in flat.items()}


def _strip_prefix(flat):
  for prefix in _PREFIXES:
    if flat and all(k.startswith(prefix) for k in flat):
      logging.info("checkpoint: stripping prefix %r", prefix)
      return {k[len(prefix) :]: v for k, v in flat.items()}
  for prefix in _PREFIXES:
    if any(k.startswith(prefix) for k in flat):
      others = sorted(k for k in flat if not k.startswith(prefix))[:5]
      raise ValueError(f"checkpoint mixes {prefix!r}-prefixed names with others, e.g. {others}")
  return flat


def _rename_block_modules(flat):
  modules = {}  # block -> names of its direct submodules
  for key in flat:
    m = _BLOCK_RE.match(key)
    if m:
      modules.setdefault(m.group(1), set()).add(m.group(2))
  out = {}
  for key, value in flat.items():
    m = _BLOCK_RE.match(key)
    # A block holds either published names or linen names; both share `LayerNorm_0`.
    if m and not modules[m.group(1)] <= _PUBLISHED_BLOCK_MODULES:
      block, module, rest = m.groups()
      if module not in _BLOCK_RENAMES:
        raise ValueError(
          f"unknown module {module!r} in encoder block {block!r} (key {key!r}); expected "
          f"{sorted(_BLOCK_RENAMES)} (big_vision) or {sorted(_PUBLISHED_BLOCK_MODULES)}"
        )
      key = f"{block}/{_BLOCK_RENAMES[module]}/{rest}"
    out[key] = value
  return out


def _convert_posemb(flat):
  """Moves a big_vision position embedding to POSEMB.

  big_vision adds [1, gh*gw, D] to the patch tokens before prepending the class token; the
  published layout adds [1, 1 + gh*gw, D] after it: a zero class slot is the same network.
  Files from before 2022 (under `Transformer/`) may hold the slot already (`N = s*s + 1` tokens,
  as big_vision tells them) and are kept as they are, as is a grid without `cls` ('gap').
  """
  names = [k for k in ("pos_embedding", "Transformer/pos_embedding", POSEMB) if k in flat]
  if len(names) > 1:
    raise ValueError(f"checkpoint has position embeddings in several places: {names}")
  if not names or names[0] == POSEMB:
    return flat
  flat = dict(flat)
  posemb = flat.pop(names[0])  # [1, N, D]
  if posemb.ndim != 3 or posemb.shape[0] != 1:
    raise ValueError(f"{names[0]!r} has shape {posemb.shape}; expected [1, tokens, width]")
  n = posemb.shape[1]
  if "cls" in flat and not _has_class_slot(n):
    logging.info("checkpoint: big_vision posemb %s gets a zero class slot", posemb.shape)
    posemb = np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)
  flat[POSEMB] = posemb
  return flat


def _has_class_slot(n: int) -> bool:
  s = math.isqrt(n - 1) if n > 0 else 0
  return n > 0 and s * s + 1 == n and math.isqrt(n) ** 2 != n


def _squeeze_groupnorm(flat):
  out = {}
  for key, value in flat.items():
    if _GROUPNORM_RE.search(key) and value.ndim > 1:
      if value.size != value.shape[-1]:
        raise ValueError(f"GroupNorm parameter {key!r} has shape {value.shape}; expected [C]")
      value = value.reshape(-1)
    out[key] = value
  return out


def is_stacked(flat: Mapping[str, Any]) -> bool:
  """Whether the encoder blocks are one scan-stacked `Transformer/encoderblock`."""
  return any(k.startswith(_STACKED) for k in flat)


def stack_flat(flat: Mapping[str, Any]) -> dict[str, Any]:
  """`Transformer/encoderblock_{i}/x` → `Transformer/encoderblock/x` [L, ...] (flat dicts)."""
  blocks = {}  # layer -> {rest: array}
  for name, value in flat.items():
    m = _UNSTACKED_RE.match(name)
    if m:
      blocks.setdefault(int(m.group(1)), {})[m.group(2)] = value
  if not blocks:
    return dict(flat)
  if is_stacked(flat):
    raise ValueError("parameters hold both stacked and unstacked encoder blocks")
  if sorted(blocks) != list(range(len(blocks))):
    raise ValueError(f"encoder blocks are not numbered 0..L-1: {sorted(blocks)}")
  rests = list(blocks[0])
  for i, block in blocks.items():
    if set(block) != set(rests):
      diff = sorted(set(block) ^ set(rests))
      raise ValueError(f"encoderblock_{i} differs from encoderblock_0 in {diff}")
  out = {}
  for name, value in flat.items():
    m = _UNSTACKED_RE.match(name)
    if not m:
      out[name] = value
    elif m.group(1) == "0":
      rest = m.group(2)
      out[_STACKED + rest] = np.stack([blocks[i][rest] for i in range(len(blocks))])
  return out


def unstack_flat(flat: Mapping[str, Any]) -> dict[str, Any]:
  """Inverse of `stack_flat`; other names keep their place."""
  stacked = {k[len(_STACKED) :]: v for k, v in flat.items() if k.startswith(_STACKED)}
  if not stacked:
    return dict(flat)
  if any(_UNSTACKED_RE.match(k) for k in flat):
    raise ValueError("parameters hold both stacked and unstacked encoder blocks")
  lengths = {v.shape[0] if v.ndim else None for v in stacked.values()}
  if len(lengths) != 1 or None in lengths:
    raise ValueError(f"stacked encoder block leaves disagree on the layer axis: {lengths}")
  (num_layers,) = lengths
  out = {}
  for name, value in flat.items():
    if not name.startswith(_STACKED):
      out[name] = value
    elif name == _STACKED + next(iter(stacked)):  # emit all layers where the first leaf was
      for i in range(num_layers):
        for rest, leaf in stacked.items():
          out[f"Transformer/encoderblock_{i}/{rest}"] = leaf[i]
  return out
