"""Preprocessing ops and specs: crops, resolutions, gray → RGB, RandAugment, value range, errors."""

import numpy as np
import pytest
import tensorflow as tf

from vit_jax.input_pipeline import preprocess, randaugment, testing

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
  out = fn(tf.constant(testing.encode(_photo(), fmt)), RNG).numpy()
  assert out.shape == (size, size, 3) and out.dtype == np.float32
  assert -1.0 <= out.min() and out.max() <= 1.0


def test_same_seed_same_augmentation_other_seed_differs():
  fn = preprocess.get_preprocess_fn("decode|inception_crop|flip_lr|value_range", 32)
  data = tf.constant(testing.encode(_photo(), "jpeg"))
  a, b = fn(data, RNG).numpy(), fn(data, RNG).numpy()
  np.testing.assert_array_equal(a, b)
  others = [fn(data, tf.constant([1, s], tf.int64)).numpy() for s in range(3, 8)]
  assert any(not np.array_equal(a, o) for o in others)


def test_inception_crop_area_and_fused_jpeg_path_agree():
  # Full-area crops (area_min=1) of a JPEG: the fused decode-and-crop and the plain path agree.
  data = tf.constant(testing.encode(_photo(64, 64), "jpeg"))
  fused = preprocess.get_preprocess_fn("decode|inception_crop(1.0)|value_range(0, 255)", 32)
  plain = preprocess.get_preprocess_fn(
    "decode|flip_lr(  )|inception_crop(1.0)|value_range(0, 255)", 32
  )
  a = fused(data, RNG).numpy()
  expected = preprocess.resize(preprocess.decode(data, RNG, 32), RNG, 32).numpy().astype(np.float32)
  np.testing.assert_allclose(a, expected, atol=1)
  assert plain(data, RNG).shape == (32, 32, 3)


def test_eval_resize_small_central_crop():
  image = _photo(40, 80)
  fn = preprocess.get_preprocess_fn("decode|resize_small|central_crop|value_range(0, 255)", 20)
  out = fn(tf.constant(image), RNG).numpy()
  assert out.shape == (20, 20, 3)
  # The central crop of the 20×40 resize is columns 10..30: the middle of the horizontal ramp.
  assert abs(out[:, :, 0].mean() - image[:, 20:60, 0].mean()) < 4


def test_grayscale_and_rgba_become_rgb():
  fn = preprocess.get_preprocess_fn("decode|resize|value_range(0, 255)", 16)
  gray = fn(tf.constant(testing.encode(_photo(channels=1), "jpeg")), RNG).numpy()
  assert gray.shape == (16, 16, 3) and (gray[..., 0] == gray[..., 1]).all()
  raw_gray = fn(tf.constant(_photo(channels=1)), RNG).numpy()
  assert (raw_gray[..., 0] == raw_gray[..., 2]).all()
  rgba = np.concatenate([_photo(), np.full((60, 90, 1), 7, np.uint8)], -1)
  assert fn(tf.constant(testing.encode(rgba, "png")), RNG).shape == (16, 16, 3)


def test_value_range():
  fn = preprocess.get_preprocess_fn("decode|value_range(-1, 1)", 2)
  out = fn(tf.constant(np.array([[[0], [255]], [[0], [255]]], np.uint8)), RNG).numpy()
  np.testing.assert_allclose(out[:, :, 0], [[-1, 1], [-1, 1]])


def test_random_crop_and_resize_ratio():
  fn = preprocess.get_preprocess_fn("decode|resize(1.25)|random_crop|value_range", 16)
  assert fn(tf.constant(_photo()), RNG).shape == (16, 16, 3)


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


def test_randaugment_changes_images():
  fn = preprocess.get_preprocess_fn("decode|randaugment(2, 10)|value_range(0, 255)", 32)
  image = tf.constant(_photo(32, 32))
  outs = [fn(image, tf.constant([0, s], tf.int64)).numpy() for s in range(8)]
  assert sum(not np.array_equal(o, _photo(32, 32)) for o in outs) >= 4


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
