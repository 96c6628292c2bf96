"""Preprocessing ops and specs: crops, resolutions, gray → RGB, RandAugment, value range, errors."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageEnhance, ImageOps

from tests.helpers import synthetic_data
from vit_jax.input_pipeline.ops import preprocess, randaugment

RNG = tf.constant([1, 2], tf.int64)


def _photo(height=60, width=90, channels=3):
  # Smooth content, so JPEG round trips are close and crops are meaningful.
  y, x = np.mgrid[0:height, 0:width]
  image = np.stack(
    [(x * 255 // width), (y * 255 // height), ((x + y) * 127 // (width + height))], -1
  )
  return image[..., :channels].astype(np.uint8)


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
@pytest.mark.parametrize("size", [28, 224, 384])
def test_train_spec_any_resolution(fmt, size):
  fn = preprocess.get_preprocess_fn("decode|inception_crop|flip_lr|value_range(-1, 1)", size)
  out = fn(tf.constant(synthetic_data.encode(_photo(), fmt)), RNG).numpy()
  assert out.shape == (size, size, 3) and out.dtype == np.float32
  assert -1.0 <= out.min() and out.max() <= 1.0


def test_same_seed_same_augmentation_other_seed_differs():
  fn = preprocess.get_preprocess_fn("decode|inception_crop|flip_lr|value_range", 32)
  data = tf.constant(synthetic_data.encode(_photo(), "jpeg"))
  a, b = fn(data, RNG).numpy(), fn(data, RNG).numpy()
  np.testing.assert_array_equal(a, b)
  others = [fn(data, tf.constant([1, s], tf.int64)).numpy() for s in range(3, 8)]
  assert any(not np.array_equal(a, o) for o in others)


def test_inception_crop_area_and_fused_jpeg_path_agree():
  # Full-area crops (area_min=1) of a JPEG: the fused decode-and-crop and the plain path agree.
  data = tf.constant(synthetic_data.encode(_photo(64, 64), "jpeg"))
  fused = preprocess.get_preprocess_fn("decode|inception_crop(1.0)|value_range(0, 255)", 32)
  a = fused(data, RNG).numpy()
  expected = preprocess.resize(preprocess.decode(data, RNG, 32), RNG, 32).numpy().astype(np.float32)
  np.testing.assert_allclose(a, expected, atol=1)


def _coordinates(height, width):
  """uint8 [h, w, 3] whose pixel (y, x) holds (y, x, a mix): a crop tells where it came from."""
  y, x = np.mgrid[0:height, 0:width]
  return np.stack([y, x, (7 * y + 3 * x) % 256], -1).astype(np.uint8)


@pytest.mark.parametrize("seed", range(4))
def test_non_fused_decode_path_equals_the_fused_one(seed):
  """decode, then inception_crop (any spec where the two are not adjacent) crops the same window
  of the same pixels as the fused decode-and-crop; on PNG (the fused op's non-JPEG branch) both
  are the window of the original array, resized."""
  rng = tf.constant([5, seed], tf.int64)
  photo = _photo(48, 64)
  window = [
    int(v) for v in preprocess._crop_window(tf.constant(photo.shape), rng, 0.05, 1, 0.75, 4 / 3)
  ]
  y, x, h, w = window
  assert (h, w) != (48, 64)  # a real crop, not the whole image
  crop = tf.image.resize(photo[y : y + h, x : x + w], [24, 24], antialias=True)
  expected = np.clip(np.round(crop.numpy()), 0, 255)
  for fmt in ("png", "jpeg"):
    data = tf.constant(synthetic_data.encode(photo, fmt))
    fused = preprocess._decode_inception_crop(data, rng, 24).numpy().astype(int)
    plain = preprocess.inception_crop(preprocess.decode(data, rng, 24), rng, 24).numpy()
    if fmt == "png":  # lossless: exactly the original's window
      np.testing.assert_array_equal(plain, expected)
      np.testing.assert_array_equal(fused, expected)
    else:  # decoding only a window of a JPEG differs from a full decode at block edges
      assert np.abs(fused - plain).max() <= 3 and np.abs(fused - plain).mean() < 0.5
      assert np.abs(plain - expected).mean() < 2  # and both are that window of the photo
  # The plain decode is the image in the bytes: a PNG exactly, a JPEG as PIL decodes it.
  for fmt, atol in (("png", 0), ("jpeg", 3)):
    data = synthetic_data.encode(photo, fmt)
    ours = preprocess.decode(tf.constant(data), rng, 24).numpy().astype(int)
    pil = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    assert np.abs(ours - pil).max() <= atol


def _ramp(height, width):
  """uint8 [h, w, 3]: channel 0 = 2x, channel 1 = 3y (linear: a resize keeps it inside)."""
  y, x = np.mgrid[0:height, 0:width]
  return np.stack([2 * x, 3 * y, np.zeros_like(x)], -1).astype(np.uint8)


def _resized_ramp(out, height, width, border=2):
  """Asserts `out` is the ramp of a [height, width] image sampled at the output pixel centres."""
  out_h, out_w = out.shape[:2]
  cx = (np.arange(out_w) + 0.5) * width / out_w - 0.5  # output pixel centres in input pixels
  cy = (np.arange(out_h) + 0.5) * height / out_h - 0.5
  inner = slice(border, -border)  # the filter is renormalised (so biased) at the borders
  np.testing.assert_allclose(
    out[:, inner, 0], np.broadcast_to(2 * cx[inner], (out_h, out_w - 2 * border)), atol=0.5
  )
  np.testing.assert_allclose(
    out[inner, :, 1], np.broadcast_to(3 * cy[inner, None], (out_h - 2 * border, out_w)), atol=0.5
  )


@pytest.mark.parametrize(
  "shape,size,resized",
  [((40, 80), 20, (20, 40)), ((60, 45), 15, (20, 15)), ((33, 100), 10, (10, 30))],
)
def test_resize_small_keeps_the_aspect_ratio(shape, size, resized):
  image = _ramp(*shape)
  out = preprocess.resize_small(tf.constant(image), RNG, size).numpy()
  assert out.shape[:2] == resized  # the short side is `size`, the long one round(ratio * size)
  _resized_ramp(out.astype(np.float64), *shape)


def test_eval_resize_small_central_crop():
  image = _ramp(40, 80)
  fn = preprocess.get_preprocess_fn("decode|resize_small|central_crop|value_range(0, 255)", 20)
  out = fn(tf.constant(image), RNG).numpy()
  # The central 20x20 of the 20x40 resize: columns 10..29, so channel 0 follows 2x from x = 21.
  resized = preprocess.resize_small(tf.constant(image), RNG, 20).numpy()
  np.testing.assert_array_equal(out, resized[:, 10:30].astype(np.float32))
  np.testing.assert_allclose(
    out[5:-5, 5:-5, 0], np.broadcast_to(2 * (2 * np.arange(15, 25) + 0.5), (10, 10)), atol=0.5
  )


def test_grayscale_and_rgba_become_rgb():
  fn = preprocess.get_preprocess_fn("decode|resize|value_range(0, 255)", 16)
  gray = fn(tf.constant(synthetic_data.encode(_photo(channels=1), "jpeg")), RNG).numpy()
  assert gray.shape == (16, 16, 3) and (gray[..., 0] == gray[..., 1]).all()
  raw_gray = fn(tf.constant(_photo(channels=1)), RNG).numpy()
  assert (raw_gray[..., 0] == raw_gray[..., 2]).all()
  rgba = np.concatenate([_photo(), np.full((60, 90, 1), 7, np.uint8)], -1)
  assert fn(tf.constant(synthetic_data.encode(rgba, "png")), RNG).shape == (16, 16, 3)


def test_value_range():
  fn = preprocess.get_preprocess_fn("decode|value_range(-1, 1)", 2)
  out = fn(tf.constant(np.array([[[0], [255]], [[0], [255]]], np.uint8)), RNG).numpy()
  np.testing.assert_allclose(out[:, :, 0], [[-1, 1], [-1, 1]])


def test_resize_by_a_ratio_of_image_size():
  # resize(1.25) at image_size 16: 20x20, the image's content resampled (not cropped or padded).
  out = preprocess.resize(tf.constant(_ramp(60, 90)), RNG, 16, size=1.25).numpy()
  assert out.shape == (20, 20, 3)
  _resized_ramp(out.astype(np.float64), 60, 90)


def _tent_resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """float64 reference: a separable triangle filter over pixel centres, its support widened by
  the shrink factor on an axis that shrinks (antialiasing), the weights normalised in the image."""

  def weights(size_in: int, size_out: int) -> np.ndarray:
    support = max(1.0, size_in / size_out)
    centres = (np.arange(size_out) + 0.5) * size_in / size_out
    w = np.maximum(0.0, 1 - np.abs(np.arange(size_in)[None] + 0.5 - centres[:, None]) / support)
    return w / w.sum(1, keepdims=True)

  out = np.einsum("yh,hwc->ywc", weights(image.shape[0], height), image.astype(np.float64))
  return np.einsum("xw,ywc->yxc", weights(image.shape[1], width), out)


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize(
  "shape, size",
  [((28, 28), (32, 32)), ((60, 90), (24, 24)), ((20, 90), (32, 32)), ((32, 32), (32, 32))],
)
def test_resize_antialiases_only_an_axis_that_shrinks(shape, size, static):
  """Within rounding of the float64 filter, shrinking or enlarging (one axis each in the third
  case), with sizes known when traced or not; enlarging alone takes plain bilinear, whose
  antialiased twin (several times its CPU time) differs from it only in float rounding."""
  image = np.random.default_rng(0).integers(0, 256, (*shape, 3)).astype(np.uint8)
  spec = [None, None, 3] if not static else [*shape, 3]
  resize = tf.function(
    lambda x: preprocess._resize(x, *size), input_signature=[tf.TensorSpec(spec, tf.uint8)]
  )
  out = resize(tf.constant(image)).numpy()
  assert out.shape == (*size, 3) and out.dtype == np.uint8
  assert np.abs(out - _tent_resize(image, *size)).max() <= 0.5 + 1e-3
  if shape[0] <= size[0] and shape[1] <= size[1]:
    plain = tf.image.resize(image, size, antialias=False).numpy()
    np.testing.assert_array_equal(out, np.clip(np.round(plain), 0, 255))


def test_random_crop_is_a_window_at_a_valid_offset():
  image = _coordinates(40, 50)
  offsets = set()
  for seed in range(40):
    out = preprocess.random_crop(tf.constant(image), tf.constant([3, seed], tf.int64), 16).numpy()
    y, x = int(out[0, 0, 0]), int(out[0, 0, 1])
    assert 0 <= y <= 40 - 16 and 0 <= x <= 50 - 16
    np.testing.assert_array_equal(out, image[y : y + 16, x : x + 16])
    offsets.add((y, x))
  assert len(offsets) > 20  # offsets really vary with the seed
  # In a spec, after resize(1.25): a 16x16 window of the 20x20 resize.
  fn = preprocess.get_preprocess_fn("decode|resize(1.25)|random_crop|value_range(0, 255)", 16)
  out = fn(tf.constant(_photo()), RNG).numpy()
  resized = preprocess.resize(tf.constant(_photo()), RNG, 16, size=1.25).numpy()
  assert any(
    np.array_equal(out, resized[y : y + 16, x : x + 16]) for y in range(5) for x in range(5)
  )


def test_every_randaugment_op_keeps_shape_and_dtype():
  image = tf.constant(_photo(24, 32))
  for op in randaugment.AUGMENTATIONS:
    for level in (-10.0, 3.0, 15.0):
      out = op(image, tf.constant(level))
      assert out.dtype == tf.uint8 and out.shape == (24, 32, 3), op.__name__
  out = randaugment.randaugment(image, RNG, num_layers=3, magnitude=15)
  np.testing.assert_array_equal(
    out, randaugment.randaugment(image, RNG, num_layers=3, magnitude=15)
  )


def test_randaugment_applies_one_of_its_ops_at_the_magnitude():
  """One layer: the output is one of the ops at +-magnitude, and many ops are drawn over seeds."""
  image = tf.constant(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
  candidates = {
    (op.__name__, sign): op(image, tf.constant(sign * 7.0)).numpy()
    for op in randaugment.AUGMENTATIONS
    for sign in (-1, 1)
  }
  drawn = set()
  for seed in range(40):
    out = randaugment.randaugment(image, tf.constant([0, seed], tf.int64), 1, 7).numpy().astype(int)
    # Within one level: the op ran inside a graph here, eagerly for the candidates.
    names = {n for (n, _), c in candidates.items() if np.abs(out - c.astype(int)).max() <= 1}
    assert names, seed
    drawn |= names
  assert len(drawn) >= 10


def _pil(fn, image, *args):
  return np.asarray(fn(Image.fromarray(image), *args)).astype(int)


def test_randaugment_ops_do_what_they_say():
  rng = np.random.default_rng(0)
  noise = rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)
  square = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
  every_value = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, -1)
  narrow = np.clip(rng.normal(100, 10, (20, 30, 3)), 0, 255).astype(np.uint8)  # low contrast

  def op(name, image, level):
    fn = {f.__name__: f for f in randaugment.AUGMENTATIONS}[name]
    return fn(tf.constant(image), tf.constant(float(level))).numpy()

  # Geometry (nearest neighbour, mid-gray fill). Level 30 is 90 degrees: a square turns exactly.
  np.testing.assert_array_equal(op("_rotate", square, 30), np.rot90(square, 1))
  np.testing.assert_array_equal(op("_rotate", square, -30), np.rot90(square, -1))
  rotated = op("_rotate", square, 3)  # 9 degrees: corners come from outside
  assert (rotated[0, 0] == 128).all() and (rotated[8, 8] == square[8, 8]).all()
  # Shear x at level 7 (factor 0.21): out[y, x] = in[y, round(x + 0.21 y)], gray outside.
  ys, xs = np.mgrid[0:12, 0:20]
  src = np.floor(xs + 0.21 * ys + 0.5).astype(int)
  inside = src < 20
  expected = np.where(inside[..., None], noise[ys, np.minimum(src, 19)], 128)
  np.testing.assert_array_equal(op("_shear_x", noise, 7), expected)
  src = np.floor(ys + 0.21 * xs + 0.5).astype(int)
  expected = np.where((src < 12)[..., None], noise[np.minimum(src, 11), xs], 128)
  np.testing.assert_array_equal(op("_shear_y", noise, 7), expected)
  # Translate by 0.45 * width * level / 10: level 10/9 moves a 20-wide image by one column.
  moved = op("_translate_x", noise, 10 / 9)
  np.testing.assert_array_equal(moved[:, 1:], noise[:, :-1])
  assert (moved[:, 0] == 128).all()
  moved = op("_translate_y", noise, -10 / 5.4)  # 0.45 * 12 rows * level / 10 = -1: up one row
  np.testing.assert_array_equal(moved[:-1], noise[1:])
  assert (moved[-1] == 128).all()
  # Colour maps, on every value 0..255.
  np.testing.assert_array_equal(op("_posterize", every_value, 10), (every_value >> 4) << 4)
  np.testing.assert_array_equal(op("_posterize", every_value, -5), (every_value >> 2) << 2)
  np.testing.assert_array_equal(
    op("_solarize", every_value, 5), np.where(every_value >= 128, 255 - every_value, every_value)
  )
  np.testing.assert_array_equal(op("_solarize", every_value, 0), every_value)
  # Histogram ops equal PIL's ImageOps (the reference the RandAugment papers used).
  np.testing.assert_array_equal(op("_equalize", narrow, 0), _pil(ImageOps.equalize, narrow))
  np.testing.assert_array_equal(op("_autocontrast", narrow, 0), _pil(ImageOps.autocontrast, narrow))
  assert np.ptp(op("_equalize", narrow, 0)) > 3 * np.ptp(narrow)
  # Enhancements: blends with factor 1 + 0.09 level; PIL's ImageEnhance within one level of
  # rounding (TF and PIL round the blend and the grayscale differently).
  for name, enhance in (
    ("_color", ImageEnhance.Color),
    ("_contrast", ImageEnhance.Contrast),
    ("_brightness", ImageEnhance.Brightness),
    ("_sharpness", ImageEnhance.Sharpness),
  ):
    for level in (-5, 3, 10):
      factor = 1 + 0.09 * level
      reference = np.asarray(enhance(Image.fromarray(noise)).enhance(factor)).astype(int)
      assert np.abs(op(name, noise, level).astype(int) - reference).max() <= 1, (name, level)
  gray = op("_color", noise, -100 / 9)  # factor 0: the grayscale image
  assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
  np.testing.assert_array_equal(op("_brightness", noise, -100 / 9), 0)  # factor 0: black
  np.testing.assert_array_equal(op("_identity", noise, 10), noise)


def test_spec_errors():
  with pytest.raises(ValueError, match="Unknown preprocessing op"):
    preprocess.get_preprocess_fn("decode|sharpen", 8)
  with pytest.raises(ValueError, match="Cannot parse"):
    preprocess.get_preprocess_fn("decode|resize(", 8)
  with pytest.raises(ValueError, match="value_range"):
    preprocess.get_preprocess_fn("decode|resize", 8)(tf.constant(_photo()), RNG)
  with pytest.raises(ValueError, match="must start with `decode`"):
    preprocess.get_preprocess_fn("resize|value_range", 8)(tf.constant(b"x"), RNG)
  with pytest.raises(ValueError, match=r"not \[8, 8, 3\]"):
    preprocess.get_preprocess_fn("decode|resize(10)|value_range", 8)(tf.constant(_photo()), RNG)
