"""Data sources: which raw records one host reads, in which order, and how a record is parsed.

Every source turns (config, split, host) into:
  * `epoch(e, shuffle, seed)`: a tf.data.Dataset of this host's raw records for epoch `e`, in an
    order that is a pure function of (seed, e) — raw means before any reading of image files or
    decoding, so that a resumed run can skip records cheaply;
  * `read(raw)`: the raw record with its file's bytes, for sources that read a file per record
    (the image folder): outside the sandbox below, as an I/O error is retried and then ends the
    run, never a skipped example (vit_jax.input_pipeline.bad_data);
  * `parse(raw)`: (image: encoded string or uint8 array, labels: int64 [n]); may fail on bad data
    (the pipeline runs it in a sandbox and turns failures into mask-0 examples);
  * `lost(raw)`: whether the record is a placeholder for one a damaged file lost;
  * `where(raw)`: a string naming the record (file and position) for error messages;
  * `host_length(h)`: the number of raw records host `h` reads per epoch.

Hosts read disjoint parts: by file when there are enough files (each host reads only its files),
otherwise by example (every host reads everything and keeps every `process_count`-th record).

Sources with `global_order` (the in-memory ones, addressed by index) also offer the training
stream of the whole run, independent of the number of hosts: `stream(start, rows, batch_size,
seed)`, from which each host reads the positions of its rows of every global batch.
"""

import concurrent.futures
import dataclasses
import functools
import json
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from vit_jax.input_pipeline import bad_data, builtin, segmentation, splits, tfrecord_files, vtab
from vit_jax.input_pipeline.bad_data import DataMismatchError

INFO_FILENAME = "dataset_info.json"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


class MissingDataError(ValueError):
  """A split is not where the dataset config points (no files, an unprepared tfds dataset)."""


@dataclasses.dataclass
class DatasetInfo:
  """What the trainer needs to know about a dataset.

  Attributes:
    num_classes: number of classes (config.num_classes when set).
    num_examples: split name → number of examples, or None where unknown without a full read.
    class_names: class names in label order, or None.
    multi_label: whether labels are multi-hot targets (sigmoid cross-entropy).
  """

  num_classes: int
  num_examples: dict[str, int | None]
  class_names: list[str] | None
  multi_label: bool


def _uses_files_by_host(num_files: int, process_count: int) -> bool:
  """Split by file when every host gets files and the imbalance is at most one file in eight."""
  if process_count == 1:
    return True
  return num_files >= process_count and (
    num_files % process_count == 0 or num_files >= 8 * process_count
  )


def _seed(seed: int, epoch: tf.Tensor, salt: int) -> tf.Tensor:
  """A stateless seed, int64 [2], for (seed, epoch, salt)."""
  return tf.stack([tf.constant(seed, tf.int64) * 1_000_003 + salt, tf.cast(epoch, tf.int64)])


def _shuffle_seed(seed: int, epoch: tf.Tensor, host: int) -> tf.Tensor:
  """An op seed, int64 scalar, for the shuffle buffer of (seed, epoch, host)."""
  return (tf.constant(seed, tf.int64) * 1_000_003 + host) * 104_729 + tf.cast(epoch, tf.int64)


class Source:
  """Base class; see the module docstring for the contract."""

  # Whether a record can fail to parse or decode (then it becomes a masked zero image, which
  # costs a nested tf.data dataset per record); False for arrays already in memory.
  may_fail = True
  # Whether the source has `stream` (one order of the whole run's records, whatever the hosts).
  global_order = False
  # Whether `read` reads a file per record.
  reads_files = False

  def __init__(self, config, split: str, process_index: int, process_count: int):
    self.config = config
    self.split = split
    self.process_index = process_index
    self.process_count = process_count

  def host_length(self, host: int) -> int:
    raise NotImplementedError

  def epoch(self, epoch: tf.Tensor, shuffle: bool, seed: int) -> tf.data.Dataset:
    raise NotImplementedError

  def read(self, raw):
    return raw

  def parse(self, raw) -> tuple[tf.Tensor, tf.Tensor]:
    raise NotImplementedError

  def lost(self, raw) -> tf.Tensor:
    del raw
    return tf.constant(False)

  def where(self, raw) -> tf.Tensor:
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------
# In-memory sources (image folder, bundled datasets): a full permutation per epoch, split by example.


class _IndexedSource(Source):
  """A source of N items addressed by index: a seeded permutation per epoch, every P-th per host."""

  num_items: int
  global_order = True

  def host_length(self, host: int) -> int:
    return len(range(host, self.num_items, self.process_count))

  def epoch(self, epoch, shuffle, seed):
    index = tf.range(self.num_items, dtype=tf.int64)
    if shuffle:
      index = tf.random.experimental.stateless_shuffle(index, seed=_seed(seed, epoch, 0))
    index = index[self.process_index :: self.process_count]
    return tf.data.Dataset.from_tensor_slices({"index": index})

  def stream(self, start: int, rows: np.ndarray, batch_size: int, seed: int) -> tf.data.Dataset:
    """(raw, position) of the run's training stream that this host reads, in order.

    Position p of the stream is item perm_e[p mod N] with e = p div N and perm_e the seeded
    permutation of epoch e (`epoch(e, True, seed)` on one host): a function of the seed alone.
    This host reads the positions p ≥ `start` whose row p mod `batch_size` is in `rows`.
    Each epoch costs one permutation of N indices, as `epoch` does.
    """
    n = self.num_items
    owned = np.zeros(batch_size, bool)
    owned[rows] = True
    owned = tf.constant(owned)

    @tf.autograph.experimental.do_not_convert
    def epoch(e):
      positions = e * n + tf.range(n, dtype=tf.int64)
      keep = tf.gather(owned, positions % batch_size) & (positions >= start)
      index = tf.random.experimental.stateless_shuffle(
        tf.range(n, dtype=tf.int64), seed=_seed(seed, e, 0)
      )
      return tf.data.Dataset.from_tensor_slices(
        ({"index": tf.boolean_mask(index, keep)}, tf.boolean_mask(positions, keep))
      )

    return tf.data.Dataset.range(start // n, 2**62).flat_map(epoch)


class FolderSource(_IndexedSource):
  """`root/<split>/<class>/*.{jpg,jpeg,png}`; classes are the sorted class folder names of all splits.

  A split may be a slice of a folder (`train[:98%]`, `train[98%:]`, `train[:800]`), taken as
  for the bundled datasets (vit_jax.input_pipeline.splits).
  """

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
      raise MissingDataError(f"No images match {split_dir}/<class>/*.{{jpg,jpeg,png}}.")
    rows = splits.slice_rows(split, len(paths), f"Image folder {split_dir!r}")
    if rows is not None:
      paths, labels = [paths[i] for i in rows], [labels[i] for i in rows]
    self.paths = tf.constant(paths)
    self.labels = tf.constant(labels, tf.int64)
    self.num_items = len(paths)

  reads_files = True

  def read(self, raw):
    """The image file's bytes (`raw['bytes']`), read in Python with retries (bad_data)."""
    data = tf.numpy_function(_read_file, [tf.gather(self.paths, raw["index"])], tf.string)
    return {**raw, "bytes": tf.ensure_shape(data, [])}

  def parse(self, raw):
    return raw["bytes"], tf.gather(self.labels, raw["index"])[None]

  def where(self, raw):
    return tf.gather(self.paths, raw["index"])


def _read_file(path: bytes) -> bytes:
  with bad_data.marked_errors():
    return bad_data.read_file(path.decode(), tf.io.gfile.GFile)


def folder_split_dir(config, split: str) -> str:
  """`data_dir/<split>` of an image folder; MissingDataError if it is not a directory."""
  split_dir = os.path.join(config.data_dir or "", splits.base_split(split))
  if not config.data_dir or not tf.io.gfile.isdir(split_dir):
    raise MissingDataError(
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


class BuiltinSource(_IndexedSource):
  """A bundled offline dataset (builtin.py), held in memory as uint8 arrays."""

  may_fail = False

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    images, labels = builtin.get_split(config.name, split)
    self.images = tf.constant(images)  # [N, H, W, 1] uint8
    self.labels = tf.constant(labels)
    self.num_items = len(labels)

  def parse(self, raw):
    return tf.gather(self.images, raw["index"]), tf.gather(self.labels, raw["index"])[None]

  def where(self, raw):
    prefix = f"builtin dataset {self.config.name!r} split {self.split!r} example "
    return tf.strings.join([prefix, tf.strings.as_string(raw["index"])])


# ---------------------------------------------------------------------------------------------------
# TFRecord shards (JFT / ImageNet-21k style).


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
  if not directory:
    return None
  path = os.path.join(directory, INFO_FILENAME)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def tfrecord_pattern(config, split: str) -> str:
  """A split name → glob via `file_pattern`; a split that is itself a path or glob is used as is."""
  if "/" in split or any(c in split for c in "*?["):
    return split
  if not config.data_dir:
    raise MissingDataError(f"dataset.data_dir must be set to find TFRecord split {split!r}.")
  return os.path.join(config.data_dir, config.file_pattern.format(name=config.name, split=split))


def check_listed(files: list[str], listed: dict[str, int], pattern: str, split: str) -> None:
  """Stops when the files a split's pattern finds are not the shards dataset_info.json lists
  (shards of an earlier make_shards run beside the new ones, a shard missing)."""
  found = {os.path.basename(f) for f in files}
  extra, missing = sorted(found - set(listed)), sorted(set(listed) - found)
  if extra or missing:
    parts = []
    if extra:
      parts.append(f"{len(extra)} not listed ({extra[0]}, ...)")
    if missing:
      parts.append(f"{len(missing)} listed but missing ({missing[0]}, ...)")
    raise DataMismatchError(
      f"split {split!r}: the files matching {pattern!r} are not the {len(listed)} shards its "
      f"{INFO_FILENAME} lists: {'; '.join(parts)}; rewrite the split (make_shards --overwrite)"
    )


class TFRecordSource(Source):
  """TFRecord shards of tf.train.Example: encoded image bytes and one or more int64 labels."""

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    self.pattern = tfrecord_pattern(config, split)
    self.files = sorted(tf.io.gfile.glob(self.pattern))
    if not self.files:
      raise MissingDataError(f"No TFRecord files match {self.pattern!r} (split {split!r}).")
    self.by_file = _uses_files_by_host(len(self.files), process_count)
    self.image_key = config.image_key or IMAGE_KEY
    self.label_key = config.label_key or LABEL_KEY
    info = read_info_json(config.data_dir) or read_info_json(os.path.dirname(self.pattern))
    self._known_lengths = (info or {}).get("splits", {}).get(split, {}).get("shards", {})
    if self._known_lengths:
      check_listed(self.files, self._known_lengths, self.pattern, split)

  @property
  def lengths_listed(self) -> bool:
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

  def epoch(self, epoch, shuffle, seed):
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
        tf.range(len(host_files), dtype=tf.int64), seed=_seed(seed, epoch, 1)
      )
      files, expected = tf.gather(files, order), tf.gather(expected, order)
    ds = tf.data.Dataset.from_tensor_slices((files, expected)).interleave(
      tfrecord_files.file_dataset,
      cycle_length=min(16, len(self._host_files(self.process_index))),
      block_length=1,
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True,
    )
    if not self.by_file:
      ds = ds.shard(self.process_count, self.process_index)
    if shuffle:
      ds = ds.shuffle(
        self.config.shuffle_buffer, seed=_shuffle_seed(seed, epoch, self.process_index)
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


# ---------------------------------------------------------------------------------------------------
# TensorFlow Datasets.


def _tfds_builder(config):
  import tensorflow_datasets as tfds  # Only the tfds source needs it (import takes seconds).

  try:
    return tfds.builder(config.name, data_dir=config.data_dir)
  except Exception as e:  # tfds raises several types for unknown names.
    raise ValueError(f"Cannot open tfds dataset {config.name!r}: {e}") from e


def _tfds_known_splits(builder) -> dict[str, int]:
  try:
    return {name: split.num_examples for name, split in builder.info.splits.items()}
  except Exception:  # Under tfds.testing.mock_data the split dict may be unavailable.
    return {}


class TfdsSource(Source):
  """A tfds dataset; hosts get `tfds.even_splits` of the split (tfds reads only the needed files).

  With `vtab_task` the task's `parse` (vtab.py) turns each record into (image, label).
  """

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    import tensorflow_datasets as tfds

    self.builder = _tfds_builder(config)
    known = _tfds_known_splits(self.builder)
    for part in (p.split("[")[0].strip() for p in split.split("+")):
      if known and part not in known:
        raise ValueError(
          f"tfds dataset {config.name!r} has no split {part!r} (of {split!r}); splits: {sorted(known)}"
        )
    self.task = vtab.get_task(config.vtab_task) if config.vtab_task else None
    if self.task:
      vtab.check_tfds_sizes(self.task, known)
    self.image_key = config.image_key or "image"
    self.label_key = config.label_key or "label"
    self.host_splits = tfds.even_splits(split, n=process_count, drop_remainder=False)
    self._tfds = tfds
    self._lengths: dict[int, int] = {}

  def _as_dataset(self, host: int) -> tf.data.Dataset:
    try:
      return self.builder.as_dataset(
        split=self.host_splits[host],
        shuffle_files=False,
        decoders={self.image_key: self._tfds.decode.SkipDecoding()},
        read_config=self._tfds.ReadConfig(add_tfds_id=True),
      )
    except Exception as e:
      raise MissingDataError(
        f"Cannot read split {self.split!r} of tfds dataset {self.config.name!r} "
        f"(data_dir={self.config.data_dir!r}): {e}"
      ) from e

  def host_length(self, host: int) -> int:
    if host not in self._lengths:
      try:
        self._lengths[host] = self.builder.info.splits[self.host_splits[host]].num_examples
      except Exception:  # Split sizes unknown (mock data): count.
        ds = self._as_dataset(host)
        n = int(ds.cardinality())
        self._lengths[host] = (
          n
          if n >= 0
          else int(ds.reduce(0, tf.autograph.experimental.do_not_convert(lambda c, _: c + 1)))
        )
    return self._lengths[host]

  @functools.cached_property
  def _host_dataset(self):
    return self._as_dataset(self.process_index)

  def epoch(self, epoch, shuffle, seed):
    ds = self._host_dataset
    if shuffle:
      ds = ds.shuffle(
        self.config.shuffle_buffer, seed=_shuffle_seed(seed, epoch, self.process_index)
      )
    return ds

  def parse(self, raw):
    if self.task:
      return self.task.parse(raw)
    return raw[self.image_key], tf.reshape(tf.cast(raw[self.label_key], tf.int64), [-1])

  def where(self, raw):
    if "tfds_id" in raw:
      return raw["tfds_id"]
    return tf.constant(f"tfds {self.config.name} split {self.split}")


SOURCES = {
  "tfrecord": TFRecordSource,
  "tfds": TfdsSource,
  "folder": FolderSource,
  "builtin": BuiltinSource,
}


def get_source(config, split: str, process_index: int, process_count: int) -> Source:
  if config.source not in SOURCES:
    raise ValueError(f"dataset.source={config.source!r}; expected one of {sorted(SOURCES)}")
  return SOURCES[config.source](config, split, process_index, process_count)


def check_readable(config, split: str) -> None:
  """Raises MissingDataError unless `split` of the dataset is where the config says: its files
  found (a tfds dataset opened), no example read, an image folder not listed."""
  if config.source in segmentation.SOURCES:
    return segmentation.check_readable(config, split)
  if config.source == "tfds":
    TfdsSource(config, split, 0, 1)._as_dataset(0)
  elif config.source == "tfrecord":
    TFRecordSource(config, split, 0, 1)
  elif config.source == "folder":
    folder_split_dir(config, split)


def get_dataset_info(config) -> DatasetInfo:
  """Number of classes, examples per split, class names; see DatasetInfo."""
  if config.source in segmentation.SOURCES:
    return segmentation.get_dataset_info(config)
  splits = list(dict.fromkeys([config.train_split, config.eval_split]))
  num_classes, class_names, num_examples = None, None, {}
  if config.source == "builtin":
    data = builtin.load(config.name)
    class_names = list(data.class_names)
    for s in splits:  # None for a split the dataset does not have
      try:
        num_examples[s] = len(builtin.get_split(config.name, s)[1])
      except ValueError:
        num_examples[s] = None
  elif config.source == "folder":
    class_names = folder_class_names(config.data_dir) if config.data_dir else None
    num_examples = {s: FolderSource(config, s, 0, 1).num_items for s in splits}
  elif config.source == "tfds":
    builder = _tfds_builder(config)
    if config.vtab_task:
      num_classes = vtab.get_task(config.vtab_task).num_classes
    else:
      label = builder.info.features[config.label_key or "label"]
      num_classes = getattr(label, "num_classes", None)
      class_names = getattr(label, "names", None)
    known = _tfds_known_splits(builder)
    for s in splits:
      try:
        num_examples[s] = builder.info.splits[s].num_examples if known else None
      except Exception:
        num_examples[s] = None
      if num_examples[s] is None:
        num_examples[s] = TfdsSource(config, s, 0, 1).host_length(0)
  elif config.source == "tfrecord":
    info = read_info_json(config.data_dir) or {}
    if info.get("task") == segmentation.TASK:
      raise ValueError(
        f"{config.data_dir}/{INFO_FILENAME}: segmentation shards; dataset.source='seg_shards' "
        "reads them"
      )
    num_classes = info.get("num_classes")
    class_names = info.get("class_names")
    for s in splits:
      num_examples[s] = info.get("splits", {}).get(s, {}).get("num_examples")
  else:
    raise ValueError(f"dataset.source={config.source!r}; expected one of {sorted(SOURCES)}")
  if class_names is not None and num_classes is None:
    num_classes = len(class_names)
  if config.num_classes is not None:
    num_classes = config.num_classes
  if num_classes is None:
    raise ValueError(
      f"Cannot tell the number of classes of {config.source} dataset {config.name!r}: "
      "set dataset.num_classes (or write shards with vit_jax.tools.make_shards)."
    )
  return DatasetInfo(
    num_classes=int(num_classes),
    num_examples=num_examples,
    class_names=list(class_names) if class_names is not None else None,
    multi_label=bool(config.multi_label),
  )


def host_lengths(source: Source) -> np.ndarray:
  """Records per epoch of every host, int64 [process_count]."""
  return np.array([source.host_length(h) for h in range(source.process_count)], np.int64)
