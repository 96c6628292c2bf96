"""RandAugment (Cubuk et al., 2019) on uint8 [h, w, 3] images with stateless randomness.

As in the AugReg recipes ("How to train your ViT?"): `num_layers` ops drawn uniformly from the list
below, each at strength `magnitude / 10` (so magnitudes above 10 extrapolate, as in big_vision), and
geometric ops with a random sign. Pixels moved in from outside the image are mid-gray (128).
"""

import math

import tensorflow as tf

_MAX_LEVEL = 10.0
_FILL = 128.0


def _blend(degenerate: tf.Tensor, image: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  """Interpolates (factor in [0, 1]) or extrapolates (factor > 1) from `degenerate` to `image`."""
  d, x = tf.cast(degenerate, tf.float32), tf.cast(image, tf.float32)
  return tf.cast(tf.clip_by_value(d + factor * (x - d), 0.0, 255.0), tf.uint8)


def _transform(image: tf.Tensor, transform: list[tf.Tensor]) -> tf.Tensor:
  """Projective transform (output → input pixel mapping, 8 coefficients), nearest, gray fill."""
  h, w = tf.shape(image)[0], tf.shape(image)[1]
  out = tf.raw_ops.ImageProjectiveTransformV3(
    images=tf.cast(image, tf.float32)[None],
    transforms=tf.cast(tf.stack(transform), tf.float32)[None],
    output_shape=tf.stack([h, w]),
    fill_value=_FILL,
    interpolation="NEAREST",
    fill_mode="CONSTANT",
  )[0]
  return tf.cast(out, tf.uint8)


def _autocontrast(image, level):
  del level
  x = tf.cast(image, tf.float32)
  lo = tf.reduce_min(x, axis=[0, 1], keepdims=True)
  hi = tf.reduce_max(x, axis=[0, 1], keepdims=True)
  scaled = (x - lo) * 255.0 / tf.maximum(hi - lo, 1.0)
  return tf.cast(tf.where(hi > lo, scaled, x), tf.uint8)


def _equalize_channel(channel: tf.Tensor) -> tf.Tensor:
  hist = tf.math.bincount(tf.cast(channel, tf.int32), minlength=256, maxlength=256)
  last = tf.gather(hist, tf.reduce_max(tf.where(hist > 0)))  # count of the brightest value
  step = (tf.reduce_sum(hist) - last) // 255
  lut = (tf.cumsum(hist) + step // 2) // tf.maximum(step, 1)
  lut = tf.clip_by_value(tf.concat([[0], lut[:-1]], 0), 0, 255)
  return tf.where(step > 0, tf.cast(tf.gather(lut, tf.cast(channel, tf.int32)), tf.uint8), channel)


def _equalize(image, level):
  del level
  return tf.stack([_equalize_channel(image[:, :, c]) for c in range(3)], axis=-1)


def _rotate(image, level):
  angle = level / _MAX_LEVEL * 30.0 * math.pi / 180.0
  h, w = tf.cast(tf.shape(image)[0], tf.float32), tf.cast(tf.shape(image)[1], tf.float32)
  cos, sin = tf.cos(angle), tf.sin(angle)
  x_off = ((w - 1) - (cos * (w - 1) - sin * (h - 1))) / 2.0
  y_off = ((h - 1) - (sin * (w - 1) + cos * (h - 1))) / 2.0
  return _transform(image, [cos, -sin, x_off, sin, cos, y_off, 0.0, 0.0])


def _solarize(image, level):
  threshold = tf.cast(256.0 - tf.abs(level) / _MAX_LEVEL * 256.0, tf.float32)
  x = tf.cast(image, tf.float32)
  return tf.cast(tf.where(x >= threshold, 255.0 - x, x), tf.uint8)


def _color(image, level):
  return _blend(
    tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image)), image, 1.0 + level * 0.09
  )


def _posterize(image, level):
  shift = tf.clip_by_value(tf.cast(tf.abs(level) / _MAX_LEVEL * 4.0, tf.int32), 0, 7)
  return tf.bitwise.left_shift(
    tf.bitwise.right_shift(image, tf.cast(shift, tf.uint8)), tf.cast(shift, tf.uint8)
  )


def _contrast(image, level):
  mean = tf.reduce_mean(tf.cast(tf.image.rgb_to_grayscale(image), tf.float32))
  return _blend(tf.fill(tf.shape(image), mean), image, 1.0 + level * 0.09)


def _brightness(image, level):
  return _blend(tf.zeros_like(image), image, 1.0 + level * 0.09)


def _sharpness(image, level):
  x = tf.cast(image, tf.float32)[None]
  kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
  kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
  blurred = tf.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], padding="VALID")[0]
  # Border pixels stay as they are (as PIL's ImageFilter.SMOOTH does).
  blurred = tf.pad(blurred, [[1, 1], [1, 1], [0, 0]])
  border = tf.pad(tf.zeros_like(blurred[1:-1, 1:-1]), [[1, 1], [1, 1], [0, 0]], constant_values=1.0)
  blurred = border * x[0] + (1.0 - border) * blurred
  return _blend(blurred, image, 1.0 + level * 0.09)


def _shear_x(image, level):
  s = level / _MAX_LEVEL * 0.3
  return _transform(image, [1.0, s, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])


def _shear_y(image, level):
  s = level / _MAX_LEVEL * 0.3
  return _transform(image, [1.0, 0.0, 0.0, s, 1.0, 0.0, 0.0, 0.0])


def _translate_x(image, level):
  dx = level / _MAX_LEVEL * 0.45 * tf.cast(tf.shape(image)[1], tf.float32)
  return _transform(image, [1.0, 0.0, -dx, 0.0, 1.0, 0.0, 0.0, 0.0])


def _translate_y(image, level):
  dy = level / _MAX_LEVEL * 0.45 * tf.cast(tf.shape(image)[0], tf.float32)
  return _transform(image, [1.0, 0.0, 0.0, 0.0, 1.0, -dy, 0.0, 0.0])


def _identity(image, level):
  del level
  return image


# `level` reaching each op is signed (magnitude with a random sign); ops without a direction use |level|.
AUGMENTATIONS = (_identity, _autocontrast, _equalize, _rotate, _solarize, _color, _posterize)
AUGMENTATIONS += (_contrast, _brightness, _sharpness, _shear_x, _shear_y, _translate_x)
AUGMENTATIONS += (_translate_y,)


def randaugment(
  image: tf.Tensor, rng: tf.Tensor, num_layers: int = 2, magnitude: float = 10
) -> tf.Tensor:
  """uint8 [h, w, 3] → uint8 [h, w, 3] after `num_layers` random ops in sequence, each of
  strength `magnitude` (0–10 nominal, more extrapolates), drawn from the stateless seed `rng`."""
  image = tf.ensure_shape(tf.cast(image, tf.uint8), [None, None, 3])
  rngs = tf.random.experimental.stateless_split(rng, 2 * num_layers)
  for layer in range(num_layers):
    index = tf.random.stateless_uniform(
      [], rngs[2 * layer], maxval=len(AUGMENTATIONS), dtype=tf.int32
    )
    sign = tf.where(tf.random.stateless_uniform([], rngs[2 * layer + 1]) < 0.5, -1.0, 1.0)
    level = sign * float(magnitude)
    branches = [lambda op=op, image=image, level=level: op(image, level) for op in AUGMENTATIONS]
    image = tf.switch_case(index, branches)
    image = tf.ensure_shape(image, [None, None, 3])
  return image
