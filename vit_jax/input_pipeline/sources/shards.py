"""TFRecord shards of tf.train.Example (the JFT / ImageNet-21k layout): the `tfrecord` base.

The shards are streamed record by record (tfrecord_files.py; how, and what a host holds:
docs/data.md). `dataset_info.json` beside the shards (vit_jax.tools.make_shards) gives the
classes, the split sizes and each file's record count; the files a split's pattern finds are
checked against it. A slice of segmentation or detection shards is read by every host, its
records found by their written position (docs/segmentation.md).
"""

import concurrent.futures
import functools
import json
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from vit_jax.input_pipeline import splits
from vit_jax.input_pipeline.bad_data import DataMismatchError
from vit_jax.input_pipeline.sources import base, detection, segmentation, tfrecord_files

INFO_FILENAME = "dataset_info.json"
# The feature keys of the shards tools/make_shards writes (the ImageNet-style names).
IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"


def serialize_example(
  image_bytes: bytes,
  labels: Sequence[int] | int,
  image_key: str = IMAGE_KEY,
  label_key: str = LABEL_KEY,
) -> bytes:
  """A serialized tf.train.Example with one encoded image and one or more int64 labels."""
  labels = [labels] if np.isscalar(labels) else list(labels)
  feature = {
    image_key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_bytes])),
    label_key: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in labels])),
  }
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def shard_path(directory: str, prefix: str, index: int, num_shards: int) -> str:
  """`{directory}/{prefix}.tfrecord-{index:05d}-of-{num_shards:05d}`, the shards' file names."""
  return os.path.join(directory, f"{prefix}.tfrecord-{index:05d}-of-{num_shards:05d}")


def read_info_json(directory: str | None) -> dict | None:
  """The `dataset_info.json` written by `vit_jax.tools.make_shards`, or None."""
  path = os.path.join(directory or "", INFO_FILENAME)
  if not directory or not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def tfrecord_pattern(config, split: str) -> str:
  """A split name → glob via `file_pattern`; a split that is itself a path or glob is used as is."""
  if "/" in split or any(c in split for c in "*?["):
    return split
  if not config.data_dir:
    raise base.MissingDataError(f"dataset.data_dir must be set to find TFRecord split {split!r}.")
  return os.path.join(config.data_dir, config.file_pattern.format(name=config.name, split=split))


def check_listed(files: list[str], listed: dict[str, int], pattern: str, split: str) -> None:
  """Stops when the files a split's pattern finds are not the shards dataset_info.json lists
  (shards of an earlier make_shards run beside the new ones, a shard missing)."""
  found = {os.path.basename(f) for f in files}
  extra, missing = sorted(found - set(listed)), sorted(set(listed) - found)
  kinds = ((extra, "not listed"), (missing, "listed but missing"))
  parts = [f"{len(names)} {what} ({names[0]}, ...)" for names, what in kinds if names]
  if parts:
    raise DataMismatchError(
      f"split {split!r}: the files matching {pattern!r} are not the {len(listed)} shards its "
      f"{INFO_FILENAME} lists: {'; '.join(parts)}; rewrite the split (make_shards --overwrite)"
    )


class TFRecordSource(base.Source):
  """TFRecord shards of tf.train.Example: encoded image bytes and one or more int64 labels."""

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    info = read_info_json(config.data_dir)
    pattern = tfrecord_pattern(config, split)
    info = info or read_info_json(os.path.dirname(pattern))
    self._open(pattern, (info or {}).get("splits", {}).get(split, {}).get("shards", {}))
    self.image_key = config.image_key or IMAGE_KEY
    self.label_key = config.label_key or LABEL_KEY

  def _open(self, pattern: str, listed: dict[str, int], by_file: bool = True) -> None:
    """Finds the split's files (checked against `listed`, the record count of each file that
    dataset_info.json lists) and decides how hosts split them."""
    self.pattern = pattern
    self.files = sorted(tf.io.gfile.glob(pattern))
    if not self.files:
      raise base.MissingDataError(f"No TFRecord files match {pattern!r} (split {self.split!r}).")
    self.by_file = by_file and base.uses_files_by_host(len(self.files), self.process_count)
    self._known_lengths = listed
    if listed:
      check_listed(self.files, listed, pattern, self.split)

  @classmethod
  def info(cls, config) -> base.DatasetInfo:
    info = read_info_json(config.data_dir) or {}
    if info.get("task", base.CLASSIFICATION) != base.CLASSIFICATION:
      raise ValueError(
        f"{config.data_dir}/{INFO_FILENAME}: {info['task']} shards; dataset.source="
        f"'{info['task'][:3]}_shards' reads them"
      )
    wanted = dict.fromkeys([config.train_split, config.eval_split])
    num_examples = {s: info.get("splits", {}).get(s, {}).get("num_examples") for s in wanted}
    return base.dataset_info(config, info.get("num_classes"), info.get("class_names"), num_examples)

  @property
  def lengths_known(self) -> bool:
    """Whether dataset_info.json gives every file's record count (else counting reads them)."""
    return all(os.path.basename(f) in self._known_lengths for f in self.files)

  def _host_files(self, host: int) -> list[str]:
    return self.files[host :: self.process_count] if self.by_file else self.files

  @functools.cached_property
  def file_lengths(self) -> dict[str, int]:
    """Records per file: from dataset_info.json when it lists them, else by reading the files."""
    known = {f: self._known_lengths.get(os.path.basename(f)) for f in self.files}
    missing = [f for f, n in known.items() if n is None]
    if missing:
      logging.info("Counting records in %d files of %s", len(missing), self.pattern)
      with concurrent.futures.ThreadPoolExecutor(16) as pool:
        known.update(zip(missing, pool.map(tfrecord_files.count_records, missing), strict=True))
    return known

  def host_length(self, host: int) -> int:
    if self.by_file:
      return sum(self.file_lengths[f] for f in self._host_files(host))
    return len(range(host, sum(self.file_lengths.values()), self.process_count))

  def records(self, epoch, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The raw records of this host's files (of every file when hosts split by example), the
    files in a seeded order per epoch, read 16 at a time; placeholders of lost records kept."""
    host_files = self._host_files(self.process_index)
    files = tf.constant(host_files)
    # Each file's listed record count (the placeholders of a damaged file's lost records).
    expected = tf.constant(
      [self._known_lengths.get(os.path.basename(f), tfrecord_files.UNKNOWN) for f in host_files],
      tf.int64,
    )
    if shuffle:
      # Same order on every host, so that splitting by example stays disjoint.
      order = tf.random.experimental.stateless_shuffle(
        tf.range(len(host_files), dtype=tf.int64), seed=base.stateless_seed(seed, epoch, 1)
      )
      files, expected = tf.gather(files, order), tf.gather(expected, order)
    return tf.data.Dataset.from_tensor_slices((files, expected)).interleave(
      tfrecord_files.file_dataset,
      cycle_length=min(16, len(host_files)),
      block_length=1,
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True,
    )

  def select(self, ds: tf.data.Dataset) -> tf.data.Dataset:
    """The records of the split among its files' records, before the hosts split them: all."""
    return ds

  def epoch(self, epoch, shuffle, seed):
    ds = self.select(self.records(epoch, shuffle, seed))
    if not self.by_file:
      ds = ds.shard(self.process_count, self.process_index)
    if shuffle:
      ds = ds.shuffle(
        self.config.shuffle_buffer, seed=base.shuffle_seed(seed, epoch, self.process_index)
      )
    return ds

  def lost(self, raw):
    return tf.logical_not(raw["ok"])

  def parse(self, raw):
    tf.debugging.assert_equal(raw["ok"], True, message="a record its damaged file lost")
    features = tf.io.parse_single_example(
      raw["record"],
      {
        self.image_key: tf.io.FixedLenFeature([], tf.string),
        self.label_key: tf.io.VarLenFeature(tf.int64),
      },
    )
    return features[self.image_key], features[self.label_key].values

  def where(self, raw):
    return tf.strings.join([raw["file"], " record ", tf.strings.as_string(raw["index"])])


def shards_info(data_dir: str, task: str = segmentation.TASK) -> dict:
  """dataset_info.json of segmentation (or detection) shards; one line if it is missing or of
  another task."""
  info = read_info_json(data_dir)
  if info is None:
    raise FileNotFoundError(
      f"{task} shards {data_dir}: no {INFO_FILENAME} (write the shards with "
      f"python -m vit_jax.tools.make_shards --task={task})"
    )
  if info.get("task") != task:
    raise ValueError(
      f"{os.path.join(data_dir, INFO_FILENAME)}: shards of a "
      f"{info.get('task', 'classification')} task, not {task} (source 'tfrecord' reads "
      "classification shards)"
    )
  return info


class ShardsSource(TFRecordSource):
  """`seg_shards`: TFRecord shards of (image, mask) examples, streamed record by record."""

  kind = segmentation.TASK  # the task of the shards (dataset_info.json)

  def __init__(self, config, split, process_index, process_count):
    base.Source.__init__(self, config, split, process_index, process_count)
    data_dir = base.data_dir(config)
    info = shards_info(data_dir, self.kind)
    base_split = splits.base_split(split)
    entry = info["splits"].get(base_split)
    if entry is None:
      raise FileNotFoundError(
        f"{self.kind} shards {data_dir}: no split {base_split!r}; splits: {sorted(info['splits'])}"
      )
    self.channels = int(info["image_channels"])
    num = int(entry["num_examples"])
    rows = splits.slice_rows(split, num, f"{self.kind} split {base_split!r}")
    # A slice: every host reads every file and keeps the records at the slice's positions.
    self._open(os.path.join(data_dir, entry["file_pattern"]), entry["shards"], rows is None)
    self.slice_size = None if rows is None else len(rows)
    if rows is not None:
      in_slice = np.zeros(num, bool)
      in_slice[rows] = True
      self._in_slice = tf.constant(in_slice)

  @classmethod
  def info(cls, config) -> base.DatasetInfo:
    names = shards_info(base.data_dir(config), cls.kind)["class_names"]
    return base.dataset_info(config, None, names, base.split_sizes(cls, config))

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
    placeholder = dict(record=b"", file=self.pattern, index=np.int64(-1), ok=False)
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


class DetectionShardsSource(ShardsSource):
  """`det_shards`: TFRecord shards of images with their objects (sources/detection.py),
  streamed record by record."""

  kind = detection.TASK

  def parse(self, raw):
    tf.debugging.assert_equal(raw["ok"], True, message="a record its damaged file lost")
    keys = {
      detection.IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
      detection.NAME_KEY: tf.io.FixedLenFeature([], tf.string),
      **{k: tf.io.VarLenFeature(tf.float32) for k in detection.BOX_KEYS},
      **{
        k: tf.io.VarLenFeature(tf.int64)
        for k in (
          detection.CLASS_KEY,
          detection.CROWD_KEY,
          detection.ID_KEY,
          detection.CATEGORY_KEY,
        )
      },
    }
    f = tf.io.parse_single_example(raw["record"], keys)
    columns = [*detection.BOX_KEYS, detection.CLASS_KEY, detection.CROWD_KEY]
    columns += [detection.ID_KEY, detection.CATEGORY_KEY]
    objects = tf.stack([tf.cast(f[k].values, tf.float64) for k in columns], axis=1)
    where = tf.strings.join([self.where(raw), " (", f[detection.NAME_KEY], ")"])
    return f[detection.IMAGE_KEY], objects, where
