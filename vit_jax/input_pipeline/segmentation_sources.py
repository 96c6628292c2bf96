"""The segmentation sources: `seg_builtin`, `seg_folder` and `seg_shards` (the data:
vit_jax.input_pipeline.segmentation), read per record through the same pipeline as the
classification sources (vit_jax.input_pipeline.pipeline), so they have the same iterators, resume,
hosts and bad-data handling.

- `seg_builtin` holds a synthetic task's canvases in memory (segmentation_synthetic);
- `seg_folder` holds its listing (two paths per example) and reads the image and mask files of
  each record as it is needed, as the `folder` source does;
- `seg_shards` streams its TFRecord shards record by record, as the `tfrecord` source does
  (shards.TFRecordSource: by file per host, a shuffle buffer of `dataset.shuffle_buffer` raw
  records, damaged shards' lost records counted from dataset_info.json): a host holds that
  buffer and a few records per file it reads, never its split.

The first two have one order of the whole run (source.IndexedSource), the permutation of each
epoch numpy's `default_rng([seed, epoch])`, so an example and its augmentation are a function of
the seed and its stream position on any number of hosts. The shards are read per host, like any
shards: exact resume on the same number of hosts. Splits can be sliced (`train[:1000]`,
vit_jax.input_pipeline.splits): the same examples of a folder, of its shards and of a synthetic
task; a slice of shards is read by every host (its records found by their written position), the
examples kept split over the hosts.
"""

import os

import numpy as np
import tensorflow as tf

from vit_jax.input_pipeline import (
  indexed,
  segmentation,
  segmentation_synthetic,
  shards,
  source,
  splits,
)


class _NumpyOrder(source.IndexedSource):
  """An indexed segmentation source: the permutation of epoch e is numpy's
  `default_rng([seed, e]).permutation(N)`."""

  task = source.SEGMENTATION

  def permutation(self, epoch, seed):
    n = self.num_items

    def order(e):
      return np.random.default_rng([seed, int(e)]).permutation(n).astype(np.int64)

    index = tf.numpy_function(order, [tf.cast(epoch, tf.int64)], tf.int64, stateful=False)
    return tf.ensure_shape(index, [n])


def _data_dir(config) -> str:
  if not config.data_dir:
    raise ValueError(f"dataset.source={config.source!r} needs dataset.data_dir")
  return config.data_dir


def _split_sizes(cls, config) -> dict[str, int | None]:
  """Examples of the config's train and eval splits; None for a split that is not there."""
  sizes = {}
  for split in dict.fromkeys([config.train_split, config.eval_split]):
    try:
      sizes[split] = cls(config, split, 0, 1).host_length(0)
    except (ValueError, FileNotFoundError):
      sizes[split] = None
  return sizes


class SyntheticSource(_NumpyOrder):
  """`seg_builtin`: a synthetic task's canvases, uint8 arrays in memory."""

  may_fail = False
  channels = 1

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    base = splits.base_split(split)
    data = segmentation_synthetic.synthetic_split(config.name, base)
    images, masks = data.images, data.masks
    rows = splits.slice_rows(split, len(masks), f"segmentation split {base!r}")
    if rows is not None:
      images, masks = images[rows], masks[rows]
    self.images = tf.constant(images)  # [N, 48, 48, 1]
    self.masks = tf.constant(masks)  # [N, 48, 48]
    self.num_items = len(masks)

  @classmethod
  def info(cls, config) -> source.DatasetInfo:
    names = segmentation_synthetic.synthetic_class_names(config.name)
    sizes = {}  # from the splits' sizes: no canvas is made
    for split in dict.fromkeys([config.train_split, config.eval_split]):
      n = segmentation_synthetic.SPLIT_SIZES.get(splits.base_split(split))
      try:
        rows = None if n is None else splits.slice_rows(split, n, f"segmentation split {split!r}")
      except ValueError:
        n, rows = None, None
      sizes[split] = n if rows is None else len(rows)
    return source.dataset_info(config, None, names, sizes)

  def parse(self, raw):
    i = raw["index"]
    return tf.gather(self.images, i), tf.gather(self.masks, i), self.where(raw)

  def where(self, raw):
    prefix = f"seg_builtin dataset {self.config.name!r} split {self.split!r} example "
    return tf.strings.join([prefix, tf.strings.as_string(raw["index"])])


class FolderSource(_NumpyOrder):
  """`seg_folder`: `data_dir/<split>/images/*` with `masks/*.png`, each file read when needed."""

  reads_files = True
  channels = 3

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    base = splits.base_split(split)
    images, masks = segmentation.folder_paths(_data_dir(config), base)
    rows = splits.slice_rows(split, len(images), f"segmentation split {base!r}")
    if rows is not None:
      images, masks = [images[r] for r in rows], [masks[r] for r in rows]
    self.image_paths, self.mask_paths = tf.constant(images), tf.constant(masks)
    self.num_items = len(images)

  @classmethod
  def info(cls, config) -> source.DatasetInfo:
    names = segmentation.folder_class_names(config.data_dir or "")
    if names is None and config.num_classes is None:
      raise ValueError(
        f"segmentation folder {config.data_dir}: no classes.txt; set dataset.num_classes"
      )
    return source.dataset_info(config, None, names, _split_sizes(cls, config))

  def read(self, raw):
    """The image's and the mask's bytes, read in Python with retries (bad_data)."""
    i = raw["index"]
    image = indexed.read_file(tf.gather(self.image_paths, i))
    return {**raw, "bytes": image, "mask_bytes": indexed.read_file(tf.gather(self.mask_paths, i))}

  def parse(self, raw):
    return raw["bytes"], raw["mask_bytes"], tf.gather(self.mask_paths, raw["index"])

  def where(self, raw):
    return tf.gather(self.image_paths, raw["index"])


def shards_info(data_dir: str) -> dict:
  """dataset_info.json of segmentation shards; one line if it is missing or of another task."""
  info = shards.read_info_json(data_dir)
  if info is None:
    raise FileNotFoundError(
      f"segmentation shards {data_dir}: no {shards.INFO_FILENAME} (write the shards with "
      "python -m vit_jax.tools.make_shards --task=segmentation)"
    )
  if info.get("task") != segmentation.TASK:
    raise ValueError(
      f"{os.path.join(data_dir, shards.INFO_FILENAME)}: shards of a "
      f"{info.get('task', 'classification')} task, not segmentation (source 'tfrecord' reads "
      "classification shards)"
    )
  return info


class ShardsSource(shards.TFRecordSource):
  """`seg_shards`: TFRecord shards of (image, mask) examples, streamed record by record."""

  task = source.SEGMENTATION

  def __init__(self, config, split, process_index, process_count):
    source.Source.__init__(self, config, split, process_index, process_count)
    data_dir = _data_dir(config)
    info = shards_info(data_dir)
    base = splits.base_split(split)
    entry = info["splits"].get(base)
    if entry is None:
      raise FileNotFoundError(
        f"segmentation shards {data_dir}: no split {base!r}; splits: {sorted(info['splits'])}"
      )
    self.channels = int(info["image_channels"])
    rows = splits.slice_rows(split, int(entry["num_examples"]), f"segmentation split {base!r}")
    # A slice: every host reads every file and keeps the records at the slice's positions.
    self._open(os.path.join(data_dir, entry["file_pattern"]), entry["shards"], rows is None)
    self.slice_size = None if rows is None else len(rows)
    if rows is not None:
      in_slice = np.zeros(int(entry["num_examples"]), bool)
      in_slice[rows] = True
      self._in_slice = tf.constant(in_slice)

  @classmethod
  def info(cls, config) -> source.DatasetInfo:
    names = shards_info(_data_dir(config))["class_names"]
    return source.dataset_info(config, None, names, _split_sizes(cls, config))

  def host_length(self, host):
    if self.slice_size is None:
      return super().host_length(host)
    return len(range(host, self.slice_size, self.process_count))

  def select(self, ds: tf.data.Dataset) -> tf.data.Dataset:
    """The records of the slice, in the order read; a placeholder (lost) for each of its records
    that was not found (lost with a damaged shard, or a record whose position does not parse)."""
    if self.slice_size is None:
      return ds
    n = int(self._in_slice.shape[0])

    @tf.autograph.experimental.do_not_convert
    def position(raw):
      features = {segmentation.INDEX_KEY: tf.io.FixedLenFeature([], tf.int64)}
      return raw, tf.io.parse_single_example(raw["record"], features)[segmentation.INDEX_KEY]

    @tf.autograph.experimental.do_not_convert
    def positioned(raw):  # a nested dataset: a record that does not parse is dropped, alone
      return tf.data.Dataset.from_tensors(raw).map(position).ignore_errors()

    @tf.autograph.experimental.do_not_convert
    def kept(raw, i):
      return (
        raw["ok"] & (i >= 0) & (i < n) & tf.gather(self._in_slice, tf.clip_by_value(i, 0, n - 1))
      )

    found = ds.interleave(positioned, cycle_length=1).filter(kept)
    placeholder = {
      "record": tf.constant(b""),
      "file": tf.constant(self.pattern),
      "index": tf.constant(-1, tf.int64),
      "ok": tf.constant(False),
    }
    found = found.map(tf.autograph.experimental.do_not_convert(lambda raw, i: raw))
    missing = tf.data.Dataset.from_tensors(placeholder).repeat(self.slice_size)
    return found.concatenate(missing).take(self.slice_size)

  def parse(self, raw):
    tf.debugging.assert_equal(raw["ok"], True, message="a record its damaged file lost")
    keys = (segmentation.IMAGE_KEY, segmentation.MASK_KEY, segmentation.NAME_KEY)
    f = tf.io.parse_single_example(
      raw["record"], {k: tf.io.FixedLenFeature([], tf.string) for k in keys}
    )
    where = tf.strings.join([self.where(raw), " (", f[segmentation.NAME_KEY], ")"])
    return f[segmentation.IMAGE_KEY], f[segmentation.MASK_KEY], where

  def where(self, raw):
    return tf.where(
      raw["index"] < 0,
      f"a record of split {self.split!r} lost with its damaged shard ({self.pattern})",
      super().where(raw),
    )
