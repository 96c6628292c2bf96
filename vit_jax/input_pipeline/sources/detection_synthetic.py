"""The offline synthetic detection tasks (`det_builtin`), made from the bundled real images.

A canvas: CANVAS×CANVAS grey pixels (uint8, one channel). Its background is a coarse texture of
8×8 blocks, each of a value uniform in [0, 40), plus per-pixel noise uniform in [0, 20) (at
most 58). On it, 1 to 4 objects (uniform) are drawn one after the other: each a random image of
the object dataset (bright on black, 28×28) resized bilinearly to s×s, s uniform in [12, 36],
put at a top-left corner uniform over the positions where it fits whole, so objects may overlap
or touch (a later one is drawn over an earlier one). An object's pixels >= 32 replace the
canvas's. Its box is the tight box of its own pixels >= 96, in canvas pixels (integers: ymin,
xmin inclusive, ymax, xmax exclusive), whatever a later object covers; its class is the image's
class. An image none of whose resized pixels reach 96 is drawn again. Annotation ids run from 1
over the split, category ids are class + 1.

Splits (SPLIT_SIZES): train and val take their objects from a fixed 90/10 permutation of the
object dataset's train split, test from its test split; every draw from GENERATOR_SEED. numpy
and PIL; a split is made once per process and held in memory (4,000 canvases: 16 MB).
"""

import collections
import functools

import numpy as np

from vit_jax.input_pipeline import splits
from vit_jax.input_pipeline.ops.segmentation import resize
from vit_jax.input_pipeline.sources import builtin

GENERATOR_SEED = 0
CANVAS = 64
MIN_SIZE, MAX_SIZE = 12, 36
MAX_OBJECTS = 4
SPLIT_SIZES = {"train": 4000, "val": 500, "test": 1000}
# name → the bundled classification dataset whose images are the objects.
SYNTHETIC = {
  "fashion_mnist_det": "fashion_mnist",
  "mnist_det": "mnist_5k",
  "animal_mnist_det": "animal_mnist",
}

# A split: images uint8 [N, canvas, canvas, 1], objects float64 [n, 8] per canvas
# (detection.OBJECT_COLUMNS), names (`split/i`).
SyntheticSplit = collections.namedtuple("SyntheticSplit", ["images", "objects", "names"])


def make_synthetic(
  objects: np.ndarray, labels: np.ndarray, num: int, seed: int, canvas: int = CANVAS
) -> tuple[np.ndarray, list[np.ndarray]]:
  """`num` canvases (the module docstring) of `objects` uint8 [N, h, w, 1] of classes `labels`
  [N], every draw from `seed`: images uint8 [num, canvas, canvas, 1] and objects float64
  [n, 8] per canvas."""
  rng = np.random.default_rng(seed)
  images = np.zeros((num, canvas, canvas), np.uint8)
  block = 8
  coarse = rng.integers(0, 40, (num, canvas // block + 1, canvas // block + 1))
  background = coarse.repeat(block, axis=1).repeat(block, axis=2)[:, :canvas, :canvas]
  images[:] = background + rng.integers(0, 20, (num, canvas, canvas))
  counts = rng.integers(1, MAX_OBJECTS + 1, num)
  rows, next_id = [], 1
  for n in range(num):
    boxes = []
    while len(boxes) < counts[n]:
      i = int(rng.integers(len(labels)))
      size = int(rng.integers(MIN_SIZE, MAX_SIZE + 1))
      y, x = (int(v) for v in rng.integers(0, canvas - size + 1, 2))
      obj = resize(objects[i, ..., 0], (size, size), nearest=False)
      bright = obj >= 96
      if not bright.any():
        continue
      shown = obj >= 32
      images[n, y : y + size, x : x + size][shown] = obj[shown]
      ys, xs = np.flatnonzero(bright.any(1)), np.flatnonzero(bright.any(0))
      box = (y + ys[0], x + xs[0], y + ys[-1] + 1, x + xs[-1] + 1)
      label = int(labels[i])
      boxes.append((*box, label, 0, next_id, label + 1))
      next_id += 1
    rows.append(np.asarray(boxes, np.float64).reshape(-1, 8))
  return images[..., None], rows


def check_name(name: str) -> None:
  if name not in SYNTHETIC:
    raise ValueError(f"det_builtin dataset {name!r}; expected one of {sorted(SYNTHETIC)}")


@functools.cache
def synthetic_split(name: str, split: str) -> SyntheticSplit:
  """The canvases of a split (a plain split name: `train`, `val` or `test`)."""
  check_name(name)
  if split not in SPLIT_SIZES:
    raise ValueError(
      f"det_builtin dataset {name!r} has no split {split!r}; splits: {sorted(SPLIT_SIZES)}"
    )
  objects, labels = builtin.objects_of_split(SYNTHETIC[name], split, GENERATOR_SEED)
  seed = GENERATOR_SEED * 1000 + {"train": 0, "val": 1, "test": 2}[split]
  images, boxes = make_synthetic(objects, labels, SPLIT_SIZES[split], seed=seed)
  return SyntheticSplit(images, boxes, [f"{split}/{i}" for i in range(len(boxes))])


def get_split(name: str, split: str) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
  """(images, objects per canvas, names) of a split or a slice of one (`train[:1000]`,
  vit_jax.input_pipeline.splits)."""
  base = splits.base_split(split)
  data = synthetic_split(name, base)
  return splits.take(split, f"detection split {base!r}", data.images, data.objects, data.names)


def synthetic_class_names(name: str) -> list[str]:
  """The object dataset's classes (no background class)."""
  check_name(name)
  return list(builtin.load(SYNTHETIC[name]).class_names)


def num_examples(split: str) -> int | None:
  """Canvases of a split or slice, without making them; None for a split the tasks lack."""
  n = SPLIT_SIZES.get(splits.base_split(split))
  if n is None:
    return None
  rows = splits.slice_rows(split, n, f"detection split {split!r}")
  return n if rows is None else len(rows)
