"""Reads and writes ViT parameters as `.npz` files, and adapts pretrained ones for fine-tuning.

The file format is the published vit_jax one: flat `/`-separated names with the pre-linen
counters (`Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/query/kernel`, ...), one
array per name, never pickled. `load` also reads big_vision files (renamed by
`checkpoint_convert`) and timm / Hugging Face state dicts in `.safetensors` files (renamed by
`checkpoint_torch`, read with safetensors' numpy API: no torch); `save` always writes the
published layout, with encoder blocks unstacked, and `save_safetensors` a PyTorch-side layout.
BiT ResNets (vit_jax.models_bit) are read and written in the published BiT layout
(`resnet/root_block/standardized_conv2d/kernel`, `resnet/block1/unit01/a/...`,
`resnet/head/conv2d/...`), whose names are the in-memory ones behind a `resnet/` prefix.

In memory, parameters are nested dicts of numpy arrays with the module names of
`vit_jax.models_vit` (the published names); with `scan=True` the blocks are one
`Transformer/encoderblock` subtree whose leaves have a leading [num_layers] axis.

Paths with a scheme (`gs://...`) go through `tf.io.gfile`, imported only then: this module must
import without TensorFlow. Training state (optimizer, step) is Orbax's business, not this file's.
"""

import io
import json
import logging
import math
import os
import re
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import safetensors
import safetensors.numpy

from vit_jax import checkpoint_convert, checkpoint_torch

Params = dict[str, Any]  # nested dict of np.ndarray

POSEMB = "Transformer/posembed_input/pos_embedding"
# Files of parameters (as opposed to Orbax checkpoint directories).
PARAM_FILE_SUFFIXES = (".npz", ".safetensors")
# What a Hugging Face or timm model directory holds next to its weights.
CONFIG_FILE = "config.json"
# Entries beyond this many are counted, not listed, in error messages.
_MAX_LISTED = 40


# ---------------------------------------------------------------------------------------------
# Trees and files.


def flatten_params(params: Mapping[str, Any]) -> dict[str, Any]:
  """Flattens nested dicts to `{'a/b/c': leaf}` in insertion order; jax arrays become numpy."""
  flat = {}

  def visit(prefix, node):
    for key, value in node.items():
      name = f"{prefix}{key}"
      if isinstance(value, Mapping):
        visit(name + "/", value)
      else:
        flat[name] = _to_numpy(name, value)

  visit("", _unwrap(params))
  return flat


def unflatten_params(flat: Mapping[str, Any]) -> Params:
  """Inverse of `flatten_params`: `{'a/b': x}` → `{'a': {'b': x}}`."""
  tree = {}
  for name, value in flat.items():
    *parents, leaf = name.split("/")
    node = tree
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return tree


def _unwrap(params):
  # Accept a whole variables dict (`model.init(...)`) as well as its 'params' collection.
  if isinstance(params, Mapping) and set(params) == {"params"}:
    return params["params"]
  return params


def _to_numpy(name, value):
  if isinstance(value, jax.ShapeDtypeStruct):  # shape-only trees (jax.eval_shape) pass through
    return value
  if isinstance(value, jax.Array) and not value.is_fully_addressable:
    raise ValueError(
      f"{name!r} is sharded across hosts; gather it first (e.g. "
      "jax.experimental.multihost_utils.process_allgather) and write from one process"
    )
  return np.asarray(value)


def _gfile():
  try:
    import tensorflow as tf  # Optional, and slow to import: only for remote paths.
  except ImportError as e:
    raise ImportError(
      "paths like gs://... need TensorFlow (tf.io.gfile); install tensorflow-cpu"
    ) from e
  return tf.io.gfile


def _is_remote(path) -> bool:
  return "://" in os.fspath(path)


def is_params_file(path: str | os.PathLike) -> bool:
  """Whether `path` names a file `load` reads (`.npz` or `.safetensors`), not a directory."""
  return os.fspath(path).endswith(PARAM_FILE_SUFFIXES)


def load(path: str | os.PathLike, num_heads: int | None = None) -> Params:
  """Loads the parameters of a vit_jax, big_vision, BiT, timm or Hugging Face file.

  The layout is recognised from the names: `.npz` files in the vit_jax or big_vision layout,
  `.safetensors` files holding a timm `VisionTransformer` (plain or R50 hybrid) or a Hugging
  Face `ViTModel` / `ViTForImageClassification` state dict (see `checkpoint_torch`).

  Args:
    path: local path, or any `tf.io.gfile` path (`gs://...`) when TensorFlow is installed.
    num_heads: attention heads of a PyTorch-layout file, whose arrays do not say; None reads it
      from the `config.json` beside the file, else takes the preset's of the same width.

  Returns:
    Nested dict of numpy arrays in the published vit_jax layout (BiT: its layout without the
    `resnet/` prefix). Scan-stacked files stay stacked (`Transformer/encoderblock`); see
    `stack_encoder_blocks`.

  Raises:
    ValueError: the file holds pickled (object) arrays, names with no faithful mapping, or an
      architecture this ViT cannot represent.
  """
  path = os.fspath(path)
  if path.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl")):
    raise ValueError(
      f"{path} is a pickle, which this loader never unpickles: save the state dict as "
      "safetensors (safetensors.torch.save_file(model.state_dict(), 'model.safetensors'))"
    )
  flat = _read_safetensors(path) if path.endswith(".safetensors") else _read_npz(path)
  if checkpoint_torch.layout_of(flat) is not None:
    fields = checkpoint_torch.config_fields(read_foreign_config(path))
    eps = fields.get("layer_norm_eps", 1e-6)
    if eps != 1e-6:
      logging.warning(
        "%s: its config sets layer_norm_eps=%g; vit_jax's LayerNorm uses 1e-6 (a difference "
        "of the order of 1e-6 relative in the activations)",
        path,
        eps,
      )
    num_heads = num_heads or fields.get("num_heads")
    return unflatten_params(checkpoint_torch.from_torch(flat, num_heads, source=path))
  return unflatten_params(checkpoint_convert.to_vit_jax_layout(flat))


def _read_npz(path: str) -> dict[str, np.ndarray]:
  opener = _gfile().GFile if _is_remote(path) else open
  with opener(path, "rb") as f:
    npz = np.load(f, allow_pickle=False)
    if not isinstance(npz, np.lib.npyio.NpzFile):
      raise ValueError(f"{path} is not an .npz archive of named parameters")
    flat = {}
    with npz:
      for name in npz.files:
        try:
          flat[name] = npz[name]
        except ValueError as e:
          raise ValueError(
            f"{path}: array {name!r} cannot be read without unpickling ({e}); checkpoints must "
            "hold plain numeric arrays, and this loader never unpickles"
          ) from e
  return flat


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  if _is_remote(path):
    with _gfile().GFile(path, "rb") as f:
      data = f.read()
  else:
    with open(path, "rb") as f:  # a missing file raises FileNotFoundError here, as for .npz
      data = f.read()
  try:
    return dict(safetensors.numpy.load(data))
  except Exception as e:  # safetensors raises its own SafetensorError for a malformed header
    raise ValueError(f"{path}: not a readable safetensors file ({e})") from e


def file_layout(path: str | os.PathLike) -> str:
  """'timm' or 'hf' for a PyTorch-layout file, else 'npz' (vit_jax or big_vision names).

  Reads only the names (a safetensors header, an npz directory), not the arrays.
  """
  path = os.fspath(path)
  if path.endswith(".safetensors") and not _is_remote(path):
    with safetensors.safe_open(path, framework="np") as f:
      names = list(f.keys())
  elif path.endswith(".safetensors"):
    names = list(_read_safetensors(path))
  else:
    opener = _gfile().GFile if _is_remote(path) else open
    with opener(path, "rb") as f, np.load(f, allow_pickle=False) as npz:
      names = list(npz.files)
  return checkpoint_torch.layout_of(dict.fromkeys(names)) or "npz"


def read_foreign_config(path: str | os.PathLike) -> dict[str, Any] | None:
  """The timm or transformers `config.json` in the directory of weights file `path`, if any.

  A vit_jax stage config (the trainer's `config.json`, with a `model` entry) is not one.
  """
  path = os.fspath(path)
  config_path = os.path.join(os.path.dirname(path), CONFIG_FILE)
  if _is_remote(path):
    gfile = _gfile()
    if not gfile.exists(config_path):
      return None
    with gfile.GFile(config_path, "r") as f:
      text = f.read()
  else:
    if not os.path.isfile(config_path):
      return None
    with open(config_path) as f:
      text = f.read()
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{config_path} is not valid JSON ({e})") from e
  if not isinstance(config, dict) or "model" in config:
    return None
  return config


def save(params: Mapping[str, Any], path: str | os.PathLike) -> None:
  """Writes parameters as an `.npz` in the published vit_jax (or, for BiT, BiT) layout.

  Scan-stacked encoder blocks are written unstacked, and bfloat16 leaves as float32 (exact), so
  the file reads anywhere the published checkpoints do. The file is written next to `path` under
  a temporary name and renamed over it, so a failure never leaves a truncated `path` behind. In a
  multi-host job call this from one process, with fully addressable arrays.

  Args:
    params: nested dict of arrays (or a variables dict with a single 'params' entry).
    path: destination; `.npz` is not appended.
  """
  flat = checkpoint_convert.unstack_flat(flatten_params(params))
  flat = checkpoint_convert.with_bit_prefix(flat)
  for name, value in flat.items():
    if isinstance(value, jax.ShapeDtypeStruct):
      raise ValueError(f"{name!r} is a ShapeDtypeStruct, not an array")
    if value.dtype == jnp.bfloat16:
      flat[name] = value.astype(np.float32)
  path = os.fspath(path)
  if _is_remote(path):
    gfile = _gfile()
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    buffer = io.BytesIO()  # zipfile needs tell(), which not every gfile filesystem has.
    np.savez(buffer, allow_pickle=False, **flat)
    try:
      with gfile.GFile(tmp, "wb") as f:
        f.write(buffer.getvalue())
      gfile.rename(tmp, path, overwrite=True)
    finally:
      if gfile.exists(tmp):
        gfile.remove(tmp)
    return
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez(f, allow_pickle=False, **flat)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def save_safetensors(flat: Mapping[str, np.ndarray], path: str | os.PathLike) -> None:
  """Writes a flat state dict (`checkpoint_torch.to_timm` / `to_hf`) as a `.safetensors` file.

  The file carries the `{'format': 'pt'}` metadata that transformers expects, is written with
  safetensors' numpy API (no torch) under a temporary name and renamed over `path`. Dtypes are
  kept (safetensors holds bfloat16).
  """
  path = os.fspath(path)
  flat = {k: np.ascontiguousarray(v) for k, v in flat.items()}
  if _is_remote(path):
    data = safetensors.numpy.save(flat, metadata={"format": "pt"})
    gfile = _gfile()
    with gfile.GFile(path, "wb") as f:
      f.write(data)
    return
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
  os.close(fd)
  try:
    safetensors.numpy.save_file(flat, tmp, metadata={"format": "pt"})
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


# ---------------------------------------------------------------------------------------------
# Stacked (scan) and unstacked encoder blocks.


def stack_encoder_blocks(params: Mapping[str, Any]) -> Params:
  """`Transformer/encoderblock_{i}/...` → `Transformer/encoderblock/...`, leading [L] axis."""
  return unflatten_params(checkpoint_convert.stack_flat(flatten_params(params)))


def unstack_encoder_blocks(params: Mapping[str, Any]) -> Params:
  """`Transformer/encoderblock/...` [L, ...] → `Transformer/encoderblock_{i}/...`."""
  return unflatten_params(checkpoint_convert.unstack_flat(flatten_params(params)))


# ---------------------------------------------------------------------------------------------
# Position embeddings.


def resize_posemb(
  posemb: np.ndarray,
  new_grid: int | Sequence[int],
  num_prefix_tokens: int = 1,
  old_grid: Sequence[int] | None = None,
) -> np.ndarray:
  """Resizes learned position embeddings to another patch grid (paper §3.2).

  The grid part is interpolated bicubically in 2-D (float32, on the host CPU, with pixel-centre
  alignment: the embedding of a patch is read where its centre lies in the old grid); the class
  token's slot is kept bit for bit.

  Args:
    posemb: [1, num_prefix_tokens + gh*gw, D].
    new_grid: target grid, `g` for g×g or `(gh, gw)`.
    num_prefix_tokens: leading slots that are not on the grid (1 with a class token, 0 for gap).
    old_grid: `(gh, gw)` of `posemb`; inferred when the grid is square.

  Returns:
    [1, num_prefix_tokens + new_gh*new_gw, D], in `posemb`'s dtype.
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


def patch_grid(model_config: Any, num_patches: int) -> tuple[int, int]:
  """The model's patch grid (gh, gw).

  Computed from `model_config.image_size` (int or (h, w)) and the patch size, including the
  hybrid's ResNet downsampling; without `image_size`, the grid must be square.

  Args:
    model_config: the model ConfigDict.
    num_patches: gh*gw, from the model's position embedding; checked against `image_size`.

  Returns:
    (gh, gw).
  """
  image_size = model_config.get("image_size")
  if image_size is None:
    s = math.isqrt(num_patches)
    if s * s != num_patches:
      raise ValueError(
        f"the model has {num_patches} patches, not a square grid; set model_config.image_size "
        "to (height, width) so the position embeddings can be laid out"
      )
    return s, s
  h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
  resnet = model_config.get("resnet")
  if resnet is not None:
    # Stride-2 SAME root conv and max-pool, then one stride-2 SAME stage per stage after the first.
    for _ in range(2 + len(resnet["num_layers"]) - 1):
      h, w = -(-h // 2), -(-w // 2)
  p = model_config.patch_size
  ph, pw = (p, p) if isinstance(p, int) else tuple(p)
  grid = (h // ph, w // pw)
  if grid[0] * grid[1] != num_patches:
    raise ValueError(
      f"model_config.image_size={image_size} gives a {grid[0]}x{grid[1]} patch grid, but the "
      f"model's position embedding has {num_patches} patches"
    )
  return grid


def fit_posemb(
  params: Mapping[str, Any],
  model: Any,
  model_config: Any,
  image_size: int | Sequence[int],
) -> Params:
  """`params` with position embeddings resized for `model` at `image_size` (a shallow copy).

  What the linear probe and predict do with a checkpoint used at another resolution than it was
  trained at (fine-tuning goes through `load_pretrained`, which does the same and more).

  Args:
    params: nested parameters of a ViT (`Transformer/posembed_input/pos_embedding` [1, T, D]).
    model: the Flax module that will apply them.
    model_config: its ConfigDict (patch size, ResNet stem).
    image_size: the input resolution, `s` or `(h, w)`.
  """
  if "Transformer" not in params:  # a BiT ResNet: no position embeddings, any resolution
    return dict(params)
  h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
  shapes = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, h, w, 3)), train=False)["params"]
  )
  old = params["Transformer"]["posembed_input"]["pos_embedding"]
  new = shapes["Transformer"]["posembed_input"]["pos_embedding"]
  params = dict(params)
  if old.shape != new.shape:
    prefix = int("cls" in params)
    grid_config = ml_collections.ConfigDict(dict(model_config.to_dict(), image_size=(h, w)))
    grid = patch_grid(grid_config, new.shape[1] - prefix)
    transformer = dict(params["Transformer"])
    transformer["posembed_input"] = {
      "pos_embedding": resize_posemb(old, grid, num_prefix_tokens=prefix)
    }
    params["Transformer"] = transformer
  return params


# ---------------------------------------------------------------------------------------------
# Fine-tuning from a pretrained file.


def load_pretrained(
  path: str | os.PathLike | Mapping[str, Any], init_params: Mapping[str, Any], model_config: Any
) -> Params:
  """Loads pretrained parameters and adapts them to the model that produced `init_params`.

  - `pre_logits` is dropped when `model_config.representation_size` is None, else kept;
  - `head` is replaced by `init_params`' freshly initialised head (the new number of classes);
  - `mask_embedding` and `mpp_head` of a masked patch prediction run (vit_jax.mpp) are dropped;
  - position embeddings are resized bicubically to the model's patch grid (`patch_grid`);
  - encoder blocks are stacked or unstacked as in `init_params`; dtypes follow `init_params`.

  Args:
    path: a vit_jax or big_vision `.npz` or a timm / Hugging Face `.safetensors` (see `load`),
      or a parameter tree already in memory
      (e.g. restored from a pretraining run's Orbax checkpoint).
    init_params: the model's parameters (or a variables dict with one 'params' entry). Leaves
      may be `jax.ShapeDtypeStruct`s except the head's, whose values are used.
    model_config: the model ConfigDict (`representation_size`, `patch_size`, optional
      `image_size` and `resnet`).

  Returns:
    Nested dict of numpy arrays with exactly `init_params`' names and shapes.

  Raises:
    ValueError: the file does not fit the model; the message names the first key whose shape
      differs (with both shapes) and lists missing and unexpected keys.
  """
  expected = flatten_params(init_params)
  if isinstance(path, Mapping):
    restored = flatten_params(path)
    path = "<in-memory params>"
  else:
    restored = flatten_params(load(path))
  restored = (
    checkpoint_convert.stack_flat(restored)
    if checkpoint_convert.is_stacked(expected)
    else checkpoint_convert.unstack_flat(restored)
  )

  if model_config.get("representation_size") is None:
    if any(k.startswith("pre_logits/") for k in restored):
      logging.info("load_pretrained: dropping pre_logits (representation_size=None)")
    restored = {k: v for k, v in restored.items() if not k.startswith("pre_logits/")}
  restored = {k: v for k, v in restored.items() if not k.startswith("head/")}
  mpp_keys = [k for k in restored if k == "mask_embedding" or k.startswith("mpp_head/")]
  if mpp_keys and not any(k in expected for k in mpp_keys):
    logging.info(
      "load_pretrained: dropping the masked patch prediction head and [mask] embedding (%s)",
      ", ".join(sorted(mpp_keys)),
    )
    restored = {k: v for k, v in restored.items() if k not in mpp_keys}
  for name, value in expected.items():
    if name.startswith("head/"):
      if isinstance(value, jax.ShapeDtypeStruct):
        raise ValueError(f"init_params[{name!r}] must be an array: it becomes the new head")
      restored[name] = value

  old, new = restored.get(POSEMB), expected.get(POSEMB)
  if old is not None and new is not None and old.shape != new.shape and old.ndim == new.ndim == 3:
    if old.shape[2] == new.shape[2]:
      old_prefix, new_prefix = int("cls" in restored), int("cls" in expected)
      if old_prefix != new_prefix:
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
_TOP_ORDER = (
  "root_block",
  "conv_root",
  "gn_root",
  "block",
  "embedding",
  "cls",
  "Transformer",
  "group_norm",
  "pre_logits",
  "head",
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
  """Raises a ValueError describing every difference in names and shapes."""
  missing = sorted((k for k in expected if k not in restored), key=_network_order)
  unexpected = sorted((k for k in restored if k not in expected), key=_network_order)
  mismatched = [
    (k, tuple(restored[k].shape), tuple(expected[k].shape))
    for k in sorted(expected, key=_network_order)
    if k in restored and tuple(restored[k].shape) != tuple(expected[k].shape)
  ]
  if not (missing or unexpected or mismatched):
    return
  lines = [f"checkpoint {os.fspath(path)} does not fit the model:"]
  if mismatched:
    key, got, want = mismatched[0]
    lines.append(f"  first shape mismatch at {key!r}: checkpoint {got} vs model {want}")
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
