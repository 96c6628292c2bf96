"""The classification sources addressed by index: an image folder (`folder`) and the bundled
offline datasets (`builtin`). Each holds its listing (file paths) or its arrays in memory, has one
seeded order of the whole run (source.IndexedSource) and splits by example over the hosts.
"""

import functools
import os

import tensorflow as tf

from vit_jax.input_pipeline import bad_data, builtin, source, splits

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def read_file(path: tf.Tensor) -> tf.Tensor:
  """The bytes of the file `path` (string scalar), read in Python with retries (bad_data): a
  string scalar. An I/O error after the retries ends the run (its mark survives tf.data)."""
  data = tf.numpy_function(_read_file, [path], tf.string)
  return tf.ensure_shape(data, [])


def _read_file(path: bytes) -> bytes:
  with bad_data.marked_errors():
    return bad_data.read_file(path.decode(), tf.io.gfile.GFile)


class FolderSource(source.IndexedSource):
  """`root/<split>/<class>/*.{jpg,jpeg,png}`; classes are the sorted class folder names of all splits.

  A split may be a slice of a folder (`train[:98%]`, `train[98%:]`, `train[:800]`), taken as
  for the bundled datasets (vit_jax.input_pipeline.splits).
  """

  reads_files = True

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    root, split_dir = config.data_dir, folder_split_dir(config, split)
    self.class_names = folder_class_names(root)
    paths, labels = [], []
    for label, name in enumerate(self.class_names):
      class_dir = os.path.join(split_dir, name)
      if not tf.io.gfile.isdir(class_dir):
        continue
      for filename in sorted(tf.io.gfile.listdir(class_dir)):
        if os.path.splitext(filename)[1].lower() in IMAGE_EXTENSIONS:
          paths.append(os.path.join(class_dir, filename))
          labels.append(label)
    if not paths:
      raise source.MissingDataError(f"No images match {split_dir}/<class>/*.{{jpg,jpeg,png}}.")
    rows = splits.slice_rows(split, len(paths), f"Image folder {split_dir!r}")
    if rows is not None:
      paths, labels = [paths[i] for i in rows], [labels[i] for i in rows]
    self.paths = tf.constant(paths)
    self.labels = tf.constant(labels, tf.int64)
    self.num_items = len(paths)

  @classmethod
  def info(cls, config) -> source.DatasetInfo:
    class_names = folder_class_names(config.data_dir) if config.data_dir else None
    splits_ = dict.fromkeys([config.train_split, config.eval_split])
    num_examples = {s: cls(config, s, 0, 1).num_items for s in splits_}
    return source.dataset_info(config, None, class_names, num_examples)

  @classmethod
  def check_readable(cls, config, split):
    folder_split_dir(config, split)

  def read(self, raw):
    """The image file's bytes (`raw['bytes']`), read in Python with retries (bad_data)."""
    return {**raw, "bytes": read_file(tf.gather(self.paths, raw["index"]))}

  def parse(self, raw):
    return raw["bytes"], tf.gather(self.labels, raw["index"])[None]

  def where(self, raw):
    return tf.gather(self.paths, raw["index"])


def folder_split_dir(config, split: str) -> str:
  """`data_dir/<split>` of an image folder; MissingDataError if it is not a directory."""
  split_dir = os.path.join(config.data_dir or "", splits.base_split(split))
  if not config.data_dir or not tf.io.gfile.isdir(split_dir):
    raise source.MissingDataError(
      f"Image folder split {split_dir!r} does not exist (dataset.data_dir={config.data_dir!r})."
    )
  return split_dir


@functools.cache
def folder_class_names(root: str) -> list[str]:
  names = set()
  for split in tf.io.gfile.listdir(root):
    split_dir = os.path.join(root, split.rstrip("/"))
    if tf.io.gfile.isdir(split_dir):
      names.update(
        c.rstrip("/")
        for c in tf.io.gfile.listdir(split_dir)
        if tf.io.gfile.isdir(os.path.join(split_dir, c))
      )
  return sorted(names)


class BuiltinSource(source.IndexedSource):
  """A bundled offline dataset (builtin.py), held in memory as uint8 arrays."""

  may_fail = False

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    images, labels = builtin.get_split(config.name, split)
    self.images = tf.constant(images)  # [N, H, W, 1] uint8
    self.labels = tf.constant(labels)
    self.num_items = len(labels)

  @classmethod
  def info(cls, config) -> source.DatasetInfo:
    class_names = list(builtin.load(config.name).class_names)
    num_examples = {}
    for s in dict.fromkeys([config.train_split, config.eval_split]):
      try:  # None for a split the dataset does not have
        num_examples[s] = len(builtin.get_split(config.name, s)[1])
      except ValueError:
        num_examples[s] = None
    return source.dataset_info(config, None, class_names, num_examples)

  @classmethod
  def check_readable(cls, config, split):
    del config, split  # bundled: always there

  def parse(self, raw):
    return tf.gather(self.images, raw["index"]), tf.gather(self.labels, raw["index"])[None]

  def where(self, raw):
    prefix = f"builtin dataset {self.config.name!r} split {self.split!r} example "
    return tf.strings.join([prefix, tf.strings.as_string(raw["index"])])
