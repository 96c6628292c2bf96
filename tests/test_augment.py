"""Random augmentations measured over many draws: crop areas and aspects, flip rate, mixup weights,
CutMix boxes and the mixup/CutMix switch."""

import jax
import numpy as np
import pytest
import tensorflow as tf

from vit_jax import sharding
from vit_jax.configs import common
from vit_jax.input_pipeline.ops import preprocess
from vit_jax.train import mixup

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


def _distinct_batch(n=6, size=12, num_classes=5, seed=0):
  """Images whose every pixel differs from the previous example's (a pasted pixel is told from
  an own one exactly), int labels, all examples good."""
  rng = np.random.default_rng(seed)
  images = rng.uniform(-1, 1, (n, size, size, 3)).astype(np.float32)
  images += np.arange(n, dtype=np.float32)[:, None, None, None] * 3  # disjoint value ranges
  return {
    "image": images,
    "label": rng.integers(0, num_classes, n).astype(np.int32),
    "mask": np.ones([n], np.float32),
  }


def test_cutmix_pastes_one_box_of_the_partners_pixels_and_mixes_labels_by_its_area():
  num_classes, size = 5, 12
  batch = _distinct_batch(size=size, num_classes=num_classes)
  images, one_hot = batch["image"], np.eye(num_classes)[batch["label"]]
  partner = np.roll(np.arange(len(images)), 1)
  cut = jax.jit(lambda key: mixup.cutmix(batch, key, 1.0, num_classes))
  areas, interior_sides = [], []
  for i in range(200):
    out = jax.device_get(cut(jax.random.PRNGKey(i)))
    pasted = out["image"] == images[partner]  # [B, H, W, C]
    # Exactly: each pixel is the partner's or the example's own, nothing in between.
    np.testing.assert_array_equal(out["image"], np.where(pasted, images[partner], images))
    box = pasted[0, :, :, 0]
    # One box for the whole batch and all channels, an axis-aligned rectangle.
    assert np.all(pasted == box[None, :, :, None])
    rows, cols = box.any(axis=1), box.any(axis=0)
    np.testing.assert_array_equal(box, rows[:, None] & cols[None, :])
    for line in (rows, cols):  # contiguous
      where = np.flatnonzero(line)
      assert where.size == 0 or where[-1] - where[0] + 1 == where.size
    area = box.sum() / float(size * size)
    # The labels are mixed by the pasted share of the image (float64 reference).
    np.testing.assert_allclose(
      out["label"], (1 - area) * one_hot + area * one_hot[partner], atol=1e-6, rtol=0
    )
    areas.append(area)
    h, w = rows.sum(), cols.sum()
    if h and not (rows[0] or rows[-1] or cols[0] or cols[-1]):
      interior_sides.append((h, w))  # not clipped: ⌊√(1 − λ)·12⌋ on both sides
  areas = np.array(areas)
  # Beta(1, 1): 1 − λ is uniform, clipping only shrinks the box; every size occurs.
  assert areas.min() == 0.0 or areas.min() < 0.05
  assert areas.max() > 0.6 and 0.15 < areas.mean() < 0.5
  assert interior_sides and all(h == w for h, w in interior_sides)


def test_cutmix_never_pastes_a_skipped_example():
  batch = _distinct_batch(n=3, num_classes=3)
  batch["label"] = np.array([0, 1, 2], np.int32)
  batch["mask"] = np.array([1.0, 0.0, 1.0], np.float32)  # example 1 was skipped
  for i in range(20):
    out = jax.device_get(mixup.cutmix(batch, jax.random.PRNGKey(i), 1.0, 3))
    # Example 2's partner would be example 1: it keeps its own image and label, exactly.
    np.testing.assert_array_equal(out["image"][2], batch["image"][2])
    np.testing.assert_array_equal(out["label"][2], [0.0, 0.0, 1.0])


def test_with_mixup_and_cutmix_each_step_does_one_with_probability_one_half():
  batch = _distinct_batch(n=4)
  images, partner = batch["image"], np.roll(np.arange(4), 1)
  step = jax.jit(lambda key: mixup.mix_or_cut(batch, key, 5, mixup_alpha=1.0, cutmix_alpha=1.0))
  cutmixed = 0
  for i in range(DRAWS // 4):
    out = jax.device_get(step(jax.random.PRNGKey(i)))["image"]
    if np.all((out == images) | (out == images[partner])):
      cutmixed += 1
    else:  # mixup: every pixel a blend of the two with one weight
      lam = (out - images[partner]) / (images - images[partner])
      assert np.ptp(lam) < 1e-3
  n = DRAWS // 4
  assert abs(cutmixed - n / 2) <= 4 * np.sqrt(n / 4)


def test_only_mixup_draws_what_it_drew_before_cutmix_existed():
  batch = _distinct_batch()
  key = jax.random.PRNGKey(3)
  alone = jax.device_get(mixup.mix(batch, key, 0.4, 5))
  via = jax.device_get(mixup.mix_or_cut(batch, key, 5, mixup_alpha=0.4, cutmix_alpha=0.0))
  for k in ("image", "label"):
    np.testing.assert_array_equal(via[k], alone[k])
  off = mixup.mix_or_cut(batch, key, 5)
  assert off is batch


@pytest.mark.parametrize("field", ["mixup_alpha", "cutmix_alpha"])
@pytest.mark.parametrize("value", [-0.5, float("nan")])
def test_a_negative_alpha_is_refused_in_one_line(field, value):
  with pytest.raises(ValueError) as error:
    mixup.check_alphas(**{"mixup_alpha": 0.0, "cutmix_alpha": 0.0, field: value})
  assert f"config.dataset.{field}=" in str(error.value) and "\n" not in str(error.value)


def test_cutmix_of_a_sharded_batch_is_that_of_the_whole_batch():
  """As mixup's: the box and the partners across device boundaries are those of one device."""
  batch = _distinct_batch(n=16, size=8, num_classes=10)
  mesh = sharding.make_mesh(common.mesh_config(data=8))
  sharded = {k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim)) for k, v in batch.items()}
  for seed in range(3):
    key = jax.random.PRNGKey(seed)
    whole = jax.device_get(mixup.mix_or_cut(batch, key, 10, 0.4, 1.0))
    split = jax.device_get(jax.jit(lambda b, k=key: mixup.mix_or_cut(b, k, 10, 0.4, 1.0))(sharded))
    for k in ("image", "label"):
      np.testing.assert_array_equal(split[k], whole[k])
