"""Per-example preprocessing described by a string, e.g. `decode|inception_crop|flip_lr|value_range`.

A spec is a `|`-separated list of ops (the grammar: ops/registry.py). Sizes default to the
config's `image_size`, so a config can switch 224 ↔ 384 without editing its specs. Every random op draws from a stateless seed that the pipeline
derives from (seed, the example's position in the run's stream): the same example gets the same
augmentation on a resumed run and on any number of hosts.

Ops (images are uint8 [h, w, 3] between ops, float32 only after `value_range`):
  decode                       encoded JPEG/PNG/GIF/BMP bytes, or a raw uint8 array, → RGB (gray → RGB)
  inception_crop(area_min=0.05, area_max=1.0, aspect_min=0.75, aspect_max=4/3, size=None)
                               random crop of 5–100% of the area, then resize to `size`; right after
                               `decode` on a JPEG it decodes only the crop window
  resize(size=None)            resize to [size, size]; a float size is a multiple of image_size
                               (bilinear, antialiased where an axis shrinks, as every resize here)
  resize_small(size=None)      resize the shorter side to `size`, keeping the aspect ratio
  central_crop(size=None)      crop the central [size, size] window
  random_crop(size=None)       crop a random [size, size] window
  flip_lr                      random left-right flip
  randaugment(num_layers=2, magnitude=10)   RandAugment (Cubuk et al., 2019), see randaugment.py
  value_range(vmin=-1, vmax=1) uint8 [0, 255] → float32 [vmin, vmax]

The ops are registered as the `tf` kind of the one registry (ops/registry.py, which parses the
strings); batching and host logic live in pipeline.py.
"""

import functools
import inspect
from collections.abc import Callable

import tensorflow as tf

from vit_jax.input_pipeline.ops import randaugment as randaugment_lib
from vit_jax.input_pipeline.ops import registry

_register = functools.partial(registry.register, "tf")


def _sized(fn):
  """op(image, rng, image_size, size=None) from fn(image, rng, size): the size resolved
  (registry.resolve_size: None is image_size, a float a fraction of it)."""

  def op(image, rng, image_size, size=None):
    return fn(image, rng, registry.resolve_size(size, image_size))

  op.__name__ = fn.__name__
  return op


def _resize(image: tf.Tensor, height, width) -> tf.Tensor:
  """Bilinear, antialiased where an axis shrinks (a 500px photo to 224). Enlarging, the
  antialiasing filter is bilinear's own (to float rounding) at several times its CPU cost
  (docs/benchmarks.md, "Around the step"), so plain bilinear is used."""

  def resized(antialias: bool) -> tf.Tensor:
    out = tf.image.resize(image, [height, width], antialias=antialias)
    return tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8)

  shrinks = _shrinks(image, height, width)
  if isinstance(shrinks, bool):  # both sizes known when traced
    return resized(shrinks)
  return tf.cond(shrinks, lambda: resized(True), lambda: resized(False))


def _shrinks(image: tf.Tensor, height, width) -> bool | tf.Tensor:
  """Whether resizing `image` to [height, width] shrinks an axis: a bool where every size is
  known when traced, else a bool tensor (tests/test_fingerprint.py replaces it)."""
  sizes = list(zip(image.shape[:2], (height, width), strict=True))
  if all(isinstance(s, int) and isinstance(t, int) for s, t in sizes):
    return any(s > t for s, t in sizes)
  return tf.logical_or(tf.shape(image)[0] > height, tf.shape(image)[1] > width)


def _to_rgb(image: tf.Tensor) -> tf.Tensor:
  """uint8 [h, w, c] with c in {1, 3, 4} (or [h, w]) → [h, w, 3]."""
  if image.shape.rank == 2:
    image = image[:, :, None]
  channels = image.shape[-1]
  if channels == 1:
    image = tf.image.grayscale_to_rgb(image)
  elif channels == 4:
    image = image[:, :, :3]
  elif channels != 3:
    raise ValueError(f"Images must have 1, 3 or 4 channels, got shape {image.shape}.")
  return image


@_register()
def decode(image: tf.Tensor, rng: tf.Tensor, image_size: int) -> tf.Tensor:
  """Encoded bytes (string scalar) or raw uint8 array → uint8 [h, w, 3]."""
  del rng, image_size
  if image.dtype == tf.string:
    image = tf.io.decode_image(image, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image
  return _to_rgb(tf.cast(image, tf.uint8))


def _crop_window(shape, rng, area_min, area_max, aspect_min, aspect_max):
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
    shape,
    bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
    seed=rng,
    min_object_covered=area_min,
    aspect_ratio_range=(aspect_min, aspect_max),
    area_range=(area_min, area_max),
    max_attempts=10,
    use_image_if_no_bounding_boxes=True,
  )
  return begin[0], begin[1], size[0], size[1]


@_register()
def inception_crop(
  image: tf.Tensor,
  rng: tf.Tensor,
  image_size: int,
  area_min: float = 0.05,
  area_max: float = 1.0,
  aspect_min: float = 3 / 4,
  aspect_max: float = 4 / 3,
  size: int | float | None = None,
) -> tf.Tensor:
  """Inception-style random-area, random-aspect crop, resized to [size, size]."""
  size = registry.resolve_size(size, image_size)
  y, x, h, w = _crop_window(tf.shape(image), rng, area_min, area_max, aspect_min, aspect_max)
  return _resize(image[y : y + h, x : x + w], size, size)


def _decode_inception_crop(image: tf.Tensor, rng: tf.Tensor, image_size: int, *args, **kwargs):
  """`decode|inception_crop` fused: JPEGs decode only the crop window (about 2× faster); the
  arguments are inception_crop's."""

  def other():
    return inception_crop(decode(image, rng, image_size), rng, image_size, *args, **kwargs)

  if image.dtype != tf.string:
    return other()
  crop = inspect.signature(inception_crop).bind(image, rng, image_size, *args, **kwargs)
  crop.apply_defaults()
  *_, area_min, area_max, aspect_min, aspect_max, size = crop.arguments.values()
  size = registry.resolve_size(size, image_size)

  def jpeg():
    shape = tf.io.extract_jpeg_shape(image)
    y, x, h, w = _crop_window(shape, rng, area_min, area_max, aspect_min, aspect_max)
    crop = tf.io.decode_and_crop_jpeg(image, tf.stack([y, x, h, w]), channels=3)
    return _resize(crop, size, size)

  return tf.cond(tf.io.is_jpeg(image), jpeg, other)


@_register()
@_sized
def resize(image: tf.Tensor, rng: tf.Tensor, size: int) -> tf.Tensor:
  return _resize(image, size, size)


@_register()
@_sized
def resize_small(image: tf.Tensor, rng: tf.Tensor, size: int) -> tf.Tensor:
  """The shorter side to `size`, the aspect ratio kept."""
  h, w = tf.shape(image)[0], tf.shape(image)[1]
  scale = size / tf.cast(tf.minimum(h, w), tf.float32)
  new_h = tf.maximum(size, tf.cast(tf.round(tf.cast(h, tf.float32) * scale), tf.int32))
  new_w = tf.maximum(size, tf.cast(tf.round(tf.cast(w, tf.float32) * scale), tf.int32))
  return _resize(image, new_h, new_w)


@_register()
@_sized
def central_crop(image: tf.Tensor, rng: tf.Tensor, size: int) -> tf.Tensor:
  y, x = (tf.shape(image)[0] - size) // 2, (tf.shape(image)[1] - size) // 2
  return tf.ensure_shape(image[y : y + size, x : x + size], [size, size, 3])


@_register()
@_sized
def random_crop(image: tf.Tensor, rng: tf.Tensor, size: int) -> tf.Tensor:
  return tf.image.stateless_random_crop(image, [size, size, 3], seed=rng)


@_register()
def flip_lr(image: tf.Tensor, rng: tf.Tensor, image_size: int) -> tf.Tensor:
  del image_size
  return tf.image.stateless_random_flip_left_right(image, seed=rng)


@_register()
def randaugment(
  image: tf.Tensor, rng: tf.Tensor, image_size: int, num_layers: int = 2, magnitude: float = 10
) -> tf.Tensor:
  del image_size
  return randaugment_lib.randaugment(image, rng, num_layers=num_layers, magnitude=magnitude)


@_register()
def value_range(
  image: tf.Tensor, rng: tf.Tensor, image_size: int, vmin: float = -1.0, vmax: float = 1.0
) -> tf.Tensor:
  del rng, image_size
  return tf.cast(image, tf.float32) * ((vmax - vmin) / 255.0) + vmin


def parse_spec(spec: str) -> list[registry.Op]:
  """The ops of a spec of this kind (`registry.parse`): ValueError for an unknown op."""
  return registry.parse(spec, "tf")


def get_preprocess_fn(spec: str, image_size: int) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """`fn(image, rng) -> float32 [image_size, image_size, 3]` of the spec (the module docstring),
  for an encoded image (string scalar) or uint8 array and a stateless seed int64 [2];
  `image_size` is also the default size of the sizing ops."""
  ops = parse_spec(spec)
  steps = [registry.bind(op, "tf") for op in ops]
  for i in reversed(range(len(ops) - 1)):
    if ops[i][0] == "decode" and ops[i + 1][0] == "inception_crop":
      _, args, kwargs = ops[i + 1]
      steps[i : i + 2] = [lambda *x, a=args, k=kwargs: _decode_inception_crop(*x, *a, **k)]

  def fn(image: tf.Tensor, rng: tf.Tensor) -> tf.Tensor:
    if image.dtype == tf.string and ops[0][0] != "decode":
      raise ValueError(f"Preprocessing {spec!r} must start with `decode` for encoded images.")
    rngs = tf.random.experimental.stateless_split(rng, len(steps))
    for k, step in enumerate(steps):
      image = step(image, rngs[k], image_size)
    if image.dtype != tf.float32:
      raise ValueError(f"Preprocessing {spec!r} must end with value_range(...) (float32 output).")
    if not image.shape.is_compatible_with([image_size, image_size, 3]):
      raise ValueError(
        f"Preprocessing {spec!r} yields shape {image.shape}, not [{image_size}, {image_size}, 3]."
      )
    return tf.ensure_shape(image, [image_size, image_size, 3])

  return fn
