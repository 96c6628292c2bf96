"""Random augmentations measured over many draws: crop areas and aspects, flip rate, mixup weights."""

import jax
import numpy as np
import pytest
import tensorflow as tf

from vit_jax import mixup, sharding
from vit_jax.configs import common
from vit_jax.input_pipeline import preprocess

DRAWS = 1000


def _windows(shape, area, aspect, draws=DRAWS):
  """(y, x, h, w) of `draws` inception-crop windows of an image of `shape`, one seed each."""

  @tf.function
  def window(i):
    rng = tf.stack([tf.constant(7, tf.int64), i])
    return tf.stack(preprocess._crop_window(tf.constant(shape), rng, *area, *aspect))

  return np.array([window(tf.constant(i, tf.int64)).numpy() for i in range(draws)])


@pytest.mark.parametrize(
  "shape,area,aspect",
  [
    ((256, 256, 3), (0.05, 1.0), (3 / 4, 4 / 3)),  # the op's defaults
    # Every aspect in the range fits at the smallest area (a 0.5 aspect at 30% is 190 rows high).
    ((200, 300, 3), (0.3, 0.6), (0.5, 2.0)),
  ],
)
def test_inception_crop_windows_cover_the_configured_ranges(shape, area, aspect):
  windows = _windows(shape, area, aspect)
  y, x, h, w = windows.T
  height, width = shape[:2]
  assert np.all((y >= 0) & (x >= 0) & (y + h <= height) & (x + w <= width))
  # Within the ranges, up to the rounding of the window to whole pixels (one row or column).
  assert np.all((h + 1) * (w + 1) >= area[0] * height * width)
  assert np.all((h - 1) * (w - 1) <= area[1] * height * width)
  assert np.all((w + 1 >= aspect[0] * h) & (w - 1 <= aspect[1] * h))
  # ... and the ranges are explored, not one corner of them (10 attempts rarely all fail).
  areas, aspects = h * w / (height * width), w / h
  span = area[1] - area[0]
  assert areas.min() < area[0] + 0.1 * span and areas.max() > area[1] - 0.1 * span
  log_span = np.log(aspect[1] / aspect[0])
  assert np.log(aspects.min() / aspect[0]) < 0.1 * log_span
  assert np.log(aspect[1] / aspects.max()) < 0.1 * log_span
  assert len({(a, b) for a, b in zip(y, x, strict=True)}) > DRAWS // 2  # offsets vary too


def test_flip_rate_is_one_half():
  image = tf.constant(np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3))
  flips = 0
  for i in range(DRAWS):
    out = preprocess.flip_lr(image, tf.constant([11, i], tf.int64), 0).numpy()
    if not np.array_equal(out, image.numpy()):
      np.testing.assert_array_equal(out, image.numpy()[:, ::-1])  # a mirror image, nothing else
      flips += 1
  # Binomial(1000, 1/2): the standard deviation is ~15.8; 4 of them.
  assert abs(flips - DRAWS / 2) <= 4 * np.sqrt(DRAWS / 4)


def test_mixup_uses_one_weight_for_images_and_labels():
  # Two known constant images: the mixed image's value gives the weight back exactly.
  num_classes, alpha = 5, 0.4
  images = np.zeros((4, 2, 2, 3), np.float32)
  values = np.array([-1.0, 0.5, 0.25, 1.0], np.float32)
  images[:] = values[:, None, None, None]
  labels = np.array([0, 3, 1, 4], np.int32)
  batch = {"image": images, "label": labels, "mask": np.ones([4], np.float32)}
  mix = jax.jit(lambda key: mixup.mix(batch, key, alpha, num_classes))
  weights = []
  for i in range(200):
    out = jax.device_get(mix(jax.random.PRNGKey(i)))
    mixed, soft = out["image"], out["label"]
    partner = np.roll(np.arange(4), 1)  # each example is mixed with its neighbour
    lam = (mixed[:, 0, 0, 0] - values[partner]) / (values - values[partner])
    assert np.ptp(lam) < 1e-5 and np.ptp(mixed.reshape(4, -1), axis=1).max() == 0
    lam = float(lam.mean())  # one weight for the whole batch
    one_hot = np.eye(num_classes)[labels]
    np.testing.assert_allclose(soft, lam * one_hot + (1 - lam) * one_hot[partner], atol=1e-5)
    weights.append(lam)
  weights = np.array(weights)
  # Beta(0.4, 0.4): mean 1/2, variance 1/(4 (2 alpha + 1)) = 0.139; U-shaped (mass near 0 and 1).
  assert np.all((weights >= 0) & (weights <= 1))
  assert abs(weights.mean() - 0.5) < 4 * np.sqrt(0.139 / len(weights))
  assert abs(weights.var() - 0.139) < 0.04
  assert np.mean((weights < 0.1) | (weights > 0.9)) > 0.3


def test_mixup_never_mixes_in_a_skipped_example():
  images = np.stack([np.full((2, 2, 3), v, np.float32) for v in (0.2, 0.9, -0.5)])
  batch = {
    "image": images,
    "label": np.array([0, 1, 2]),
    "mask": np.array([1.0, 0.0, 1.0], np.float32),  # example 1 was skipped (undecodable)
  }
  out = jax.device_get(mixup.mix(batch, jax.random.PRNGKey(2), 0.4, 3))
  # Example 2's partner would be example 1: it is paired with itself instead, unchanged.
  np.testing.assert_allclose(out["image"][2], images[2], atol=1e-6)
  np.testing.assert_allclose(out["label"][2], [0, 0, 1], atol=1e-6)


def test_mixup_of_a_sharded_batch_is_that_of_the_whole_batch():
  """On a batch sharded over 8 devices each example still meets the one before it in the global
  batch (across device boundaries), with the same weight: the same numbers as on one device."""
  rng = np.random.default_rng(0)
  batch = {
    "image": rng.normal(size=(16, 4, 4, 3)).astype(np.float32),
    "label": rng.integers(0, 10, 16).astype(np.int32),
    "mask": np.ones([16], np.float32),
  }
  mesh = sharding.make_mesh(common.mesh_config(data=8))
  sharded = {k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim)) for k, v in batch.items()}
  key = jax.random.PRNGKey(5)
  whole = jax.device_get(mixup.mix(batch, key, 0.4, 10))
  split = jax.device_get(jax.jit(lambda b: mixup.mix(b, key, 0.4, 10))(sharded))
  for k in ("image", "label"):
    np.testing.assert_allclose(split[k], whole[k], atol=1e-6)
