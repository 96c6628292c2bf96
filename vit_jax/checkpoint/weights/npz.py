"""Reads and writes ViT parameters as `.npz` (and `.safetensors`) files.

The file format is the published vit_jax one: flat `/`-separated names with the pre-linen
counters (`Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/query/kernel`, ...), one
array per name, never pickled. `load` also reads big_vision files (renamed by `layouts`) and
timm / Hugging Face `.safetensors` (renamed by `timm_hf`; docs/interop.md). BiT ResNets
(vit_jax.models.bit) keep the published BiT layout, their in-memory names behind a `resnet/`
prefix. In memory, parameters are nested dicts of numpy arrays with the module names of
`vit_jax.models.vit`; with `scan=True` the blocks are one `Transformer/encoderblock` subtree
whose leaves have a leading [num_layers] axis.

Paths with a scheme (`gs://...`) go through `tf.io.gfile`, imported only then: this module must
import without TensorFlow.
"""

import io
import json
import logging
import os
import tempfile
import uuid
import zipfile
import zlib
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

from vit_jax.checkpoint.weights import layouts, timm_hf

Params = dict[str, Any]  # nested dict of np.ndarray

# Files of parameters (as opposed to Orbax checkpoint directories).
PARAM_FILE_SUFFIXES = (".npz", ".safetensors")
# PyTorch's pickled checkpoints, which `load` refuses by name (never unpickled).
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# What a Hugging Face or timm model directory holds next to its weights (and vit_jax.tools.convert
# writes there). Not the workdir's stage config, vit_jax.runtime.workdir.CONFIG_FILE.
WEIGHTS_CONFIG_FILE = "config.json"
# How a zip file starts (a first entry, or an empty archive): every `.npz` is one.
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


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


def _open(path: str, mode: str = "rb"):
  return _gfile().GFile(path, mode) if _is_remote(path) else open(path, mode)


def is_params_file(path: str | os.PathLike) -> bool:
  """Whether `path` names a file of parameters, not an Orbax directory (pickles included: `load`
  refuses them by name, so a caller routing a path here says so)."""
  return os.fspath(path).endswith(PARAM_FILE_SUFFIXES + PICKLE_SUFFIXES)


def load(path: str | os.PathLike, num_heads: int | None = None) -> Params:
  """Loads the parameters of a vit_jax, big_vision, BiT, timm or Hugging Face file (the layout
  is recognised from the names).

  Args:
    path: local path, or any `tf.io.gfile` path (`gs://...`) when TensorFlow is installed.
    num_heads: attention heads of a PyTorch-layout file; None reads it from the `config.json`
      beside the file, else takes the preset's of the same width.

  Returns:
    Nested dict of numpy arrays in the published layout (BiT: without `resnet/`); scan-stacked
    files stay stacked.

  Raises:
    ValueError: a pickle (by its name), not the archive its name says, truncated or corrupt,
      object arrays, or names with no faithful mapping; the message names the file.
  """
  path = os.fspath(path)
  if path.endswith(PICKLE_SUFFIXES):
    raise ValueError(
      f"{path}: a pickle, which this loader never unpickles (loading a pickle can run "
      "arbitrary code); export the state dict as safetensors: "
      "safetensors.torch.save_file(model.state_dict(), 'model.safetensors')"
    )
  flat = _read_safetensors(path) if path.endswith(".safetensors") else _read_npz(path)
  if timm_hf.layout_of(flat) is not None:
    fields = timm_hf.config_fields(read_foreign_config(path))
    eps = fields.get("layer_norm_eps", 1e-6)
    if eps != 1e-6:
      logging.warning(
        "%s: its config sets layer_norm_eps=%g; vit_jax's LayerNorm uses 1e-6 (a difference "
        "of the order of 1e-6 relative in the activations)",
        path,
        eps,
      )
    num_heads = num_heads or fields.get("num_heads")
    return unflatten_params(timm_hf.from_torch(flat, num_heads, source=path))
  return unflatten_params(layouts.to_vit_jax_layout(flat))


def _read_npz(path: str) -> dict[str, np.ndarray]:
  with _open(path) as f:
    head = f.read(8)
    if not head.startswith(_ZIP_MAGIC):
      what = (
        "it is a single .npy array" if head.startswith(b"\x93NUMPY") else f"it starts with {head!r}"
      )
      raise ValueError(f"{path}: not an .npz archive (a zip of arrays); {what}")
    f.seek(0)
    flat = {}
    try:
      with np.load(f, allow_pickle=False) as npz:
        for name in npz.files:
          try:
            flat[name] = npz[name]
          except ValueError as e:
            if "allow_pickle" not in str(e):  # numpy refusing an object array
              raise ValueError(f"{path}: truncated or corrupt .npz: array {name!r}: {e}") from e
            raise ValueError(
              f"{path}: array {name!r} cannot be read without unpickling; checkpoints must "
              "hold plain numeric arrays, and this loader never unpickles"
            ) from e
    except (zipfile.BadZipFile, EOFError, zlib.error) as e:
      raise ValueError(f"{path}: truncated or corrupt .npz: {e}") from e
  return flat


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  with _open(path) as f:  # a missing local file raises FileNotFoundError here, as for .npz
    data = f.read()
  try:
    return dict(safetensors.numpy.load(data))
  except Exception as e:  # safetensors raises its own SafetensorError for a malformed header
    raise ValueError(f"{path}: not a readable safetensors file ({e})") from e


def file_layout(path: str | os.PathLike) -> str:
  """'timm' or 'hf' for a PyTorch-layout file, else 'npz'; reads only the names."""
  path = os.fspath(path)
  if path.endswith(".safetensors") and not _is_remote(path):
    with safetensors.safe_open(path, framework="np") as f:
      names = list(f.keys())
  elif path.endswith(".safetensors"):
    names = list(_read_safetensors(path))
  else:
    with _open(path) as f, np.load(f, allow_pickle=False) as npz:
      names = list(npz.files)
  return timm_hf.layout_of(dict.fromkeys(names)) or "npz"


def read_foreign_config(path: str | os.PathLike) -> dict[str, Any] | None:
  """The timm or transformers `config.json` beside weights file `path`, if any (a vit_jax stage
  config, with a `model` entry, is not one)."""
  path = os.fspath(path)
  config_path = os.path.join(os.path.dirname(path), WEIGHTS_CONFIG_FILE)
  if not (_gfile().exists(config_path) if _is_remote(path) else os.path.isfile(config_path)):
    return None
  with _open(config_path, "r") as f:
    text = f.read()
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{config_path} is not valid JSON ({e})") from e
  if not isinstance(config, dict) or "model" in config:
    return None
  return config


def save(params: Mapping[str, Any], path: str | os.PathLike) -> None:
  """Writes `params` (nested, or a variables dict) to `path` as an `.npz` in the published
  vit_jax (or BiT) layout: blocks unstacked, bfloat16 as float32 (exact), renamed over `path`
  once complete. A `posemb='sincos2d'` model's table is added by `checkpoint.with_posemb_table`
  (without it: a warning, and only sincos2d models read the file). Multi-host: call it from one
  process, with fully addressable arrays. `.npz` is not appended.
  """
  flat = layouts.unstack_flat(flatten_params(params))
  if "Transformer/encoder_norm/scale" in flat and layouts.POSEMB not in flat:
    logging.warning(
      "save %s: no %s (a posemb='sincos2d' model's parameters): the published loaders and "
      "posemb='learn' models need it; write it first with checkpoint.with_posemb_table",
      os.fspath(path),
      layouts.POSEMB,
    )
  flat = layouts.with_bit_prefix(flat)
  for name, value in flat.items():
    if isinstance(value, jax.ShapeDtypeStruct):
      raise ValueError(f"{name!r} is a ShapeDtypeStruct, not an array")
    if value.dtype == jnp.bfloat16:
      flat[name] = value.astype(np.float32)
  _write_atomically(path, lambda f: np.savez(f, allow_pickle=False, **flat))


def save_safetensors(flat: Mapping[str, np.ndarray], path: str | os.PathLike) -> None:
  """Writes a flat state dict (`timm_hf.to_timm` / `to_hf`) as a `.safetensors` file, dtypes
  kept, with the `{'format': 'pt'}` metadata transformers expects, renamed over `path` once
  complete."""
  flat = {k: np.ascontiguousarray(v) for k, v in flat.items()}
  _write_atomically(
    path, lambda f: f.write(safetensors.numpy.save(flat, metadata={"format": "pt"}))
  )


def _write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
  """`write(file)` to a temporary file beside `path`, then renamed over it: a failure never
  leaves a truncated `path` behind."""
  path = os.fspath(path)
  if _is_remote(path):
    gfile = _gfile()
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    buffer = io.BytesIO()  # zipfile needs tell(), which not every gfile filesystem has.
    write(buffer)
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
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def stack_encoder_blocks(params: Mapping[str, Any]) -> Params:
  """`Transformer/encoderblock_{i}/...` → `Transformer/encoderblock/...`, leading [L] axis."""
  return unflatten_params(layouts.stack_flat(flatten_params(params)))


def unstack_encoder_blocks(params: Mapping[str, Any]) -> Params:
  """`Transformer/encoderblock/...` [L, ...] → `Transformer/encoderblock_{i}/...`."""
  return unflatten_params(layouts.unstack_flat(flatten_params(params)))
