"""Segmentation's preprocessing: ops that move an image and its mask together, in numpy and PIL.

The `segmentation` kind of the one registry (ops/registry.py), for `pp_train` / `pp_eval` of the
segmentation sources (docs/segmentation.md): `random_crop`, `flip_lr` and `resize` (the final
resize that `augment` always does). Arrays, not tf.data: image and mask ops are simplest to keep
aligned on arrays.
"""

import functools
from collections.abc import Callable

import numpy as np
from PIL import Image

from vit_jax.input_pipeline.ops import registry

_register = functools.partial(registry.register, "segmentation")


def resize(array: np.ndarray, hw: tuple[int, int], nearest: bool) -> np.ndarray:
  """uint8 [h, w] or [h, w, c] → [hw[0], hw[1], ...] with PIL (bilinear or nearest)."""
  if array.shape[:2] == tuple(hw):
    return array
  squeeze = array.ndim == 3 and array.shape[2] == 1
  image = Image.fromarray(array[..., 0] if squeeze else array)
  out = np.asarray(image.resize((hw[1], hw[0]), Image.NEAREST if nearest else Image.BILINEAR))
  return out[..., None] if squeeze else out


@_register()
def random_crop(image, mask, rng: np.random.Generator, min_area: float = 0.5):
  h, w = mask.shape
  area = h * w * rng.uniform(min_area, 1.0)
  aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
  ch = int(min(h, max(1, round(np.sqrt(area / aspect)))))
  cw = int(min(w, max(1, round(np.sqrt(area * aspect)))))
  y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
  return image[y : y + ch, x : x + cw], mask[y : y + ch, x : x + cw]


@_register()
def flip_lr(image, mask, rng: np.random.Generator):
  return (image[:, ::-1], mask[:, ::-1]) if rng.random() < 0.5 else (image, mask)


@_register("resize")
def _resize_last(image, mask, rng, *_):
  del rng  # `augment` ends with the resize to image_size
  return image, mask


def build(spec: str) -> list[Callable]:
  """The ops of a segmentation spec ('' for none), for `augment`."""
  return registry.build(spec, "segmentation", empty_ok=True)


def augment(
  image: np.ndarray,
  mask: np.ndarray,
  ops: list[Callable],
  size: int,
  rng: np.random.Generator | None,
) -> tuple[np.ndarray, np.ndarray]:
  """Applies `ops` (`build`) to image uint8 [h, w, c] and mask uint8 [h, w] alike, then resizes
  both to size×size; returns image float32 [size, size, 3] in [-1, 1] and labels int32
  [size, size]."""
  for step in ops:
    image, mask = step(image, mask, rng)
  image = resize(np.ascontiguousarray(image), (size, size), nearest=False)
  mask = resize(np.ascontiguousarray(mask), (size, size), nearest=True)
  if image.ndim == 2:
    image = image[..., None]
  if image.shape[2] == 1:
    image = np.repeat(image, 3, axis=2)
  return (image.astype(np.float32) / 127.5 - 1.0), mask.astype(np.int32)
