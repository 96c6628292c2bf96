"""Detection's preprocessing: ops that move an image and its boxes together, in numpy and PIL.

The `detection` kind of the one registry (ops/registry.py), for `pp_train` / `pp_eval` of the
detection sources (docs/data.md, "Detection data"): `flip_lr`, `scale_jitter` (ViTDet's
large-scale jitter) and `resize` (the final resize to image_size×image_size, not preserving the
aspect ratio, that `augment` always does). An op takes (image uint8 [h, w, c], objects float64
[n, 8] (sources/detection.py: box corners in pixels of `image` first), rng, image_size) and
returns them moved alike; it may drop objects.
"""

import functools
from collections.abc import Callable

import numpy as np

from vit_jax.input_pipeline.ops import registry
from vit_jax.input_pipeline.ops.segmentation import resize

_register = functools.partial(registry.register, "detection")


@_register()
def flip_lr(image, objects, rng: np.random.Generator, size: int):
  """Mirrors left-right with probability 1/2."""
  del size
  if rng.random() >= 0.5:
    return image, objects
  width = image.shape[1]
  out = objects.copy()
  out[:, 1], out[:, 3] = width - objects[:, 3], width - objects[:, 1]
  return image[:, ::-1], out


@_register()
def scale_jitter(image, objects, rng: np.random.Generator, size: int, min_scale=0.1, max_scale=2.0):
  """Large-scale jitter: resizes the image (aspect kept) so that its longer side is f·size, f
  uniform in [min_scale, max_scale], then takes a random size×size window of it, zero-padded
  where the image is smaller. Boxes are clipped to the window; a box left with under half of its
  area, or with no width or height, is dropped."""
  h, w = image.shape[:2]
  scale = rng.uniform(min_scale, max_scale) * size / max(h, w)
  nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
  image = resize(np.ascontiguousarray(image), (nh, nw), nearest=False)
  boxes = objects[:, :4] * np.array([nh / h, nw / w, nh / h, nw / w])
  y0, x0 = int(rng.integers(0, max(nh - size, 0) + 1)), int(rng.integers(0, max(nw - size, 0) + 1))
  window = image[y0 : y0 + size, x0 : x0 + size]
  out = np.zeros((size, size, *image.shape[2:]), image.dtype)
  out[: window.shape[0], : window.shape[1]] = window
  area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
  boxes = boxes - np.array([y0, x0, y0, x0])
  hw = np.array([window.shape[0], window.shape[1]] * 2)
  boxes = np.clip(boxes, 0, hw)
  bh, bw = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
  keep = (bh > 0) & (bw > 0) & (bh * bw >= 0.5 * area)
  moved = objects.copy()
  moved[:, :4] = boxes
  return out, moved[keep]


@_register("resize")
def _resize_last(image, objects, rng, size):
  del rng, size  # `augment` ends with the resize to image_size
  return image, objects


def build(spec: str) -> list[Callable]:
  """The ops of a detection spec ('' for none), for `augment`."""
  return registry.build(spec, "detection", empty_ok=True)


def augment(
  image: np.ndarray,
  objects: np.ndarray,
  ops: list[Callable],
  size: int,
  rng: np.random.Generator | None,
) -> tuple[np.ndarray, np.ndarray]:
  """Applies `ops` (`build`) to image uint8 [h, w, c] and objects float64 [n, 8] alike, then
  resizes the image to size×size; returns image float32 [size, size, 3] in [-1, 1] and the
  objects kept, their boxes normalized to [0, 1] of the image."""
  for step in ops:
    image, objects = step(image, objects, rng, size)
  h, w = image.shape[:2]
  image = resize(np.ascontiguousarray(image), (size, size), nearest=False)
  if image.ndim == 2:
    image = image[..., None]
  if image.shape[2] == 1:
    image = np.repeat(image, 3, axis=2)
  out = objects.copy()
  out[:, :4] = objects[:, :4] / np.array([h, w, h, w], np.float64)
  return image.astype(np.float32) / 127.5 - 1.0, out
