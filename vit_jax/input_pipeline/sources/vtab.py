"""The 19 tasks of VTAB-1k (Zhai et al., 2019) as google-research/task_adaptation defines them.

Each task names a tfds builder (with the version its split sizes belong to), where its four
VTAB-1k splits (train800, val200, train800val200, test: docs/transfer.md) lie in that builder's
tfds splits, its number of classes, and how a tfds record becomes (image, label): the label
transforms are task_adaptation's, re-implemented. Grey images (smallNORB, dSprites) become 3
equal channels in the pipeline's `decode`; dSprites' 0/1 pixels are scaled to 0/255 first.

The data layer uses a task through `dataset.vtab_task` (tfds_source.TfdsSource: labels, class count,
and a check of the recorded split sizes against the prepared data); configs/finetune.py offers
each task as `dataset=vtab/<name>`. This module holds TensorFlow ops and tables only.
"""

import dataclasses
from collections.abc import Callable
from operator import itemgetter

import numpy as np
import tensorflow as tf

GROUPS = ("natural", "specialized", "structured")

Features = dict  # a tfds record: feature name -> tensor (the image still encoded)


@dataclasses.dataclass(frozen=True)
class Task:
  """One VTAB-1k task.

  Attributes:
    name: the task's name here (`clevr_count`, ...); `title` the paper's column name.
    group: 'natural' | 'specialized' | 'structured'.
    builder: tfds name with config and version (`clevr:3.*.*`).
    num_classes: classes after the label transform.
    tfds_sizes: examples in each tfds split the task reads, for that version (the val200 offset
      and carved test splits depend on them; checked against the prepared data).
    val200: the tfds split of val200, or the percentage of tfds `train` that the task's training
      part takes (val200: the 200 examples right after it); test: the tfds split of the test set.
    label: record → int64 scalar label (default the record's `label`).
    image: record → image (encoded bytes or uint8 [h, w, c]; default the record's `image`).
  """

  name: str
  title: str
  group: str
  builder: str
  num_classes: int
  tfds_sizes: dict[str, int]
  val200: str | int = "validation[:200]"
  test: str = "test"
  label: Callable[[Features], tf.Tensor] = lambda x: x["label"]
  image: Callable[[Features], tf.Tensor] = lambda x: x["image"]

  @property
  def splits(self) -> dict[str, str]:
    """VTAB split name → tfds split string."""
    val200 = self.val200
    if isinstance(val200, int):
      start = val200 * self.tfds_sizes["train"] // 100
      val200 = f"train[{start}:{start + 200}]"
    return dict(
      train800="train[:800]", val200=val200, train800val200=f"train[:800]+{val200}", test=self.test
    )

  def parse(self, raw: Features) -> tuple[tf.Tensor, tf.Tensor]:
    """(image, labels int64 [1]) of a tfds record, as source.Source.parse returns them."""
    return self.image(raw), tf.reshape(tf.cast(self.label(raw), tf.int64), [1])


def _bin(value: tf.Tensor, thresholds) -> tf.Tensor:
  """Index of the last threshold below `value` (task_adaptation's `max(where(thrs < value))`)."""
  below = tf.cast(tf.constant(thresholds, tf.float32) < tf.cast(value, tf.float32), tf.int64)
  return tf.reduce_sum(below) - 1


def clevr_count(x: Features) -> tf.Tensor:
  """Number of objects − 3 (CLEVR scenes hold 3 to 10)."""
  return tf.cast(tf.size(x["objects"]["size"]), tf.int64) - 3


def clevr_distance(x: Features) -> tf.Tensor:
  """Depth of the closest object, binned at 8, 8.5, 9, 9.5, 10 → 6 classes."""
  depth = tf.reduce_min(x["objects"]["pixel_coords"][:, 2])
  return _bin(depth, [0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0])


KITTI_VEHICLES = 3  # kitti's objects/type ids 0, 1, 2: Car, Van, Truck


def kitti_distance(x: Features) -> tf.Tensor:
  """Depth (m) of the closest car/van/truck binned at 8 and 20; class 3: no vehicle in the frame."""
  depth = x["objects"]["location"][:, 2]
  vehicles = tf.boolean_mask(depth, x["objects"]["type"] < KITTI_VEHICLES)
  closest = tf.reduce_min(tf.concat([vehicles, tf.constant([1000.0], depth.dtype)], 0))
  return _bin(closest, [-100.0, 8.0, 20.0, 999.0])


def _binned(feature: str, num_values: int, num_classes: int) -> Callable[[Features], tf.Tensor]:
  """floor(value / (num_values / num_classes)): neighbouring values grouped into one class."""
  factor = num_values / num_classes

  def label(x):
    return tf.cast(tf.math.floordiv(tf.cast(x[feature], tf.float32), factor), tf.int64)

  return label


def dsprites_image(x: Features) -> tf.Tensor:
  """dSprites' binary PNG (pixels 0/1) → uint8 [64, 64, 1] of 0/255."""
  image = tf.io.decode_png(x["image"], channels=1)
  return tf.cast(image > 0, tf.uint8) * 255


_DSPRITES = dict(
  group="structured",
  builder="dsprites:2.*.*",
  num_classes=16,
  tfds_sizes={"train": 737_280},
  # 80% train, 10% validation, 10% test, all out of tfds train.
  val200=80,
  test="train[663552:]",
  image=dsprites_image,
)
_SMALLNORB = dict(
  group="structured",
  builder="smallnorb:2.*.*",
  tfds_sizes={"train": 24_300, "test": 24_300},
  val200="test[:200]",
  test="test[50%:]",
)
_CLEVR = dict(
  group="structured",
  builder="clevr:3.*.*",
  tfds_sizes={"train": 70_000, "validation": 15_000},
  val200=90,
  test="validation",
)

_TASKS = (
  # Natural.
  Task("caltech101", "Caltech101", "natural", "caltech101:3.*.*", 102, {"train": 3_060, "test": 6_084}, 90),
  Task("cifar100", "CIFAR-100", "natural", "cifar100:3.*.*", 100, {"train": 50_000, "test": 10_000}, 90),
  Task("dtd", "DTD", "natural", "dtd:3.*.*", 47, {"train": 1_880, "validation": 1_880, "test": 1_880}),
  Task(
    "oxford_flowers102", "Flowers102", "natural", "oxford_flowers102:2.*.*", 102,
    {"train": 1_020, "validation": 1_020, "test": 6_149},
  ),
  # task_adaptation reads version 3; tfds 4.9 builds only 4.0.0 (same images and splits).
  Task("oxford_iiit_pet", "Pets", "natural", "oxford_iiit_pet:4.*.*", 37, {"train": 3_680, "test": 3_669}, 80),
  Task(
    "sun397", "Sun397", "natural", "sun397/tfds:4.*.*", 397,
    {"train": 76_128, "validation": 10_875, "test": 21_750},
  ),
  Task("svhn", "SVHN", "natural", "svhn_cropped:3.*.*", 10, {"train": 73_257, "test": 26_032}, 90),
  # Specialized.
  Task(
    "patch_camelyon", "Camelyon", "specialized", "patch_camelyon:2.*.*", 2,
    {"train": 262_144, "validation": 32_768, "test": 32_768},
  ),
  # 60% train, 20% validation, 20% test, all out of tfds train.
  Task("eurosat", "EuroSAT", "specialized", "eurosat/rgb:2.*.*", 10, {"train": 27_000}, 60, "train[21600:]"),
  Task("resisc45", "Resisc45", "specialized", "resisc45:3.*.*", 45, {"train": 31_500}, 60, "train[25200:]"),
  Task(
    "diabetic_retinopathy", "Retinopathy", "specialized",
    "diabetic_retinopathy_detection/btgraham-300:3.*.*", 5,
    {"train": 35_126, "validation": 10_906, "test": 42_670},
  ),
  # Structured.
  Task("clevr_count", "Clevr-Count", num_classes=8, label=clevr_count, **_CLEVR),
  Task("clevr_dist", "Clevr-Dist", num_classes=6, label=clevr_distance, **_CLEVR),
  Task(
    "dmlab", "DMLab", "structured", "dmlab:2.0.1", 6,
    {"train": 65_550, "validation": 22_628, "test": 22_735},
  ),
  Task("dsprites_loc", "dSpr-Loc", label=_binned("label_x_position", 32, 16), **_DSPRITES),
  Task("dsprites_ori", "dSpr-Ori", label=_binned("label_orientation", 40, 16), **_DSPRITES),
  Task(
    "kitti_dist", "KITTI-Dist", "structured", "kitti:3.1.0", 4,
    {"train": 6_347, "validation": 423, "test": 711}, label=kitti_distance,
  ),
  Task("smallnorb_azi", "sNORB-Azim", num_classes=18, label=itemgetter("label_azimuth"), **_SMALLNORB),
  Task("smallnorb_ele", "sNORB-Elev", num_classes=9, label=itemgetter("label_elevation"), **_SMALLNORB),
)  # fmt: skip
TASKS: dict[str, Task] = {t.name: t for t in _TASKS}


def get_task(name: str) -> Task:
  """The task `name`; a ValueError lists the known names."""
  if name not in TASKS:
    raise ValueError(f"unknown VTAB-1k task {name!r}; known: {sorted(TASKS)}")
  return TASKS[name]


def check_tfds_sizes(task: Task, known: dict[str, int]) -> None:
  """Raises if the prepared tfds data's split sizes (`known`: tfds split name → examples; empty:
  unknown, no check) differ from the task's recorded ones."""
  for split, expected in task.tfds_sizes.items():
    found = known.get(split)
    if found is not None and found != expected:
      raise ValueError(
        f"VTAB task {task.name!r}: tfds {task.builder} split {split!r} has {found} examples, "
        f"the task's splits assume {expected} (another version of the dataset?)"
      )


def group_means(accuracies: dict[str, float]) -> dict[str, float]:
  """Mean top-1 per group and over all 19 tasks (`natural`, ..., `mean`), each only where all
  its tasks are in `accuracies`."""
  out = {}
  for group in GROUPS:
    names = [t.name for t in _TASKS if t.group == group]
    if all(n in accuracies for n in names):
      out[group] = float(np.mean([accuracies[n] for n in names]))
  if all(t.name in accuracies for t in _TASKS):
    out["mean"] = float(np.mean([accuracies[t.name] for t in _TASKS]))
  return out
