"""The detection model (vit_jax.models.detection), its FCOS objective and ViTDet's window
attention (vit_jax.models.vit.window_attention)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import detection
from vit_jax.objectives import detection as objective


def _model(**fields):
  kw = dict(attention_kernel="xla", layer_norm_kernel="xla", classifier="gap")
  return models.get_model("testing", 10, **{**kw, **fields})


def _tokens(model, params, images):
  fn = lambda p, x: model.apply({"params": p}, x, train=False)[1]["tokens"]  # noqa: E731
  return np.asarray(jax.jit(fn)(params, images))


def _init(model, size):
  init = jax.jit(lambda x: model.init(jax.random.key(0), x, train=False)["params"])
  return init(jnp.zeros((1, size, size, 3)))


def _perturbed(size, patch_yx, seed=1):
  """Two images equal but for the 4x4 patch at grid position `patch_yx`."""
  images = jax.random.uniform(jax.random.key(seed), (1, size, size, 3), minval=-1.0, maxval=1.0)
  y, x = (4 * v for v in patch_yx)
  other = images.at[:, y : y + 4, x : x + 4].add(0.5)
  return jnp.concatenate([images, other])


def _changed(tokens, grid):
  """bool [gh, gw]: the patch tokens that differ between the two images' outputs."""
  diff = np.abs(tokens[0] - tokens[1]).max(axis=-1)
  return (diff > 0).reshape(grid)


def test_windowed_blocks_keep_a_change_inside_its_window_and_a_global_block_spreads_it():
  # 20px: a 5x5 grid, windows of 2x2 patches over the grid padded to 6x6.
  windowed = _model(window_size=2)
  params = _init(windowed, 20)
  changed = _changed(_tokens(windowed, params, _perturbed(20, (2, 3))), (5, 5))
  expected = np.zeros((5, 5), bool)
  expected[2:4, 2:4] = True  # the window of grid rows 2-3, columns 2-3
  np.testing.assert_array_equal(changed, expected)
  # The same parameters with block 1 global: the change reaches every token.
  mixed = _model(window_size=2, global_blocks=(-1,))
  assert _changed(_tokens(mixed, params, _perturbed(20, (2, 3))), (5, 5)).all()


def test_a_window_that_covers_the_grid_is_global_attention():
  model = _model()
  params = _init(model, 16)
  images = _perturbed(16, (0, 0))
  whole = _model(window_size=4)  # the 4x4 grid in one window: the same attention
  np.testing.assert_allclose(
    _tokens(whole, params, images), _tokens(model, params, images), rtol=1e-5, atol=1e-5
  )


def test_window_attention_needs_unscanned_blocks_and_global_blocks_inside_the_model():
  with pytest.raises(ValueError, match="scan=False"):
    _init(_model(window_size=2, scan=True), 16)
  with pytest.raises(ValueError, match="global_blocks has 5, outside the model's 2 blocks"):
    _init(_model(window_size=2, global_blocks=(5,)), 16)


def test_a_class_token_in_windowed_blocks_attends_only_to_itself():
  model = _model(window_size=2, classifier="token")
  params = _init(model, 16)
  # The pre-logits are the class token after the final LayerNorm.
  pre = lambda p, x: model.apply({"params": p}, x, train=False)[1]["pre_logits"]  # noqa: E731
  out = np.asarray(jax.jit(pre)(params, _perturbed(16, (1, 1))))
  np.testing.assert_array_equal(out[0], out[1])


def _numpy_iou(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  hw = np.clip(np.minimum(a[2:], b[2:]) - np.maximum(a[:2], b[:2]), 0, None)
  inter = hw[0] * hw[1]
  area = lambda x: (x[2] - x[0]) * (x[3] - x[1])  # noqa: E731
  return inter / (area(a) + area(b) - inter)


def test_nms_keeps_what_greedy_suppression_in_float64_keeps():
  rng = np.random.default_rng(0)
  n = 60
  corner = rng.uniform(0, 0.7, (n, 2))
  boxes = np.concatenate([corner, corner + rng.uniform(0.05, 0.3, (n, 2))], axis=1)
  scores = np.sort(rng.uniform(0.01, 1.0, n))[::-1].copy()
  scores[-5:] = 0.0  # below the threshold: never kept
  classes = rng.integers(0, 3, n)
  keep = np.asarray(
    jax.jit(detection.nms_keep, static_argnums=3)(
      jnp.asarray(boxes, jnp.float32), jnp.asarray(scores, jnp.float32), jnp.asarray(classes), 0.5
    )
  )
  expected = []
  for i in range(n):
    if scores[i] <= 0:
      continue
    if all(classes[j] != classes[i] or _numpy_iou(boxes[j], boxes[i]) <= 0.5 for j in expected):
      expected.append(i)
  assert 10 < len(expected) < n - 5  # some suppressed, some kept
  np.testing.assert_array_equal(np.flatnonzero(keep), expected)


def test_decode_returns_the_best_scores_of_the_kept_boxes_in_order():
  k = 3
  logits = np.full((1, 4, k + 5), -20.0, np.float32)
  boxes = [[0.1, 0.1, 0.5, 0.5], [0.1, 0.1, 0.5, 0.52], [0.6, 0.6, 0.9, 0.9], [0.0, 0.0, 1.2, 0.3]]
  logits[0, :, k : k + 4] = boxes
  logits[0, :, k + 4] = 20.0  # centerness 1
  logits[0, 0, 1] = 2.0  # location 0: class 1, p = 0.881
  logits[0, 1, 1] = 1.0  # location 1 overlaps it, same class: suppressed
  logits[0, 2, 2] = 0.0  # p = 0.5
  logits[0, 3, 0] = -1.0  # p = 0.269, its box clipped to the image
  out = detection.decode(
    jnp.asarray(logits), k, pre_nms=12, max_detections=5, nms_iou=0.6, score_threshold=0.05
  )
  scores = np.asarray(out["scores"][0])
  p = 1 / (1 + np.exp(-np.array([2.0, 0.0, -1.0])))
  np.testing.assert_allclose(scores[:3], np.sqrt(p * (1 / (1 + np.exp(-20.0)))), rtol=1e-6)
  np.testing.assert_array_equal(scores[3:], 0.0)
  np.testing.assert_array_equal(np.asarray(out["classes"][0, :3]), [1, 2, 0])
  np.testing.assert_allclose(
    np.asarray(out["boxes"][0, :3]), [boxes[0], boxes[2], [0.0, 0.0, 1.0, 0.3]], atol=1e-7
  )


def _points():
  model = detection.get_model("testing", 10, dict(pyramid_scales=(1.0, 0.5, 0.25), width=16))
  images = jnp.zeros((1, 64, 64, 3))
  params = _init(model, 64)
  return model.apply({"params": params}, images, train=False)[1]["points"]


def test_points_are_the_cell_centres_of_every_level_with_their_strides():
  points = _points()
  assert points.shape == (16 * 16 + 8 * 8 + 4 * 4, 3)
  np.testing.assert_array_equal(points[:3], [[2, 2, 4], [2, 6, 4], [2, 10, 4]])
  np.testing.assert_array_equal(points[256], [4, 4, 8])
  np.testing.assert_array_equal(points[-1], [56, 56, 16])


def test_fcos_positives_of_a_box_are_the_locations_near_its_centre_on_its_level():
  points = _points()
  label = np.zeros((3, 6), np.float32)
  label[:, 4] = -1
  label[0] = [8 / 64, 8 / 64, 24 / 64, 24 / 64, 7, 0]  # 16x16 px, centre (16, 16)
  label[1] = [0.5, 0.5, 0.9, 0.9, 2, 1]  # a crowd box: never a target
  positive, cls, box, centerness = objective.fcos_targets(points, jnp.asarray(label), (64, 64), 1.5)
  positive = np.asarray(positive)
  # Level 0 (stride 4, reach up to 32 px): centres 14 and 18 are within 1.5 strides (6 px) of
  # 16, inside the box; level 1's centres 12 and 20 are, but reach 12 at most: level 0's range.
  where = points[positive]
  np.testing.assert_array_equal(where, [[14, 14, 4], [14, 18, 4], [18, 14, 4], [18, 18, 4]])
  np.testing.assert_array_equal(np.asarray(cls)[positive], 7)
  np.testing.assert_allclose(np.asarray(box)[positive], [[8, 8, 24, 24]] * 4)
  # Centre (14, 14): l = t = 6, r = b = 10: sqrt(6/10 · 6/10) = 0.6.
  np.testing.assert_allclose(np.asarray(centerness)[positive], 0.6, rtol=1e-6)


def test_giou_matches_its_float64_definition():
  rng = np.random.default_rng(3)
  corner = rng.uniform(0, 10, (50, 2, 2))
  a = np.concatenate([corner[:, 0], corner[:, 0] + rng.uniform(0.5, 5, (50, 2))], axis=1)
  b = np.concatenate([corner[:, 1], corner[:, 1] + rng.uniform(0.5, 5, (50, 2))], axis=1)
  hull = np.maximum(a[:, 2:], b[:, 2:]) - np.minimum(a[:, :2], b[:, :2])
  enclosing = hull.prod(axis=1)
  iou = np.array([_numpy_iou(x, y) for x, y in zip(a, b, strict=True)])
  area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
  inter = iou * (area(a) + area(b)) / (1 + iou)  # from iou = inter / (a + b - inter)
  union = area(a) + area(b) - inter
  expected = iou - (enclosing - union) / enclosing
  got = objective.giou(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)


def test_the_loss_falls_when_the_predictions_are_the_targets():
  model = detection.get_model("testing", 4, dict(pyramid_scales=(1.0, 0.5), width=16))
  params = _init(model, 32)
  images = jax.random.uniform(jax.random.key(0), (2, 32, 32, 3))
  logits, out = model.apply({"params": params}, images, train=False)
  label = np.zeros((2, 4, 6), np.float32)
  label[..., 4] = -1
  label[0, 0] = [0.25, 0.25, 0.75, 0.75, 1, 0]
  label = jnp.asarray(label)
  loss, correct = objective.fcos_loss(logits, out["points"], label, (32, 32), 4)
  positive, cls, box, centerness = jax.vmap(
    lambda lab: objective.fcos_targets(out["points"], lab, (32, 32), 1.5)
  )(label)
  ideal = np.full(logits.shape, -12.0, np.float32)
  ideal[..., :4] = np.where(
    np.asarray(positive)[..., None] & (np.arange(4) == np.asarray(cls)[..., None]), 12.0, -12.0
  )
  ideal[..., 4:8] = np.where(np.asarray(positive)[..., None], np.asarray(box) / 32.0, 0.0)
  c = np.clip(np.asarray(centerness), 1e-6, 1 - 1e-6)
  ideal[..., 8] = np.log(c / (1 - c))
  best, best_correct = objective.fcos_loss(jnp.asarray(ideal), out["points"], label, (32, 32), 4)
  assert np.asarray(positive)[0].sum() > 0 and np.asarray(positive)[1].sum() == 0
  np.testing.assert_array_equal(np.asarray(best_correct), [1.0, 1.0])
  # What is left: the centerness BCE at its target (its entropy), and the focal loss's ~0.
  entropy = -(c * np.log(c) + (1 - c) * np.log(1 - c))
  pos0 = np.asarray(positive)[0]
  np.testing.assert_allclose(float(best[0]), entropy[0][pos0].mean(), atol=1e-4)
  assert float(best[1]) < 1e-6 < float(loss[1])
  assert float(best[0]) < float(loss[0])


def test_the_sorted_top_k_of_export_is_lax_top_k():
  x = jnp.asarray(np.random.default_rng(0).uniform(size=(3, 50)).round(2), jnp.float32)  # ties
  for k in (1, 7, 50):
    values, index = detection.top_k(x, k)
    sorted_values, sorted_index = detection.top_k(x, k, by_sort=True)
    np.testing.assert_array_equal(sorted_values, values)
    np.testing.assert_array_equal(sorted_index, index)


def test_a_pyramid_level_without_cells_is_one_line():
  # BiT-R26x1's last map has stride 32: 2x2 at 64px, so a scale of 1/4 leaves no cell.
  model = detection.get_model("R26x1", 10, dict(pyramid_scales=(1.0, 0.25), width=16))
  with pytest.raises(ValueError, match=r"pyramid scale 0.25 of the encoder's 2x2 map \(stride 32"):
    jax.eval_shape(
      lambda x: model.init(jax.random.key(0), x, train=False), jnp.zeros((1, 64, 64, 3))
    )


def test_the_detection_step_on_a_sharded_mesh_is_the_one_device_step():
  """One train step of the detect stage's config (runlocal) on data=2 × fsdp=2 × model=2 over 8
  devices and on one device: the same loss and parameters up to summation order (a tolerance
  far above float32 rounding, far below what a wrong sharding of the boxes would give)."""
  from vit_jax import sharding
  from vit_jax.configs import detect
  from vit_jax.train import step as step_lib

  config = detect.get_config("runlocal")
  config.init_from_scratch = True
  config.dataset.image_size = 32
  config.batch_size = 8
  rng = np.random.default_rng(0)
  label = np.zeros((8, int(config.dataset.max_boxes), 6), np.float32)
  label[..., 4] = -1
  corner = rng.uniform(0, 0.5, (8, 2))
  label[:, 0, :4] = np.concatenate([corner, corner + 0.4], axis=1)
  label[:, 0, 4] = rng.integers(0, 10, 8)
  batch = dict(
    image=rng.uniform(-1, 1, (8, 32, 32, 3)).astype(np.float32),
    label=label,
    mask=np.ones(8, np.float32),
  )
  out = []
  for mesh_config, devices in (
    (dict(data=2, fsdp=2, model=2), jax.devices()[:8]),
    (dict(data=1, fsdp=1, model=1), jax.devices()[:1]),
  ):
    config.mesh.update(mesh_config)
    mesh = sharding.make_mesh(config.mesh, devices)
    built = step_lib.build(config, mesh, 10)
    state = jax.jit(built.init_state, out_shardings=built.state_shardings)(built.init_key)
    window = jax.device_put(step_lib.empty_window(), sharding.replicated(mesh))
    state, window, _ = built.jit_step(batch)(state, batch, window)
    out.append((step_lib.window_metrics(window), jax.device_get(state["params"])))
  (metrics8, params8), (metrics1, params1) = out
  assert metrics8["loss"] == pytest.approx(metrics1["loss"], rel=1e-5)
  for a, b in zip(jax.tree.leaves(params8), jax.tree.leaves(params1), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_hybrid_encoder_detects_from_its_token_grid():
  # The testing ViT on an R50-style stem of one stage, 1x1 patches on its map (an R50+ViT hybrid).
  config = models.get_model_config("testing")
  config.patch_size = 1
  config.resnet = dict(num_layers=(1,), width_factor=1)
  model = detection.get_model(config, 3, dict(pyramid_scales=(2.0, 1.0), width=16))
  images = jnp.zeros((2, 32, 32, 3))
  shapes = jax.eval_shape(
    lambda x: model.apply(model.init(jax.random.key(0), x, train=False), x, train=False), images
  )
  logits, out = shapes
  # The stem's stride 4 (2 for the root, 2 for its one stage): an 8x8 grid, levels 16x16 and 8x8.
  assert logits.shape == (2, 16 * 16 + 8 * 8, 3 + 5)
  assert out["detections"]["boxes"].shape == (2, 100, 4)
