"""VTAB-1k: the 19 tasks build through tfds (mock data), their split arithmetic, label transforms."""

import numpy as np
import pytest
import tensorflow as tf

# Imported at collection, while the process has one thread (see tests/test_input_sources.py).
from tensorflow_datasets.core import naming
from tensorflow_datasets.core import splits as splits_lib
from tensorflow_datasets.testing import mocking as tfds_mocking

from configs import finetune
from vit_jax import input_pipeline
from vit_jax.input_pipeline import preprocess, vtab

# Test-set sizes of VTAB-1k (Zhai et al., 2019, Table 4 of the benchmark paper).
TEST_SIZES = {
  "caltech101": 6_084,
  "cifar100": 10_000,
  "dtd": 1_880,
  "oxford_flowers102": 6_149,
  "oxford_iiit_pet": 3_669,
  "sun397": 21_750,
  "svhn": 26_032,
  "patch_camelyon": 32_768,
  "eurosat": 5_400,
  "resisc45": 6_300,
  "diabetic_retinopathy": 42_670,
  "clevr_count": 15_000,
  "clevr_dist": 15_000,
  "dmlab": 22_735,
  "dsprites_loc": 73_728,
  "dsprites_ori": 73_728,
  "kitti_dist": 711,
  "smallnorb_azi": 12_150,
  "smallnorb_ele": 12_150,
}
NUM_CLASSES = {
  "caltech101": 102, "cifar100": 100, "dtd": 47, "oxford_flowers102": 102,
  "oxford_iiit_pet": 37, "sun397": 397, "svhn": 10, "patch_camelyon": 2, "eurosat": 10,
  "resisc45": 45, "diabetic_retinopathy": 5, "clevr_count": 8, "clevr_dist": 6, "dmlab": 6,
  "dsprites_loc": 16, "dsprites_ori": 16, "kitti_dist": 4, "smallnorb_azi": 18,
  "smallnorb_ele": 9,
}  # fmt: skip


def test_the_19_tasks():
  assert sorted(vtab.TASKS) == sorted(TEST_SIZES)
  groups = [t.group for t in vtab.TASKS.values()]
  assert [groups.count(g) for g in vtab.GROUPS] == [7, 4, 8]
  assert {n: t.num_classes for n, t in vtab.TASKS.items()} == NUM_CLASSES


def _split_dict(sizes):
  template = naming.ShardedFileTemplate(
    data_dir="/nonexistent", dataset_name="x", split="train", filetype_suffix="tfrecord"
  )
  return splits_lib.SplitDict(
    [
      splits_lib.SplitInfo(
        name=n, shard_lengths=[k], num_bytes=0, filename_template=template.replace(split=n)
      )
      for n, k in sizes.items()
    ]
  )


def _ranges(split):
  """Half-open index ranges per tfds split of a split string with absolute slices."""
  out = []
  for part in split.split("+"):
    name, _, rest = part.partition("[")
    start, _, stop = rest.rstrip("]").partition(":")
    out.append((name, int(start or 0), int(stop) if stop else None))
  return out


@pytest.mark.parametrize("name", sorted(TEST_SIZES))
def test_split_arithmetic(name):
  task = vtab.TASKS[name]
  splits = _split_dict(task.tfds_sizes)  # tfds's own slicing, on the recorded split sizes
  sizes = {s: splits[tfds_split].num_examples for s, tfds_split in task.splits.items()}
  assert sizes == dict(train800=800, val200=200, train800val200=1000, test=TEST_SIZES[name])
  ((val_name, val_start, _),) = _ranges(task.val200)
  if val_name == "train":  # carved out of train after the task's training part, never in it
    assert val_start >= 800
  if task.test.startswith("train["):  # EuroSAT, Resisc45, dSprites: test after val
    ((_, test_start, _),) = _ranges(task.test)
    assert test_start >= val_start + 200


def test_known_offsets():
  s = vtab.TASKS["clevr_count"].splits
  assert s["val200"] == "train[63000:63200]" and s["test"] == "validation"
  assert vtab.TASKS["smallnorb_azi"].splits["train800val200"] == "train[:800]+test[:200]"
  assert vtab.TASKS["eurosat"].splits["test"] == "train[21600:]"
  assert vtab.TASKS["dtd"].splits["val200"] == "validation[:200]"


def test_prepared_data_of_another_size_is_named():
  task = vtab.TASKS["clevr_count"]
  vtab.check_tfds_sizes(task, {"train": 70_000, "validation": 15_000, "test": 15_000})
  vtab.check_tfds_sizes(task, {})  # unknown (mock data): nothing to check
  with pytest.raises(ValueError, match="'clevr_count'.*'train' has 69999 examples.*70000"):
    vtab.check_tfds_sizes(task, {"train": 69_999})


def _label(task, **features):
  return int(vtab.TASKS[task].label(features))


def test_clevr_labels():
  def objects(depths):
    n = len(depths)
    coords = np.stack([np.zeros(n), np.zeros(n), depths], -1).astype(np.float32)
    return dict(size=tf.zeros([n], tf.int64), pixel_coords=tf.constant(coords))

  assert _label("clevr_count", objects=objects([9.0] * 5)) == 2
  assert _label("clevr_count", objects=objects([9.0] * 3)) == 0
  assert _label("clevr_count", objects=objects([9.0] * 10)) == 7
  # Closest object; bins (0, 8], (8, 8.5], (8.5, 9], (9, 9.5], (9.5, 10], (10, 100].
  assert _label("clevr_dist", objects=objects([12.0, 7.5, 9.2])) == 0
  assert _label("clevr_dist", objects=objects([12.0, 9.2])) == 3
  assert _label("clevr_dist", objects=objects([12.0, 11.0])) == 5


def test_kitti_closest_vehicle():
  def frame(types, depths):
    location = np.zeros([len(depths), 3], np.float32)
    location[:, 2] = depths
    return dict(type=tf.constant(types, tf.int64), location=tf.constant(location))

  # 3 Pedestrian, 5 Cyclist, 7 Misc: no car, van or truck → the no-vehicle class.
  assert _label("kitti_dist", objects=frame([3, 5, 7], [2.0, 30.0, 10.0])) == 3
  assert _label("kitti_dist", objects=frame([], [])) == 3
  # The closest vehicle, not the closest object: the pedestrian at 2 m does not count.
  assert _label("kitti_dist", objects=frame([3, 0, 2], [2.0, 25.0, 12.0])) == 1
  assert _label("kitti_dist", objects=frame([1], [5.0])) == 0
  assert _label("kitti_dist", objects=frame([0], [40.0])) == 2


def test_dsprites_and_smallnorb_labels():
  assert _label("dsprites_loc", label_x_position=tf.constant(31, tf.int64)) == 15
  assert _label("dsprites_loc", label_x_position=tf.constant(0, tf.int64)) == 0
  assert _label("dsprites_loc", label_x_position=tf.constant(17, tf.int64)) == 8
  # 40 orientations → 16 classes of 2.5.
  assert _label("dsprites_ori", label_orientation=tf.constant(39, tf.int64)) == 15
  assert _label("dsprites_ori", label_orientation=tf.constant(5, tf.int64)) == 2
  assert _label("dsprites_ori", label_orientation=tf.constant(4, tf.int64)) == 1
  assert _label("smallnorb_azi", label_azimuth=tf.constant(17, tf.int64)) == 17
  assert _label("smallnorb_ele", label_elevation=tf.constant(8, tf.int64)) == 8


def _decoded(task, raw):
  image, _ = vtab.TASKS[task].parse(raw)
  return preprocess.decode(image, tf.zeros([2], tf.int64), 0).numpy()


def test_grey_images_become_three_equal_channels():
  grey = np.arange(96 * 96, dtype=np.uint8).reshape(96, 96, 1)
  raw = dict(image=tf.io.encode_png(grey), label_azimuth=tf.constant(0, tf.int64))
  rgb = _decoded("smallnorb_azi", raw)
  assert rgb.shape == (96, 96, 3)
  np.testing.assert_array_equal(rgb, np.repeat(grey, 3, axis=-1))
  # dSprites stores 0/1 pixels: 0/255 in every channel.
  bits = (np.arange(64 * 64).reshape(64, 64, 1) % 3 == 0).astype(np.uint8)
  raw = dict(image=tf.io.encode_png(bits), label_x_position=tf.constant(0, tf.int64))
  rgb = _decoded("dsprites_loc", raw)
  np.testing.assert_array_equal(rgb, np.repeat(bits * 255, 3, axis=-1))


def _records(self, split, decoders=None, read_config=None, **kwargs):
  """Three mock records of builder `self`: a PNG image, every top-level class label in range,
  5 objects (CLEVR, KITTI). tfds's own generator fails on some of these features ("The length
  of all elements of one sequence should be the same"; Pets' "BBox coordinates should have
  min <= max") and spends seconds on full-size images."""
  del decoders, read_config, kwargs
  SPLITS_SEEN.append(getattr(split, "split", split))  # tfds.even_splits wraps it
  rng = np.random.default_rng(0)
  channels = self.info.features["image"].shape[-1]
  images = [tf.io.encode_png(rng.integers(0, 2, (24, 32, channels), dtype=np.uint8))] * 3
  record = dict(image=tf.stack(images))
  for key, feature in self.info.features.items():
    if hasattr(feature, "num_classes") and key != "image":
      record[key] = rng.integers(0, feature.num_classes, 3).astype(np.int64)
  if "objects" in self.info.features:
    coords = rng.uniform(5.0, 15.0, (3, 5, 3)).astype(np.float32)
    record["objects"] = dict(
      size=np.zeros((3, 5), np.int64),
      pixel_coords=coords,
      type=rng.integers(0, 8, (3, 5)).astype(np.int64),
      location=coords,
    )
  return tf.data.Dataset.from_tensor_slices(record)


SPLITS_SEEN = []


@pytest.mark.parametrize("name", sorted(TEST_SIZES))
def test_task_builds_through_tfds(name):
  # The real builder code path (tfds.builder of the task's name and version, its features,
  # as_dataset of the task's split strings, the source's parse), on mock records.
  config = finetune.get_config(f"dataset=vtab/{name},holdout=false,runlocal").dataset
  SPLITS_SEEN.clear()
  with tfds_mocking.mock_data(policy=tfds_mocking.MockPolicy.USE_CODE, as_dataset_fn=_records):
    info = input_pipeline.get_dataset_info(config)
    assert info.num_classes == NUM_CLASSES[name]
    for split in (config.train_split, config.eval_split):
      (batch,) = list(input_pipeline.make_eval_iterator(config, split, global_batch_size=4))
      assert batch["image"].shape == (4, 16, 16, 3)
      assert batch["mask"].tolist() == [1, 1, 1, 0]
      assert all(0 <= y < NUM_CLASSES[name] for y in batch["label"][:3])
  task = vtab.TASKS[name]
  assert SPLITS_SEEN and set(SPLITS_SEEN) <= {task.splits["train800val200"], task.test}


def test_group_means():
  accuracies = {n: 0.5 for n in vtab.TASKS}
  accuracies["dtd"] = 0.5 + 7 * 0.1  # natural mean +0.1, 19-task mean +0.7/19
  means = vtab.group_means(accuracies)
  assert means["natural"] == pytest.approx(0.6) and means["structured"] == pytest.approx(0.5)
  assert means["mean"] == pytest.approx(0.5 + 0.7 / 19)
  del accuracies["kitti_dist"]
  assert set(vtab.group_means(accuracies)) == {"natural", "specialized"}


def test_finetune_presets():
  holdout = finetune.get_config("dataset=vtab/clevr_count")
  assert holdout.dataset.train_split == "train[:800]"
  assert holdout.evals.minival.split == "train[63000:63200]"
  assert (holdout.total_steps, holdout.batch_size, holdout.dataset.image_size) == (2500, 512, 384)
  assert holdout.schedule.base_lr == 0.01 and holdout.optimizer.momentum == 0.9
  assert "flip_lr" not in holdout.dataset.pp_train
  final = finetune.get_config("dataset=vtab/clevr_count,holdout=false")
  assert final.dataset.train_split == "train[:800]+train[63000:63200]"
  assert final.dataset.eval_split == "validation" and "minival" not in final.evals
  with pytest.raises(
    ValueError, match=r"dataset='vtab/clevr' is not one of .*did you mean 'vtab/clevr_"
  ):
    finetune.get_config("dataset=vtab/clevr")
