"""Predict's preprocessing: the deterministic evaluation ops on a PIL image, without TensorFlow.

The `pil` kind of the one registry (ops/registry.py): `decode` (to RGB: grey is replicated, alpha
dropped), `resize`, `resize_small`, `central_crop` and `value_range`, as ops/preprocess.py defines
them for tf.data; a random (training) op is not one of them. vit_jax.inference runs a checkpoint's
saved `pp_eval` with them.
"""

import functools

import numpy as np
from PIL import Image

from vit_jax.input_pipeline.ops import registry

_register = functools.partial(registry.register, "pil")


def _resize(image: Image.Image, height: int, width: int) -> Image.Image:
  # Bilinear with PIL's support scaled on shrinking: antialiased, like the TF pipeline.
  return image.resize((width, height), Image.Resampling.BILINEAR)


@_register()
def decode(image: Image.Image, image_size: int) -> Image.Image:
  del image_size
  return image.convert("RGB")


@_register()
def resize(image: Image.Image, image_size: int, size=None) -> Image.Image:
  size = registry.resolve_size(size, image_size)
  return _resize(image, size, size)


@_register()
def resize_small(image: Image.Image, image_size: int, size=None) -> Image.Image:
  size = registry.resolve_size(size, image_size)
  w, h = image.size
  scale = size / min(h, w)
  return _resize(image, max(size, round(h * scale)), max(size, round(w * scale)))


@_register()
def central_crop(image: Image.Image, image_size: int, size=None) -> Image.Image:
  size = registry.resolve_size(size, image_size)
  w, h = image.size
  y, x = (h - size) // 2, (w - size) // 2
  return image.crop((x, y, x + size, y + size))


@_register()
def value_range(image: Image.Image, image_size: int, vmin=-1.0, vmax=1.0) -> np.ndarray:
  del image_size
  return np.asarray(image.convert("RGB"), np.float32) * ((vmax - vmin) / 255.0) + vmin


def preprocess(image: Image.Image, image_size: int, spec: str) -> np.ndarray:
  """A PIL image → float32 [image_size, image_size, 3] per the evaluation spec (without a
  `value_range`, [-1, 1])."""
  out = image
  for step in registry.build(spec, "pil"):
    out = step(out, image_size)
  if isinstance(out, Image.Image):
    out = value_range(out, image_size)
  if out.shape != (image_size, image_size, 3):
    raise ValueError(f"{spec!r} gave shape {out.shape}, not ({image_size}, {image_size}, 3)")
  return out
