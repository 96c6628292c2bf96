"""What a failed restore of a training checkpoint step says about that step.

`evidence`: why an error shows that the step itself is broken (a file of the step missing,
truncated or undecodable, metadata that does not parse, arrays stored with other shapes than the
step's metadata records), or None. `mismatch`: how the model's state differs from the step's
metadata (another config: `CheckpointMismatch`, nothing moved). Anything else (I/O, network,
memory, a library's error) says nothing about the step: it is retried after each of
RETRY_DELAYS_S, then `CheckpointRestoreError` (docs/training.md, "Stopping, faults and
recovery").

This file must not import TensorFlow.
"""

import errno
import json
import os
import re
from typing import Any

import jax

# Seconds before each retry of a restore that failed without evidence (then the run ends).
RETRY_DELAYS_S = (2.0, 10.0, 30.0)
# Orbax's file of a pytree item's metadata (tree structure, shapes, dtypes).
METADATA_FILE = "_METADATA"

# TensorStore reports a failed read as ValueError("<CODE>: <message>").
_BROKEN_CODES = ("DATA_LOSS", "OUT_OF_RANGE", "NOT_FOUND")
_UNDECODABLE_CODES = ("FAILED_PRECONDITION", "INVALID_ARGUMENT")
_UNDECODABLE = re.compile(r"[Tt]runcated|[Cc]orrupt|[Dd]ecod|Invalid JSON")
# Orbax's error for an array whose stored shape is not the one requested.
_STORED_SHAPE = "not compatible with the stored shape"


class CheckpointRestoreError(OSError):
  """A step could not be restored and there is no evidence it is broken (see the module)."""


class CheckpointMismatch(ValueError):  # noqa: N818 - named for what it is, like ValueError
  """A checkpoint step holds other parameters or shapes than the model being trained."""


def chain(error: BaseException) -> list[BaseException]:
  """`error` and its causes, outermost first."""
  chain, seen = [], error
  while seen is not None and len(chain) < 20:
    chain.append(seen)
    seen = seen.__cause__ or seen.__context__
  return chain


def evidence(error: BaseException, step_dir: str | os.PathLike, metadata_fits: bool) -> str | None:
  """Why `error`, raised while restoring the step in `step_dir`, shows that step is broken, or
  None. A missing file counts only if named inside `step_dir`; a stored shape other than the one
  requested counts only if `metadata_fits` (the model matched the step's metadata)."""
  step = os.fspath(step_dir).rstrip("/") + "/"  # "/20/", never a prefix of "/200/"
  for e in chain(error):
    text = str(e)
    if isinstance(e, json.JSONDecodeError):
      return f"a metadata file of the step does not parse: {e}"
    if isinstance(e, FileNotFoundError) or (isinstance(e, OSError) and e.errno == errno.ENOENT):
      named = " ".join(str(x) for x in (e.filename, text) if x)
      if step in named or named.rstrip("/") + "/" == step:
        return f"a file of the step is missing: {one_line(text)}"
    code = text.split(":", 1)[0].strip()
    if code in _BROKEN_CODES and step in text:
      return f"a file of the step is truncated or missing: {one_line(text)}"
    if code in _UNDECODABLE_CODES and step in text and _UNDECODABLE.search(text):
      return f"a file of the step does not decode: {one_line(text)}"
    if metadata_fits and _STORED_SHAPE in text:
      return f"an array's stored shape differs from the step's metadata: {one_line(text)}"
  return None


def mismatch(saved: Any, target: Any) -> str | None:
  """How the model's state `target` (ShapeDtypeStructs) differs from a step's metadata `saved`
  (Orbax's tree of array metadata), or None when every array has its name and shape there.
  dtypes may differ (Orbax casts on restore)."""
  saved_shapes, target_shapes = _shapes(saved), _shapes(target)
  missing = sorted(set(target_shapes) - set(saved_shapes))
  extra = sorted(set(saved_shapes) - set(target_shapes))
  if missing:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return f"the model's {missing[0]}{more} is not in the checkpoint"
  if extra:
    more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
    return f"the checkpoint's {extra[0]}{more} is not in the model"
  for name, shape in target_shapes.items():
    if saved_shapes[name] != shape:
      return f"{name} is {saved_shapes[name]} in the checkpoint, {shape} in the model"
  return None


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """'params/Transformer/.../kernel' -> shape, for every array of `tree` (tuples, lists, dicts
  and named tuples alike: Orbax's metadata keeps a named tuple as a dict)."""
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    if not hasattr(leaf, "shape"):
      continue
    parts = (getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)
    out["/".join(str(p) for p in parts)] = tuple(int(d) for d in leaf.shape)
  return out


def one_line(text: str) -> str:
  """The first line of `text`, without TensorStore's spec (a kilobyte of JSON)."""
  line = text.strip().splitlines()[0].split(" [tensorstore_spec=")[0] if text.strip() else ""
  return line if len(line) <= 400 else line[:400] + "..."
