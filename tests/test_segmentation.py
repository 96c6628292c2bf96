"""Segmentation data, loss, evaluator and stage: each against a hand-made or numpy reference."""

import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from tests.helpers import trees
from vit_jax import input_pipeline, predict, stages
from vit_jax.checkpoint.state import train_state
from vit_jax.evaluators import segmentation as seg_eval
from vit_jax.input_pipeline import splits
from vit_jax.input_pipeline.ops import segmentation as seg_ops
from vit_jax.input_pipeline.sources import segmentation as seg_data
from vit_jax.input_pipeline.sources import segmentation_synthetic as synthetic
from vit_jax.objectives import segmentation as seg_obj
from vit_jax.runtime import config_files

IGNORE = seg_data.IGNORE_LABEL


# ---------------------------------------------------------------------------------------------
# Data.


def test_synthetic_canvases_label_exactly_the_bright_object_pixels():
  # Flat objects of grey 200 (class 4) and 70 (class 7): resized they stay flat, so every pixel
  # showing 200 is class 4 + 1, every one showing 70 is an edge pixel (ignored), and the
  # background (grey < 60) is 0.
  objects = np.stack([np.full((28, 28, 1), 200, np.uint8), np.full((28, 28, 1), 70, np.uint8)])
  images, masks = synthetic.make_synthetic(objects, np.array([4, 7]), num=20, seed=5)
  assert images.shape == (20, 48, 48, 1) and masks.shape == (20, 48, 48)
  image = images[..., 0]
  np.testing.assert_array_equal(masks == 5, image == 200)
  np.testing.assert_array_equal(masks == IGNORE, image == 70)
  assert set(np.unique(masks)) == {0, 5, IGNORE}
  assert image[masks == 0].max() < 60
  again = synthetic.make_synthetic(objects, np.array([4, 7]), num=20, seed=5)
  np.testing.assert_array_equal(again[1], masks)
  assert not np.array_equal(synthetic.make_synthetic(objects, np.array([4, 7]), 20, 6)[1], masks)


def test_builtin_task_splits_and_classes():
  config = input_pipeline.dataset_config(
    source="seg_builtin", name="mnist_seg", train_split="train[:50]", eval_split="val"
  )
  info = input_pipeline.get_dataset_info(config)
  assert info.num_classes == 11 and info.class_names[0] == "background"
  assert info.num_examples == {"train[:50]": 50, "val": synthetic.SPLIT_SIZES["val"]}
  val = synthetic.synthetic_split("mnist_seg", "val")
  train = synthetic.synthetic_split("mnist_seg", "train")
  assert not any(np.array_equal(val.images[0], t) for t in train.images[:200])
  labels = np.unique(train.masks)
  assert set(labels) <= set(range(11)) | {IGNORE} and len(labels) == 12


def _block_pair(seed=0):
  rng = np.random.default_rng(seed)
  mask = np.kron(rng.integers(0, 6, (6, 6)), np.ones((8, 8), np.int64)).astype(np.uint8)
  return (mask[..., None] * 40).astype(np.uint8), mask


def test_augmentation_moves_image_and_mask_together():
  image, mask = _block_pair()
  ops = seg_ops.build("random_crop(0.3)|flip_lr")
  flipped = 0
  for seed in range(12):
    out, label = seg_ops.augment(image, mask, ops, 32, np.random.default_rng(seed))
    assert out.shape == (32, 32, 3) and label.shape == (32, 32) and label.dtype == np.int32
    assert set(np.unique(label)) <= set(np.unique(mask))  # nearest neighbour: no new labels
    decoded = np.rint((out[..., 0] + 1.0) * 127.5 / 40).astype(int)
    agree = np.mean(decoded == label)
    assert agree > 0.75, (seed, agree)  # bilinear blurs the blocks' borders only
    assert np.mean(decoded == label[:, ::-1]) < agree - 0.4  # a mask left unflipped fails
    _, no_flip = seg_ops.augment(
      image, mask, seg_ops.build("random_crop(0.3)"), 32, np.random.default_rng(seed)
    )
    flipped += not np.array_equal(no_flip, label)
  assert 2 <= flipped <= 10  # about half the draws flip


def test_unknown_op_is_one_line():
  with pytest.raises(ValueError, match="segmentation preprocessing op 'rotate'"):
    seg_ops.build("flip_lr|rotate")


def _write_folder(root, masks_mode="P", size_mismatch=False, bad_label=False, drop_mask=False):
  for split in ("train",):
    os.makedirs(root / split / "images", exist_ok=True)
    os.makedirs(root / split / "masks", exist_ok=True)
    for i in range(3):
      image, mask = _block_pair(i)
      Image.fromarray(np.repeat(image, 3, axis=2)).save(root / split / "images" / f"im{i}.png")
      if drop_mask and i == 2:
        continue
      if bad_label and i == 1:
        mask = mask.copy()
        mask[0, 0] = 9
      if size_mismatch and i == 1:
        mask = mask[:40]
      m = Image.fromarray(mask, mode="L")
      if masks_mode == "P":
        m = m.convert("P")
        m.putpalette([v for c in range(256) for v in (c * 7 % 256, c * 3 % 256, c)])
        # convert('P') from 'L' keeps values as indices for a grey input
      m.save(root / split / "masks" / f"im{i}.png")
  (root / "classes.txt").write_text("\n".join(f"c{i}" for i in range(6)) + "\n")


def _folder_config(root, **kw):
  return input_pipeline.dataset_config(
    source="seg_folder", data_dir=str(root), train_split="train", eval_split="train",
    image_size=48, pp_train="flip_lr", pp_eval="", **kw,
  )  # fmt: skip


@pytest.mark.parametrize("mode", ["P", "L"])
def test_folder_source_reads_palette_and_grey_masks(tmp_path, mode):
  _write_folder(tmp_path, mode)
  config = _folder_config(tmp_path)
  assert input_pipeline.get_dataset_info(config).num_classes == 6
  # Evaluated at the images' own size, in the folder's order: the masks as written.
  (batch,) = input_pipeline.make_eval_iterator(config, global_batch_size=3)
  for i in range(3):
    np.testing.assert_array_equal(batch["label"][i], _block_pair(i)[1])
    rgb = np.repeat(_block_pair(i)[0], 3, axis=2).astype(np.float32)
    np.testing.assert_array_equal(batch["image"][i], rgb / 127.5 - 1.0)


@pytest.mark.parametrize(
  "kind, message",
  [
    ("size_mismatch", r"^mask .*masks/im1.png is 48x40 but its image is 48x48$"),
    ("bad_label", r"^mask .*masks/im1.png: label 9 outside \[0, 6\) \(and not the ignore label"),
    ("drop_mask", r"^image .*im2.png has no mask .*masks/im2.png$"),
    ("no_masks", r"no masks/ directory"),
  ],
)
def test_bad_folders_are_one_line_naming_the_culprit(tmp_path, kind, message):
  """A folder's layout is checked as it is listed; a mask when its record is read (the folder
  is streamed), by the evaluation and the training iterators alike."""
  if kind == "no_masks":
    _write_folder(tmp_path)
    for f in os.listdir(tmp_path / "train" / "masks"):
      os.remove(tmp_path / "train" / "masks" / f)
    os.rmdir(tmp_path / "train" / "masks")
  else:
    _write_folder(tmp_path, **{kind: True})
  config = _folder_config(tmp_path)
  with pytest.raises((ValueError, FileNotFoundError), match=message) as e:
    list(input_pipeline.make_eval_iterator(config, global_batch_size=3))
  assert "\n" not in str(e.value)
  if kind in ("size_mismatch", "bad_label"):  # not a skipped example: the run stops
    it = input_pipeline.make_train_iterator(config, global_batch_size=3)
    with pytest.raises(ValueError, match=message):
      next(it)
    it.close()


def test_train_iterator_resumes_exactly_and_eval_pads_with_mask_zero():
  config = input_pipeline.dataset_config(
    source="seg_builtin",
    name="mnist_seg",
    image_size=24,
    train_split="train[:40]",
    eval_split="val[:10]",
    pp_train="random_crop(0.5)|flip_lr",
    pp_eval="",
  )
  it = input_pipeline.make_train_iterator(config, global_batch_size=8, seed=3)
  batches = [next(it) for _ in range(7)]  # crosses the epoch boundary (40 examples)
  resumed = input_pipeline.make_train_iterator(
    config, global_batch_size=8, seed=3, state=_state_after(config, 4)
  )
  for want in batches[4:]:
    got = next(resumed)
    for k in ("image", "label", "mask"):
      np.testing.assert_array_equal(got[k], want[k])
  # Two simulated hosts deliver the two halves of the same global batch.
  halves = [
    next(
      input_pipeline.make_train_iterator(
        config, global_batch_size=8, seed=3, process_index=h, process_count=2
      )
    )
    for h in range(2)
  ]
  np.testing.assert_array_equal(np.concatenate([h["label"] for h in halves]), batches[0]["label"])
  ev = list(input_pipeline.make_eval_iterator(config, global_batch_size=4))
  assert len(ev) == 3
  np.testing.assert_array_equal(np.concatenate([b["mask"] for b in ev]), [1] * 10 + [0] * 2)
  assert np.all(ev[-1]["label"][2:] == IGNORE)


def test_the_synthetic_stream_is_numpys_permutation_and_augmentation():
  """Row r of global batch b is stream position p = b·B + r: the canvas at place p mod N of
  epoch p div N in numpy's `default_rng([seed, epoch]).permutation(N)`, augmented with numpy's
  `default_rng([seed, 1, p])` — the stream the segment stage had when it kept its split in
  memory, and still has through tf.data, so the recorded runs' examples are the same."""
  ops = "random_crop(0.5)|flip_lr"
  config = input_pipeline.dataset_config(
    source="seg_builtin", name="mnist_seg", image_size=24, train_split="train[:20]", pp_train=ops
  )
  data = synthetic.synthetic_split("mnist_seg", "train")
  rows = splits.slice_rows("train[:20]", len(data.masks), "train")
  images, masks = data.images[rows], data.masks[rows]
  it = input_pipeline.make_train_iterator(config, global_batch_size=8, seed=5)
  for b in range(4):  # 32 positions: over the epoch boundary at 20
    batch = next(it)
    for r in range(8):
      p = 8 * b + r
      i = np.random.default_rng([5, p // 20]).permutation(20)[p % 20]
      rng = np.random.default_rng([5, 1, p])
      image, label = seg_ops.augment(images[i], masks[i], seg_ops.build(ops), 24, rng)
      np.testing.assert_array_equal(batch["image"][r], image)
      np.testing.assert_array_equal(batch["label"][r], label)
  it.close()


def _state_after(config, batches):
  it = input_pipeline.make_train_iterator(config, global_batch_size=8, seed=3)
  for _ in range(batches):
    next(it)
  return it.get_state()


# ---------------------------------------------------------------------------------------------
# Loss and evaluator.


def test_pixel_cross_entropy_ignores_the_ignore_label():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
  labels = rng.integers(0, 5, (2, 3, 4))
  labels[0, 0, :3] = IGNORE
  labels[1] = IGNORE  # nothing counts: 0, not NaN
  loss, acc = seg_obj.pixel_xent(jnp.asarray(logits), jnp.asarray(labels))
  z = logits[0] - logits[0].max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  keep = labels[0] != IGNORE
  ref = -np.mean(np.take_along_axis(logp, np.where(keep, labels[0], 0)[..., None], -1)[keep])
  np.testing.assert_allclose(loss[0], ref, rtol=1e-5)
  np.testing.assert_allclose(acc[0], np.mean(logits[0].argmax(-1)[keep] == labels[0][keep]))
  assert float(loss[1]) == 0.0 and float(acc[1]) == 0.0


def test_miou_of_a_hand_computed_example():
  # 3 classes, 10 counted pixels (one ignored, one padded example):
  labels = np.array([[0, 0, 0, 0, 1, 1, 1, 2, 2, IGNORE]])
  preds = np.array([[0, 0, 0, 1, 1, 1, 2, 2, 0, 1]])
  # class 0: TP 3, FP 1 (the last 2→0), FN 1 (0→1): IoU 3/5; class 1: TP 2, FP 1, FN 1: 2/4;
  # class 2: TP 1, FP 1, FN 1: 1/3. mIoU = (0.6 + 0.5 + 1/3) / 3; pixel accuracy 6/9.
  matrix = np.asarray(seg_eval.confusion(jnp.asarray(preds), jnp.asarray(labels), 1.0, 3))
  np.testing.assert_array_equal(matrix, [[3, 1, 0], [0, 2, 1], [1, 0, 1]])
  m = seg_eval.metrics_from_confusion(matrix, ["bg", "a", "b"], prefix="val/")
  assert m["val/miou"] == pytest.approx((0.6 + 0.5 + 1 / 3) / 3)
  assert m["val/pixel_accuracy"] == pytest.approx(6 / 9)
  assert m["val/iou/a"] == pytest.approx(0.5) and m["val/accuracy/bg"] == pytest.approx(0.75)
  assert m["val/mean_class_accuracy"] == pytest.approx((3 / 4 + 2 / 3 + 1 / 2) / 3)
  # A class neither labelled nor predicted has no IoU and does not drag the mean.
  m4 = seg_eval.metrics_from_confusion(np.pad(matrix, ((0, 1), (0, 1))))
  assert m4["miou"] == pytest.approx(m["val/miou"]) and "iou/3" not in m4

  # Through the evaluator: the same pixels as one 1x10 image, plus a padded example (mask 0)
  # whose pixels are all wrong.
  def predict(params, images):
    del params
    return jax.nn.one_hot(images[..., 0].astype(jnp.int32), 3)

  batch = {
    "image": np.stack([preds.astype(np.float32)[..., None], np.zeros((1, 10, 1), np.float32)]),
    "label": np.stack([labels, np.full((1, 10), 2)]),
    "mask": np.array([1.0, 0.0], np.float32),
  }
  ev = seg_eval.SegmentationEvaluator(predict, lambda: [batch], 3, name="t")
  got = ev.run(None)
  assert got["t/miou"] == pytest.approx(m["val/miou"]) and got["t/num_pixels"] == 9


# ---------------------------------------------------------------------------------------------
# The stage.


def _config(tmp_path, total_steps, extra=()):
  # 48px: the canvases' own size, so predict's masks are compared pixel for pixel below.
  return config_files.from_flags(
    [
      "--config=configs/segment.py:dataset=mnist_seg,head=progressive,runlocal",
      "--config.init_from_scratch=true",
      "--config.dataset.train_split=train[:64]",
      "--config.dataset.eval_split=val[:16]",
      "--config.evals.test.split=test[:16]",
      f"--config.total_steps={total_steps}",
      "--config.dataset.image_size=48",
      "--config.checkpoint.asynchronous=false",
      *extra,
    ]
  )


@pytest.mark.long
def test_segment_stage_resumes_bitwise_and_predict_scores_its_miou(tmp_path, trainer_on_one_device):
  straight = stages.run(_config(tmp_path, 6), str(tmp_path / "straight"))
  assert {"val/miou", "test/miou", "test/pixel_accuracy", "test/iou/background"} <= set(straight)
  # Stopped after step 3 (total_steps may change on resume), then continued to 6.
  stages.run(_config(tmp_path, 3), str(tmp_path / "split"))
  resumed = stages.run(_config(tmp_path, 6), str(tmp_path / "split"))
  assert resumed["test/miou"] == straight["test/miou"]

  def params(workdir):
    return train_state.restore_params(str(tmp_path / workdir))

  trees.assert_equal(params("split"), params("straight"))

  # predict: the masks it writes for the test canvases (PNG files, read back) score the mIoU
  # the trainer's evaluator reported, through another path (PIL preprocessing, numpy counts).
  test = synthetic.synthetic_split("mnist_seg", "test")
  rows = splits.slice_rows("test[:16]", len(test.masks), "test")
  files = []
  for i, image in enumerate(test.images[rows]):
    files.append(str(tmp_path / f"canvas{i}.png"))
    Image.fromarray(image[..., 0]).save(files[-1])
  flag = lambda v: types.SimpleNamespace(value=v)  # noqa: E731
  predict.segment(
    files,
    types.SimpleNamespace(
      checkpoint=flag(str(tmp_path / "straight")), masks_dir=flag(str(tmp_path / "masks"))
    ),
  )
  written = [np.asarray(Image.open(tmp_path / "masks" / f"canvas{i}_mask.png")) for i in range(16)]
  assert Image.open(tmp_path / "masks" / "canvas0_mask.png").mode == "P"
  assert (tmp_path / "masks" / "canvas0_overlay.png").exists()
  labels = test.masks[rows]
  matrix = seg_eval.confusion(np.stack(written), labels, np.ones(labels.shape), 11)
  ours = seg_eval.metrics_from_confusion(np.asarray(matrix))
  assert ours["miou"] == pytest.approx(straight["test/miou"], abs=1e-6)
  assert ours["pixel_accuracy"] == pytest.approx(straight["test/pixel_accuracy"], abs=1e-6)


def test_progress_line_leaves_the_per_class_values_to_the_metrics(monkeypatch):
  from vit_jax.runtime import logging_util

  lines = []
  progress = logging_util.Progress(10, 0)
  monkeypatch.setattr(progress, "_log", lines.append)
  results = {"val/miou": 0.25, "val/pixel_accuracy": 0.9, "val/iou/bear": 0.1}
  progress.evaluation(10, "val", results, 12.0)
  assert lines[-1] == "step 10/10 | val: miou 0.25, pixel_accuracy 90.00% (12s)"
  assert "bear" not in lines[-1]
