"""The offline synthetic segmentation tasks (`seg_builtin`), made from the bundled real images.

The canvases, their labels and splits: docs/segmentation.md (`seg_builtin`), made from
GENERATOR_SEED. numpy and PIL; a split is made once per process and held in memory (4,000
canvases: 9 MB).
"""

import collections
import functools

import numpy as np

from vit_jax.input_pipeline import splits
from vit_jax.input_pipeline.ops.segmentation import resize
from vit_jax.input_pipeline.sources import builtin
from vit_jax.input_pipeline.sources.segmentation import IGNORE_LABEL

GENERATOR_SEED = 0
CANVAS = 48
SPLIT_SIZES = {"train": 4000, "val": 500, "test": 1000}
# name → the bundled classification dataset whose images are the objects.
SYNTHETIC = {
  "fashion_mnist_seg": "fashion_mnist",
  "mnist_seg": "mnist_5k",
  "animal_mnist_seg": "animal_mnist",
}


# A split: images uint8 [N, canvas, canvas, 1], masks uint8 [N, canvas, canvas], names (`split/i`).
SyntheticSplit = collections.namedtuple("SyntheticSplit", ["images", "masks", "names"])


def make_synthetic(
  objects: np.ndarray, labels: np.ndarray, num: int, seed: int, canvas: int = CANVAS
) -> tuple[np.ndarray, np.ndarray]:
  """`num` canvases (docs/segmentation.md, `seg_builtin`) of `objects` uint8 [N, 28, 28, 1]
  (bright on black) of classes `labels` [N], every draw from `seed`: images uint8 [num, canvas,
  canvas, 1] and masks uint8 [num, canvas, canvas]."""
  rng = np.random.default_rng(seed)
  images = np.zeros((num, canvas, canvas), np.uint8)
  masks = np.zeros((num, canvas, canvas), np.uint8)
  block = 6
  for n in range(num):
    coarse = rng.integers(0, 40, (canvas // block + 1,) * 2)
    background = np.kron(coarse, np.ones((block, block)))[:canvas, :canvas]
    images[n] = (background + rng.integers(0, 20, (canvas, canvas))).astype(np.uint8)
    for _ in range(int(rng.integers(1, 4))):
      i = int(rng.integers(len(labels)))
      size = int(rng.integers(16, 29))
      obj = resize(objects[i, ..., 0], (size, size), nearest=False)
      y, x = (int(v) for v in rng.integers(0, canvas - size + 1, 2))
      shown = obj >= 32
      images[n, y : y + size, x : x + size][shown] = obj[shown]
      window = masks[n, y : y + size, x : x + size]
      window[shown] = IGNORE_LABEL
      window[obj >= 96] = int(labels[i]) + 1
  return images[..., None], masks


def check_name(name: str) -> None:
  if name not in SYNTHETIC:
    raise ValueError(f"seg_builtin dataset {name!r}; expected one of {sorted(SYNTHETIC)}")


@functools.cache
def synthetic_split(name: str, split: str) -> SyntheticSplit:
  """The canvases of a split (a plain split name: `train`, `val` or `test`)."""
  check_name(name)
  if split not in SPLIT_SIZES:
    raise ValueError(
      f"seg_builtin dataset {name!r} has no split {split!r}; splits: {sorted(SPLIT_SIZES)}"
    )
  objects, labels = builtin.objects_of_split(SYNTHETIC[name], split, GENERATOR_SEED)
  seed = GENERATOR_SEED * 1000 + {"train": 0, "val": 1, "test": 2}[split]
  images, masks = make_synthetic(objects, labels, SPLIT_SIZES[split], seed=seed)
  return SyntheticSplit(images, masks, [f"{split}/{i}" for i in range(len(masks))])


def get_split(name: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """(images, masks) of a split or a slice of one (`train[:1000]`, vit_jax.input_pipeline.splits)."""
  base = splits.base_split(split)
  data = synthetic_split(name, base)
  return splits.take(split, f"segmentation split {base!r}", data.images, data.masks)


def synthetic_class_names(name: str) -> list[str]:
  """Background, then the object dataset's classes."""
  check_name(name)
  return ["background", *builtin.load(SYNTHETIC[name]).class_names]
