"""Adapts pretrained parameters to the model that will use them: position embeddings, heads.

Fine-tuning (`load_pretrained`), the linear probe and predict (`fit_posemb`) resize position
embeddings on the patch grid (paper §3.2), replace the head, keep or drop `pre_logits`, and report
any remaining difference in one error listing them in the network's order.

A `posemb='sincos2d'` model has no position embedding parameter (it computes its table for the
grid it sees). `with_posemb_table` writes that table as the learned one (the published layout,
for `save`); read back into a sincos2d model such a table is recognised and not used, while a
learned one is refused naming `posemb` (`ignore_sincos_table`).
"""

import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import models
from vit_jax.checkpoint.weights import layouts
from vit_jax.checkpoint.weights.layouts import POSEMB
from vit_jax.checkpoint.weights.npz import Params, flatten_params, load, unflatten_params
from vit_jax.models import mpp, vit

_MAX_LISTED = 40  # entries beyond this many are counted, not listed, in error messages
# What a checkpoint without a position embedding table is, and what to do with it.
_NO_TABLE = (
  f"the checkpoint has no {POSEMB}: a posemb='sincos2d' model's (it computes its own), so the "
  "model must have posemb='sincos2d' too (config.model.posemb), or write the table into the "
  "parameters first with checkpoint.with_posemb_table"
)
# The heads a new task replaces: the classifier's and DeiT's distillation head.
_HEADS = ("head/", "head_dist/")


def num_prefix_tokens(params: Mapping[str, Any]) -> int:
  """Slots of the position embedding before the patch grid (nested or flat parameters): the
  class token's (`cls`) and DeiT's distillation token's (`dist_token`, vit_jax.models.vit)."""
  return int("cls" in params) + int("dist_token" in params)


def resize_posemb(
  posemb: np.ndarray,
  new_grid: int | Sequence[int],
  num_prefix_tokens: int = 1,
  old_grid: Sequence[int] | None = None,
) -> np.ndarray:
  """Resizes learned position embeddings to another patch grid (paper §3.2): bicubically in 2-D
  (float32, host CPU, pixel-centre alignment); the prefix slots are kept bit for bit.

  Args:
    posemb: [1, num_prefix_tokens + gh*gw, D]; the result has new_gh*new_gw, in its dtype.
    new_grid: target grid, `g` for g×g or `(gh, gw)`.
    num_prefix_tokens: leading slots that are not on the grid (1 with a class token, 0 for gap).
    old_grid: `(gh, gw)` of `posemb`; inferred when the grid is square.
  """
  posemb = np.asarray(posemb)
  if posemb.ndim != 3 or posemb.shape[0] != 1:
    raise ValueError(f"posemb has shape {posemb.shape}; expected [1, tokens, width]")
  prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
  n, width = grid.shape
  if old_grid is None:
    s = math.isqrt(n)
    if s * s != n:
      raise ValueError(f"posemb grid of {n} tokens is not square; pass old_grid=(gh, gw)")
    old_grid = (s, s)
  old_grid = tuple(old_grid)
  if old_grid[0] * old_grid[1] != n:
    raise ValueError(f"old_grid {old_grid} does not hold the {n} grid tokens of posemb")
  new_grid = (new_grid, new_grid) if isinstance(new_grid, int) else tuple(new_grid)
  if new_grid == old_grid:
    return posemb.copy()
  logging.info("resize_posemb: grid %s -> %s", old_grid, new_grid)
  # On the CPU so that every host computes the same bits, whatever the default backend is.
  with jax.default_device(jax.devices("cpu")[0]):
    resized = jax.image.resize(
      jnp.asarray(grid.reshape(*old_grid, width), jnp.float32),
      (*new_grid, width),
      method="cubic",
      antialias=False,
    )  # [new_gh, new_gw, D]
  resized = np.asarray(resized).reshape(1, -1, width).astype(posemb.dtype)
  return np.concatenate([prefix, resized], axis=1)


def _hw(image_size: int | Sequence[int]) -> tuple[int, int]:
  return (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)


def _posemb_shape(model: Any, image_size: int | Sequence[int]) -> tuple[int, ...]:
  """The shape of `model`'s position embedding table at `image_size` (nothing computed)."""
  h, w = _hw(image_size)
  shapes = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, h, w, 3)), train=False)["params"]
  )
  return tuple(shapes["Transformer"]["posembed_input"]["pos_embedding"].shape)


def image_grid(model_config: Any, image_size: int | Sequence[int]) -> tuple[int, int]:
  """The patch grid (gh, gw) of the model at `image_size` (`s` or `(h, w)`), after a hybrid's
  ResNet downsampling."""
  h, w = _hw(image_size)
  resnet = model_config.get("resnet")
  if resnet is not None:
    # Stride-2 SAME root conv and max-pool, then one stride-2 SAME stage per stage after the first.
    for _ in range(2 + len(resnet["num_layers"]) - 1):
      h, w = -(-h // 2), -(-w // 2)
  ph, pw = _hw(model_config.patch_size)
  return h // ph, w // pw


def patch_grid(model_config: Any, num_patches: int) -> tuple[int, int]:
  """The model's patch grid (gh, gw) of `num_patches` (from its position embedding): that of
  `model_config.image_size` (`image_grid`, checked against `num_patches`), else a square."""
  image_size = model_config.get("image_size")
  if image_size is None:
    s = math.isqrt(num_patches)
    if s * s != num_patches:
      raise ValueError(
        f"the model has {num_patches} patches, not a square grid; set model_config.image_size "
        "to (height, width) so the position embeddings can be laid out"
      )
    return s, s
  grid = image_grid(model_config, image_size)
  if grid[0] * grid[1] != num_patches:
    raise ValueError(
      f"model_config.image_size={image_size} gives a {grid[0]}x{grid[1]} patch grid, but the "
      f"model's position embedding has {num_patches} patches"
    )
  return grid


def with_posemb_table(
  params: Mapping[str, Any], model_config: Any, image_size: int | Sequence[int]
) -> Params:
  """A `posemb='sincos2d'` model's parameters (nested, or a variables dict) with its position
  embeddings for `image_size` (`s` or `(h, w)`) written as the learned table POSEMB
  [1, prefix + gh*gw, D] (float32): the published layout, which the official loaders and a
  `posemb='learn'` model read unchanged. Call it before `save`. Other models' parameters come
  back unchanged; either way a new nested dict of `params`' own leaves.
  """
  flat = flatten_params(params)
  if model_config.get("posemb", "learn") != "sincos2d":
    return unflatten_params(flat)
  # The learned twin's table shape: its tokens (class and any other prefix token included).
  twin = models.get_model(model_config, None, posemb="learn")
  _, tokens, width = _posemb_shape(twin, image_size)
  grid = image_grid(model_config, image_size)
  table = vit.fixed_posemb(grid, width, tokens - grid[0] * grid[1])
  flat[POSEMB] = table.astype(np.float32)
  return unflatten_params(flat)


def ignore_sincos_table(flat: dict[str, Any], source: str) -> None:
  """Removes the position embedding table of `flat` (flat names) for a `posemb='sincos2d'`
  model: one log line for a sincos2d table (of any grid), else a ValueError naming `posemb`."""
  table = flat.pop(POSEMB, None)
  if table is None:
    return
  if not _is_sincos_table(np.asarray(table, np.float64)):
    raise ValueError(
      f"{source}: the checkpoint has a learned position embedding table {POSEMB} "
      f"{tuple(np.shape(table))}, which a posemb='sincos2d' model would throw away; "
      "fine-tune it with posemb='learn' (config.model.posemb)"
    )
  logging.info(
    "%s: %s %s is the sincos2d table; the posemb='sincos2d' model computes its own",
    source,
    POSEMB,
    tuple(np.shape(table)),
  )


def _is_sincos_table(table: np.ndarray) -> bool:
  """Whether [1, T, D] is `vit.fixed_posemb` of some grid, to float32 rounding."""
  if table.ndim != 3 or table.shape[0] != 1 or table.shape[2] % 4 or table.shape[2] < 8:
    return False
  _, tokens, width = table.shape
  rows = np.abs(table[0]).max(axis=1)
  prefix = int(np.argmax(rows > 0)) if rows.any() else tokens  # zero rows: the prefix tokens
  n = tokens - prefix
  for gh in (d for d in range(1, n + 1) if n % d == 0):
    if np.allclose(table, vit.fixed_posemb((gh, n // gh), width, prefix), rtol=0, atol=1e-6):
      return True
  return False


def fit_posemb(
  params: Mapping[str, Any],
  model: Any,
  model_config: Any,
  image_size: int | Sequence[int],
) -> Params:
  """`params` (nested) with position embeddings resized for `model` (the Flax module, of
  `model_config`) at `image_size` (`s` or `(h, w)`), a shallow copy: what the linear probe and
  predict do (fine-tuning's `load_pretrained` does the same and more).
  """
  if "Transformer" not in params:  # a BiT ResNet: no position embeddings, any resolution
    return dict(params)
  if getattr(model, "posemb", "learn") == "sincos2d":  # computed for any grid: no table to fit
    flat = flatten_params(params)
    ignore_sincos_table(flat, "fit_posemb")
    return unflatten_params(flat)
  if "posembed_input" not in params["Transformer"]:
    raise ValueError(_NO_TABLE)
  old = params["Transformer"]["posembed_input"]["pos_embedding"]
  new = _posemb_shape(model, image_size)
  params = dict(params)
  if old.shape != new:
    prefix = num_prefix_tokens(params)
    grid_config = ml_collections.ConfigDict(
      dict(model_config.to_dict(), image_size=_hw(image_size))
    )
    grid = patch_grid(grid_config, new[1] - prefix)
    transformer = dict(params["Transformer"])
    transformer["posembed_input"] = {
      "pos_embedding": resize_posemb(old, grid, num_prefix_tokens=prefix)
    }
    params["Transformer"] = transformer
  return params


def load_pretrained(
  path: str | os.PathLike | Mapping[str, Any], init_params: Mapping[str, Any], model_config: Any
) -> Params:
  """Loads pretrained parameters and adapts them to the model that produced `init_params`.

  - `pre_logits` is dropped when `model_config.representation_size` is None, else kept;
  - `head` (and DeiT's `head_dist`) is replaced by `init_params`' freshly initialised one;
  - masked patch prediction's `mask_embedding` and `mpp_head` (vit_jax.models.mpp) are dropped;
  - position embeddings are resized to the model's patch grid (`patch_grid`); a sincos2d model
    needs none (`ignore_sincos_table`), and a sincos2d checkpoint (no table) fits only one;
  - encoder blocks are stacked or unstacked as in `init_params`; dtypes follow `init_params`.

  Args:
    path: a weights file (see `load`) or a parameter tree in memory.
    init_params: the model's parameters (or variables); leaves may be `jax.ShapeDtypeStruct`s
      except the head's, whose values are used.
    model_config: the model ConfigDict.

  Returns:
    Nested numpy arrays of exactly `init_params`' names and shapes; else ValueError (_check_fit).
  """
  expected = flatten_params(init_params)
  if isinstance(path, Mapping):
    restored = flatten_params(path)
    path = "<in-memory params>"
  else:
    restored = flatten_params(load(path))
  restored = (
    layouts.stack_flat(restored) if layouts.is_stacked(expected) else layouts.unstack_flat(restored)
  )

  if model_config.get("representation_size") is None:
    if any(k.startswith("pre_logits/") for k in restored):
      logging.info("load_pretrained: dropping pre_logits (representation_size=None)")
    restored = {k: v for k, v in restored.items() if not k.startswith("pre_logits/")}
  restored = {k: v for k, v in restored.items() if not k.startswith(_HEADS)}
  mpp_keys = [k for k in restored if k.split("/")[0] in mpp.PARAMS]
  if mpp_keys and not any(k in expected for k in mpp_keys):
    logging.info(
      "load_pretrained: dropping the masked patch prediction head and [mask] embedding (%s)",
      ", ".join(sorted(mpp_keys)),
    )
    restored = {k: v for k, v in restored.items() if k not in mpp_keys}
  for name, value in expected.items():
    if name.startswith(_HEADS):
      if isinstance(value, jax.ShapeDtypeStruct):
        raise ValueError(f"init_params[{name!r}] must be an array: it becomes the new head")
      restored[name] = value

  if POSEMB not in expected and "Transformer/encoder_norm/scale" in expected:  # sincos2d
    ignore_sincos_table(restored, os.fspath(path))
  old, new = restored.get(POSEMB), expected.get(POSEMB)
  if new is not None and old is None and "Transformer/encoder_norm/scale" in restored:
    raise ValueError(f"{os.fspath(path)}: {_NO_TABLE}")
  if old is not None and new is not None and old.shape != new.shape and old.ndim == new.ndim == 3:
    if old.shape[2] == new.shape[2]:
      old_prefix, new_prefix = num_prefix_tokens(restored), num_prefix_tokens(expected)
      if int("cls" in restored) != int("cls" in expected):
        raise ValueError(
          f"{path}: the checkpoint has {'a' if old_prefix else 'no'} class token but the model "
          f"has {'one' if new_prefix else 'none'} (classifier 'token' vs 'gap')"
        )
      grid = patch_grid(model_config, new.shape[1] - new_prefix)
      restored[POSEMB] = resize_posemb(old, grid, num_prefix_tokens=old_prefix)

  _check_fit(restored, expected, path)
  return unflatten_params(
    {k: np.asarray(restored[k]).astype(v.dtype, copy=False) for k, v in expected.items()}
  )


# Module names in the order the network applies them; unlisted names sort after listed ones.
_TOP_ORDER = tuple(
  "root_block conv_root gn_root block embedding cls Transformer group_norm pre_logits head".split()
)
_SUB_ORDER = ("posembed_input", "encoderblock", "encoder_norm", "query", "key", "value", "out")
_LEAF_ORDER = ("kernel", "scale", "bias")


def _network_order(name: str):
  """Sort key: input to output, layers by number (so errors name the earliest layer first)."""

  def rank(part, order):
    index = next((i for i, o in enumerate(order) if part.startswith(o)), len(order))
    number = re.search(r"(\d+)$", part)
    return index, int(number.group(1)) if number else -1, part

  top, *rest = name.split("/")
  ranks = [rank(top, _TOP_ORDER)] + [rank(p, _SUB_ORDER) for p in rest[:-1]]
  return ranks + [rank(leaf, _LEAF_ORDER) for leaf in rest[-1:]]


def _check_fit(restored, expected, path) -> None:
  """Raises a ValueError describing every difference in names and shapes: its first line names
  the first key whose shape differs (both shapes), else the first missing or unexpected one."""
  missing = sorted((k for k in expected if k not in restored), key=_network_order)
  unexpected = sorted((k for k in restored if k not in expected), key=_network_order)
  mismatched = [
    (k, tuple(restored[k].shape), tuple(expected[k].shape))
    for k in sorted(expected, key=_network_order)
    if k in restored and tuple(restored[k].shape) != tuple(expected[k].shape)
  ]
  if not (missing or unexpected or mismatched):
    return
  # The first line carries the reason: it is the one a command prints.
  if mismatched:
    key, got, want = mismatched[0]
    reason = f"first shape mismatch at {key!r}: checkpoint {got} vs model {want}"
  elif missing:
    reason = f"{missing[0]!r} is missing from the checkpoint"
  else:
    reason = f"{unexpected[0]!r} is in the checkpoint but not in the model"
  lines = [f"checkpoint {os.fspath(path)} does not fit the model: {reason}"]
  if len(mismatched) > 1:
    lines.append(
      f"  {len(mismatched) - 1} more shape mismatches: {_listing(k for k, *_ in mismatched[1:])}"
    )
  if missing:
    lines.append(f"  {len(missing)} missing from the checkpoint: {_listing(missing)}")
  if unexpected:
    lines.append(f"  {len(unexpected)} unexpected in the checkpoint: {_listing(unexpected)}")
  raise ValueError("\n".join(lines))


def _listing(names) -> str:
  names = list(names)
  shown = ", ".join(names[:_MAX_LISTED])
  return shown + (f", ... ({len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else "")
