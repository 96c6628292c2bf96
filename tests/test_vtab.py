"""VTAB-1k: the 19 tasks build through tfds (mock data), their split arithmetic, label transforms."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

# Imported at collection, while the process has one thread (see tests/test_input_sources.py).
from tensorflow_datasets.core import naming
from tensorflow_datasets.core import splits as splits_lib
from tensorflow_datasets.testing import mocking as tfds_mocking

from vit_jax import input_pipeline
from vit_jax.configs import finetune
from vit_jax.input_pipeline.ops import preprocess
from vit_jax.input_pipeline.sources import vtab


@dataclasses.dataclass(frozen=True)
class Ref:
  """One task as google-research/task_adaptation defines it (`task_adaptation/data/<file>`).

  Attributes:
    builder: the tfds builder and version the reference's file reads.
    tfds_sizes: examples of each tfds split the task reads (from the reference's
      `<file>_test.py` `expected_num_samples`, or its file's docstring where the test does not
      state the tfds count itself).
    train, val, test: the reference's own split sizes (`expected_num_samples` of its test).
    val200, test_split: the reference's tfds split strings of val200 and test, worked out by hand
      from its file's percentages and the counts above (not by the implementation's formula).
  """

  builder: str
  tfds_sizes: dict
  train: int
  val: int
  test: int
  val200: str
  test_split: str


REFERENCE = {
  # caltech.py: _TRAIN_SPLIT_PERCENT = 90 of tfds train; caltech_test.py: train 2754, val 306,
  # trainval 3060 (30 images / class), test 6084.
  "caltech101": Ref(
    "caltech101:3.*.*", {"train": 3_060, "test": 6_084}, 2_754, 306, 6_084,
    "train[2754:2954]", "test",
  ),
  # cifar.py: TRAIN_SPLIT_PERCENT = 90; cifar_test.py Cifar100Test: 45000 / 5000 / 50000, test 10000.
  "cifar100": Ref(
    "cifar100:3.*.*", {"train": 50_000, "test": 10_000}, 45_000, 5_000, 10_000,
    "train[45000:45200]", "test",
  ),
  # dtd.py: val200 = validation[:200]; dtd_test.py: train 1880, val 1880, test 1880.
  "dtd": Ref(
    "dtd:3.*.*", {"train": 1_880, "validation": 1_880, "test": 1_880}, 1_880, 1_880, 1_880,
    "validation[:200]", "test",
  ),
  # oxford_flowers102.py (no train_split_percent): validation[:200]; its test: 1020 / 1020 / 6149.
  "oxford_flowers102": Ref(
    "oxford_flowers102:2.*.*", {"train": 1_020, "validation": 1_020, "test": 6_149},
    1_020, 1_020, 6_149, "validation[:200]", "test",
  ),
  # oxford_iiit_pet.py: TRAIN_SPLIT_PERCENT = 80; its test: train 2944, val 736, trainval 3680,
  # test 3669.
  "oxford_iiit_pet": Ref(
    "oxford_iiit_pet:3.*.*", {"train": 3_680, "test": 3_669}, 2_944, 736, 3_669,
    "train[2944:3144]", "test",
  ),
  # sun397.py (config tfds): validation[:200]; sun397_test.py: 76128 / 10875, test 21750.
  "sun397": Ref(
    "sun397/tfds:4.*.*", {"train": 76_128, "validation": 10_875, "test": 21_750},
    76_128, 10_875, 21_750, "validation[:200]", "test",
  ),
  # svhn.py: TRAIN_SPLIT_PERCENT = 90; svhn_test.py: train 65931, val 7326, trainval 73257,
  # test 26032.
  "svhn": Ref(
    "svhn_cropped:3.*.*", {"train": 73_257, "test": 26_032}, 65_931, 7_326, 26_032,
    "train[65931:66131]", "test",
  ),
  # patch_camelyon.py: validation[:200]; its test: 262144 / 32768, test 32768.
  "patch_camelyon": Ref(
    "patch_camelyon:2.*.*", {"train": 262_144, "validation": 32_768, "test": 32_768},
    262_144, 32_768, 32_768, "validation[:200]", "test",
  ),
  # eurosat.py: 60/20/20 of tfds train ("27000 labeled ... samples"), test train[train+val:];
  # eurosat_test.py: train 16200, val 5400, trainval 21600, test 5400.
  "eurosat": Ref(
    "eurosat/rgb:2.*.*", {"train": 27_000}, 16_200, 5_400, 5_400,
    "train[16200:16400]", "train[21600:]",
  ),
  # resisc45.py: 60/20/20 of tfds train ("31,500 images"); resisc45_test.py: train 18900,
  # val 6300, trainval 25200, test 6300.
  "resisc45": Ref(
    "resisc45:3.*.*", {"train": 31_500}, 18_900, 6_300, 6_300,
    "train[18900:19100]", "train[25200:]",
  ),
  # diabetic_retinopathy.py (btgraham-300): validation[:200]; its test: 35126 / 10906, test 42670.
  "diabetic_retinopathy": Ref(
    "diabetic_retinopathy_detection/btgraham-300:3.*.*",
    {"train": 35_126, "validation": 10_906, "test": 42_670}, 35_126, 10_906, 42_670,
    "validation[:200]", "test",
  ),
  # clevr.py: TRAIN_SPLIT_PERCENT = 90 of tfds train, test = tfds validation; clevr_test.py:
  # train 63000, val 7000, trainval 70000, test 15000 (clevr.py reads that count off tfds `test`;
  # tfds `validation`, the one it evaluates on, has 15,000 too: tfds catalog, clevr 3.1.0).
  "clevr_count": Ref(
    "clevr:3.*.*", {"train": 70_000, "validation": 15_000}, 63_000, 7_000, 15_000,
    "train[63000:63200]", "validation",
  ),
  "clevr_dist": Ref(
    "clevr:3.*.*", {"train": 70_000, "validation": 15_000}, 63_000, 7_000, 15_000,
    "train[63000:63200]", "validation",
  ),
  # dmlab.py: validation[:200]; dmlab_test.py: 65550 / 22628, test 22735.
  "dmlab": Ref(
    "dmlab:2.0.1", {"train": 65_550, "validation": 22_628, "test": 22_735},
    65_550, 22_628, 22_735, "validation[:200]", "test",
  ),
  # dsprites.py: TRAIN_SPLIT_PERCENT = 80, VAL_SPLIT_PERCENT = 10, test the rest, all of tfds
  # train; dsprites_test.py: train 589824, val 73728, trainval 663552, test 73728 (737280 in all).
  "dsprites_loc": Ref(
    "dsprites:2.*.*", {"train": 737_280}, 589_824, 73_728, 73_728,
    "train[589824:590024]", "train[663552:]",
  ),
  "dsprites_ori": Ref(
    "dsprites:2.*.*", {"train": 737_280}, 589_824, 73_728, 73_728,
    "train[589824:590024]", "train[663552:]",
  ),
  # kitti.py: validation[:200]; kitti_test.py: train 6347, val 423, test 711.
  "kitti_dist": Ref(
    "kitti:3.1.0", {"train": 6_347, "validation": 423, "test": 711}, 6_347, 423, 711,
    "validation[:200]", "test",
  ),
  # smallnorb.py: VAL_SPLIT_PERCENT = 50 of tfds test (val test[:50%], test test[50%:]),
  # val200 test[:200]; smallnorb_test.py: train 24300, val 12150, test 12150.
  "smallnorb_azi": Ref(
    "smallnorb:2.*.*", {"train": 24_300, "test": 24_300}, 24_300, 12_150, 12_150,
    "test[:200]", "test[50%:]",
  ),
  "smallnorb_ele": Ref(
    "smallnorb:2.*.*", {"train": 24_300, "test": 24_300}, 24_300, 12_150, 12_150,
    "test[:200]", "test[50%:]",
  ),
}  # fmt: skip
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
# The one builder version that differs: tfds 4.9 builds oxford_iiit_pet 4.0.0 only.
BUILDER_VERSIONS_HERE = {"oxford_iiit_pet": "oxford_iiit_pet:4.*.*"}
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


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_splits_are_the_reference_s(name):
  task, ref = vtab.TASKS[name], REFERENCE[name]
  assert task.builder == BUILDER_VERSIONS_HERE.get(name, ref.builder)
  assert task.tfds_sizes == ref.tfds_sizes
  assert task.splits == dict(
    train800="train[:800]",
    val200=ref.val200,
    train800val200=f"train[:800]+{ref.val200}",
    test=ref.test_split,
  )
  assert ref.test == TEST_SIZES[name]  # the reference's test agrees with the paper's Table 4
  splits = _split_dict(ref.tfds_sizes)  # tfds's own slicing, on the reference's tfds sizes
  sizes = {s: splits[tfds_split].num_examples for s, tfds_split in task.splits.items()}
  assert sizes == dict(train800=800, val200=200, train800val200=1000, test=ref.test)
  ((val_name, val_start, _),) = _ranges(ref.val200)
  carved_test = ref.test_split.startswith("train[")  # EuroSAT, Resisc45, dSprites
  if val_name == "train":  # the first 200 of the reference's val, right after its train
    assert val_start == ref.train
    assert ref.train + ref.val + (ref.test if carved_test else 0) == ref.tfds_sizes["train"]
  elif val_name == "validation":
    assert ref.val == ref.tfds_sizes["validation"]
  if carved_test:  # the rest of tfds train after the reference's train and val
    ((_, test_start, _),) = _ranges(ref.test_split)
    assert test_start == ref.train + ref.val


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


def _reference_bin(thrs, dist):
  """task_adaptation's binning, verbatim (clevr.py `_closest_object_preprocess_fn`, kitti.py
  `_closest_vehicle_distance_pp`): `tf.reduce_max(tf.where((thrs - dist) < 0))`."""
  return int(tf.reduce_max(tf.where((np.array(thrs) - dist) < 0)))


def _around(t):
  """The float32 just below `t`, `t` itself and the float32 just above."""
  t = np.float32(t)
  return np.nextafter(t, np.float32(-np.inf)), t, np.nextafter(t, np.float32(np.inf))


# clevr.py's and kitti.py's thresholds; a depth exactly on one falls in the bin below it
# (the reference's test is strict: thrs < dist). Per threshold: labels just below, on, above.
CLEVR_THRS = [0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0]
CLEVR_ON_THRS = {8.0: (0, 0, 1), 8.5: (1, 1, 2), 9.0: (2, 2, 3), 9.5: (3, 3, 4),
                 10.0: (4, 4, 5), 100.0: (5, 5, 6)}  # fmt: skip
KITTI_THRS = [-100.0, 8.0, 20.0, 999.0]
KITTI_ON_THRS = {8.0: (0, 0, 1), 20.0: (1, 1, 2), 999.0: (2, 2, 3)}


def test_clevr_distance_on_each_threshold():
  def label(depth):
    coords = np.array([[0.0, 0.0, 150.0], [0.0, 0.0, depth]], np.float32)  # the closest counts
    return _label("clevr_dist", objects=dict(pixel_coords=tf.constant(coords)))

  for t, expected in CLEVR_ON_THRS.items():
    for depth, want in zip(_around(t), expected, strict=True):
      assert label(depth) == want == _reference_bin(CLEVR_THRS, tf.constant(depth)), (t, depth)
  # At the lowest threshold (depth 0, no real scene) neither gives a class: the reference takes
  # the max of no index (int64 min), vtab.py -1.
  assert label(0.0) < 0 and _reference_bin(CLEVR_THRS, tf.constant(0.0)) < 0


def test_kitti_distance_on_each_threshold():
  def frame(types, depths):
    location = np.zeros([len(depths), 3], np.float32)
    location[:, 2] = depths
    return dict(type=tf.constant(types, tf.int64), location=tf.constant(location))

  for t, expected in KITTI_ON_THRS.items():
    for depth, want in zip(_around(t), expected, strict=True):
      # A van at `depth`; a pedestrian (3) closer and a car (0) farther do not change it.
      got = _label("kitti_dist", objects=frame([3, 1, 0], [1.0, depth, 1500.0]))
      assert got == want == _reference_bin(KITTI_THRS, tf.constant(depth)), (t, depth)
  # kitti_test.py's test_closest_vehicle, its cases and labels.
  assert _label("kitti_dist", objects=frame([0], [1.0])) == 0
  assert _label("kitti_dist", objects=frame([0], [10.0])) == 1
  assert _label("kitti_dist", objects=frame([0], [30.0])) == 2
  assert _label("kitti_dist", objects=frame([4], [30.0])) == 3
  assert _label("kitti_dist", objects=frame([0, 1], [30.0, 1.0])) == 0


def test_dsprites_binning_of_every_value():
  # dsprites.py: floordiv(float32(value), num_original_classes / num_classes), 16 classes
  # (run_all_tasks.sh); tfds dsprites has 32 x positions and 40 orientations. A value on a
  # class boundary (x 2, 4, ...; orientation 2.5k for even k: 0, 5, 10, ...) opens the next class.
  x_classes = [v // 2 for v in range(32)]
  ori_classes = [0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4, 5, 5, 6, 6, 6, 7, 7,
                 8, 8, 8, 9, 9, 10, 10, 10, 11, 11, 12, 12, 12, 13, 13, 14, 14, 14, 15, 15]  # fmt: skip
  for feature, task, num_values, expected in (
    ("label_x_position", "dsprites_loc", 32, x_classes),
    ("label_orientation", "dsprites_ori", 40, ori_classes),
  ):
    factor = float(num_values) / 16
    for value, want in enumerate(expected):
      v = tf.constant(value, tf.int64)
      reference = int(tf.cast(tf.math.floordiv(tf.cast(v, tf.float32), factor), tf.int64))
      assert _label(task, **{feature: v}) == want == reference, (task, value)


def test_smallnorb_labels_are_the_tfds_labels():
  # smallnorb.py: label = tensors[predicted_attribute], azimuth 18 classes, elevation 9.
  for task, feature, n in (("smallnorb_azi", "label_azimuth", 18),
                           ("smallnorb_ele", "label_elevation", 9)):  # fmt: skip
    for value in range(n):
      assert _label(task, **{feature: tf.constant(value, tf.int64)}) == value


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
