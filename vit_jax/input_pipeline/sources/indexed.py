"""The sources addressed by index, of every task: image folders (`folder`, `seg_folder`,
`det_folder`) and the bundled arrays (`builtin`, `seg_builtin`, `det_builtin`). Each holds its listing (file paths) or its arrays in
memory, has one seeded order of the whole run (base.IndexedSource) and splits by example over the
hosts. A split may be a slice (`train[:98%]`, `train[:800]`; vit_jax.input_pipeline.splits).
"""

import functools
import os

import tensorflow as tf

from vit_jax.input_pipeline import bad_data, splits
from vit_jax.input_pipeline.sources import (
  base,
  builtin,
  detection,
  detection_synthetic,
  segmentation,
  segmentation_synthetic,
)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def read_file(path: tf.Tensor) -> tf.Tensor:
  """The bytes of the file `path` (string scalar), read in Python with retries (bad_data): a
  string scalar. An I/O error after the retries ends the run (its mark survives tf.data)."""
  data = tf.numpy_function(_read_file, [path], tf.string)
  return tf.ensure_shape(data, [])


def _read_file(path: bytes) -> bytes:
  with bad_data.marked_errors():
    return bad_data.read_file(path.decode(), tf.io.gfile.GFile)


class _Objects:
  """A detection source's objects of its N examples, in memory: float64 [total, 8] rows
  (sources/detection.py) and where each example's start."""

  def __init__(self, objects: list):
    flat, offsets = detection.ragged(objects)
    self.flat, self.offsets = tf.constant(flat), tf.constant(offsets)

  def of(self, index: tf.Tensor) -> tf.Tensor:
    """The objects of example `index`: float64 [n, 8]."""
    return self.flat[self.offsets[index] : self.offsets[index + 1]]


class FolderSource(base.IndexedSource):
  """An image folder (`folder`, `seg_folder`, `det_folder`: docs/data.md, docs/segmentation.md),
  each file read when it is needed; a `folder`'s classes are the sorted class folder names of all
  splits, a `det_folder`'s the categories of its instances.json files."""

  reads_files = True
  channels = 3

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    if self.task == base.SEGMENTATION:
      name = splits.base_split(split)
      listing = segmentation.folder_paths(base.data_dir(config), name)
      paths, labels = splits.take(split, f"segmentation split {name!r}", *listing)
    elif self.task == base.DETECTION:
      name = splits.base_split(split)
      listing = detection.folder_examples(base.data_dir(config), name)
      paths, wheres, objects = splits.take(split, f"detection split {name!r}", *listing)
      self.wheres, self.objects = tf.constant(wheres), _Objects(objects)
    else:
      split_dir = folder_split_dir(config, split)
      self.class_names = folder_class_names(config.data_dir)
      listing = _class_listing(self.class_names, split_dir)
      paths, labels = splits.take(split, f"Image folder {split_dir!r}", *listing)
    self.paths = tf.constant(paths)
    # A record's label: its class (int64), or its mask's path (detection: `objects`).
    if self.task != base.DETECTION:
      dtype = tf.string if self.task == base.SEGMENTATION else tf.int64
      self.labels = tf.constant(labels, dtype)
    self.num_items = len(paths)

  @classmethod
  def info(cls, config) -> base.DatasetInfo:
    if base.task_of(config) == base.SEGMENTATION:
      names = segmentation.folder_class_names(config.data_dir or "")
      if names is None and config.num_classes is None:
        raise ValueError(
          f"segmentation folder {config.data_dir}: no classes.txt; set dataset.num_classes"
        )
      return base.dataset_info(config, None, names, base.split_sizes(cls, config))
    if base.task_of(config) == base.DETECTION:
      root = base.data_dir(config)
      found = detection.folder_splits(root)
      if not found:
        raise base.MissingDataError(f"detection folder {root}: no <split>/{detection.INSTANCES}")
      train = splits.base_split(config.train_split)
      names = detection.folder_class_names(root, train if train in found else found[0])
      return base.dataset_info(config, None, names, base.split_sizes(cls, config))
    class_names = folder_class_names(config.data_dir) if config.data_dir else None
    splits_ = dict.fromkeys([config.train_split, config.eval_split])
    num_examples = {s: cls(config, s, 0, 1).num_items for s in splits_}
    return base.dataset_info(config, None, class_names, num_examples)

  @classmethod
  def check_readable(cls, config, split):
    if base.task_of(config) != base.CLASSIFICATION:
      return super().check_readable(config, split)
    folder_split_dir(config, split)  # not listed

  def read(self, raw):
    """The image file's bytes (`raw['bytes']`; the mask's: `mask_bytes`), read in Python with
    retries (bad_data)."""
    i = raw["index"]
    out = {**raw, "bytes": read_file(tf.gather(self.paths, i))}
    if self.task == base.SEGMENTATION:
      out["mask_bytes"] = read_file(tf.gather(self.labels, i))
    return out

  def parse(self, raw):
    if self.task == base.DETECTION:
      return raw["bytes"], self.objects.of(raw["index"]), self.where(raw)
    label = tf.gather(self.labels, raw["index"])
    if self.task == base.SEGMENTATION:
      return raw["bytes"], raw["mask_bytes"], label
    return raw["bytes"], label[None]

  def where(self, raw):
    if self.task == base.DETECTION:
      return tf.gather(self.wheres, raw["index"])
    return tf.gather(self.paths, raw["index"])


def _class_listing(class_names: list[str], split_dir: str) -> tuple[list[str], list[int]]:
  """(image paths, labels) of a classification folder's split, listed, not read."""
  paths, labels = [], []
  for label, name in enumerate(class_names):
    class_dir = os.path.join(split_dir, name)
    if not tf.io.gfile.isdir(class_dir):
      continue
    for filename in sorted(tf.io.gfile.listdir(class_dir)):
      if os.path.splitext(filename)[1].lower() in IMAGE_EXTENSIONS:
        paths.append(os.path.join(class_dir, filename))
        labels.append(label)
  if not paths:
    raise base.MissingDataError(f"No images match {split_dir}/<class>/*.{{jpg,jpeg,png}}.")
  return paths, labels


def folder_split_dir(config, split: str) -> str:
  """`data_dir/<split>` of an image folder; MissingDataError if it is not a directory."""
  split_dir = os.path.join(config.data_dir or "", splits.base_split(split))
  if not config.data_dir or not tf.io.gfile.isdir(split_dir):
    raise base.MissingDataError(
      f"Image folder split {split_dir!r} does not exist (dataset.data_dir={config.data_dir!r})."
    )
  return split_dir


@functools.cache
def folder_class_names(root: str) -> list[str]:
  names = set()
  for split in tf.io.gfile.listdir(root):
    split_dir = os.path.join(root, split.rstrip("/"))
    if tf.io.gfile.isdir(split_dir):
      listed = tf.io.gfile.listdir(split_dir)
      names.update(c.rstrip("/") for c in listed if tf.io.gfile.isdir(os.path.join(split_dir, c)))
  return sorted(names)


class BuiltinSource(base.IndexedSource):
  """Bundled arrays in memory: `builtin` (builtin.py), uint8 [N, H, W, 1], `seg_builtin`
  (segmentation_synthetic.py), canvases uint8 [N, 48, 48, 1] with masks [N, 48, 48], or
  `det_builtin` (detection_synthetic.py), canvases uint8 [N, 64, 64, 1] with their objects."""

  may_fail = False
  channels = 1

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    if self.task == base.DETECTION:
      images, objects, _ = detection_synthetic.get_split(config.name, split)
      self.images, self.objects = tf.constant(images), _Objects(objects)
      self.num_items = len(images)
      return
    seg = self.task == base.SEGMENTATION
    images, labels = (segmentation_synthetic if seg else builtin).get_split(config.name, split)
    self.images = tf.constant(images)
    self.labels = tf.constant(labels)  # [N] classes, or [N, 48, 48] masks
    self.num_items = len(labels)

  @classmethod
  def info(cls, config) -> base.DatasetInfo:
    if base.task_of(config) == base.DETECTION:
      names = detection_synthetic.synthetic_class_names(config.name)
      num_examples = {}
      for s in dict.fromkeys([config.train_split, config.eval_split]):
        try:  # None for a split the tasks do not have; no canvas is made
          num_examples[s] = detection_synthetic.num_examples(s)
        except ValueError:
          num_examples[s] = None
      return base.dataset_info(config, None, names, num_examples)
    seg = base.task_of(config) == base.SEGMENTATION
    if seg:
      names = segmentation_synthetic.synthetic_class_names(config.name)
    else:
      names = list(builtin.load(config.name).class_names)
    num_examples = {}  # from the splits' sizes: no canvas is made
    for s in dict.fromkeys([config.train_split, config.eval_split]):
      try:  # None for a split the dataset does not have
        if seg:
          n = segmentation_synthetic.SPLIT_SIZES.get(splits.base_split(s))
          rows = None if n is None else splits.slice_rows(s, n, f"segmentation split {s!r}")
          num_examples[s] = n if rows is None else len(rows)
        else:
          num_examples[s] = len(builtin.get_split(config.name, s)[1])
      except ValueError:
        num_examples[s] = None
    return base.dataset_info(config, None, names, num_examples)

  @classmethod
  def check_readable(cls, config, split):
    if base.task_of(config) != base.CLASSIFICATION:
      return super().check_readable(config, split)
    del config, split  # bundled: always there

  def parse(self, raw):
    i = raw["index"]
    if self.task == base.DETECTION:
      return tf.gather(self.images, i), self.objects.of(i), self.where(raw)
    image, label = tf.gather(self.images, i), tf.gather(self.labels, i)
    if self.task == base.SEGMENTATION:
      return image, label, self.where(raw)
    return image, label[None]

  def where(self, raw):
    prefix = f"{self.config.source} dataset {self.config.name!r} split {self.split!r} example "
    return tf.strings.join([prefix, tf.strings.as_string(raw["index"])])
