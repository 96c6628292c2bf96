"""Slices of a split in tfds's syntax (`train[:800]`, `train[:98%]`, `train[98%:]`) for the
sources that hold a split as a list of examples (the bundled datasets, image folders).

A slice takes its range of a fixed shuffle of the split (seed 0), kept in the split's order: the
bundled files and a folder's listing are sorted by class, so a range of them would hold few
classes. Slices of one split are nested (`train[:1000]` ⊂ `train[:2000]`) or disjoint
(`train[:98%]`, `train[98%:]`), and `train[:100%]` is `train`. No TensorFlow here.
"""

import re

import numpy as np

_SLICE_RE = re.compile(r"^(\w+)\[(-?\d+%?)?:(-?\d+%?)?\]$")


def base_split(split: str) -> str:
  """The split a slice is of: `'train[:98%]'` → `'train'`; a plain name is itself."""
  match = _SLICE_RE.match(split.replace(" ", ""))
  return match.group(1) if match else split


def _bound(text: str | None, n: int, default: int) -> int:
  if not text:
    return default
  value = round(n * int(text[:-1]) / 100) if text.endswith("%") else int(text)
  return value + n if value < 0 else min(value, n)


def slice_rows(split: str, n: int, what: str) -> np.ndarray | None:
  """The rows, int64 sorted, that slice `split` takes of its split's `n` examples; None for a
  plain split name (all rows). `what` names the split in the error of an empty slice."""
  match = _SLICE_RE.match(split.replace(" ", ""))
  if not match:
    return None
  start, stop = _bound(match.group(2), n, 0), _bound(match.group(3), n, n)
  if start >= stop:
    raise ValueError(f"{what}: slice {split!r} of {n} examples is empty")
  return np.sort(np.random.default_rng(0).permutation(n)[start:stop])


def take(split: str, what: str, *columns):
  """The rows of `columns` (lists or arrays of one length) in the slice of `split`, all of them
  for a plain split; `what` names the data in an error."""
  rows = slice_rows(split, len(columns[0]), what)
  if rows is None:
    return columns
  return tuple(c[rows] if isinstance(c, np.ndarray) else [c[i] for i in rows] for c in columns)
