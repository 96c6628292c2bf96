"""What a data source is: the contract every source implements, whatever its task.

A source turns (config, split, host) into raw records and tells the pipeline how to read them:
  * `epoch(e, shuffle, seed)`: a tf.data.Dataset of this host's raw records for epoch `e`, in an
    order that is a pure function of (seed, e) — raw means before any reading of image files or
    decoding, so that a resumed run can skip records cheaply;
  * `read(raw)`: the raw record with its files' bytes, for sources that read files per record
    (the image folders): outside the per-record sandbox, as an I/O error is no skipped example;
  * `parse(raw)`: (image, labels int64 [n]) for classification, (image, mask, where the mask is)
    for segmentation, (image, objects float64 [n, 8] (sources/detection.py), where the record
    is) for detection, the image and mask encoded strings or uint8 arrays; may fail on bad data
    (the pipeline runs it in a sandbox and turns failures into mask-0 examples);
  * `lost(raw)`: whether the record is a placeholder for one a damaged file lost;
  * `where(raw)`: a string naming the record (file and position) for error messages;
  * `host_length(h)`: the number of raw records host `h` reads per epoch.
The config's source says which task its records are for (`task`: `task_of`); the class gives a
dataset's classes and split sizes without reading examples (`info`) and checks that a split is
there (`check_readable`).

Hosts read disjoint parts: by file when there are enough files (`uses_files_by_host`), else by
example (every host reads everything and keeps every `process_count`-th record).

Sources with `global_order` (`IndexedSource`: listing or arrays in memory) also offer the
training stream of the whole run, whatever the hosts (`stream`). The table of sources by name:
registry.py.
"""

import dataclasses

import numpy as np
import tensorflow as tf

CLASSIFICATION, SEGMENTATION, DETECTION = "classification", "segmentation", "detection"


class MissingDataError(ValueError):
  """A split is not where the dataset config points (no files, an unprepared tfds dataset)."""


@dataclasses.dataclass
class DatasetInfo:
  """What the trainer needs to know about a dataset.

  Attributes:
    num_classes: number of classes (config.num_classes when set); for segmentation, the classes
      of the pixels, background included; for detection, the classes of the objects (no
      background class).
    num_examples: split name → number of examples, or None where unknown without a full read.
    class_names: class names in label order, or None.
    multi_label: whether labels are multi-hot targets (sigmoid cross-entropy).
  """

  num_classes: int
  num_examples: dict[str, int | None]
  class_names: list[str] | None
  multi_label: bool


def dataset_info(config, num_classes, class_names, num_examples) -> DatasetInfo:
  """A DatasetInfo, `config.num_classes` taking precedence; one line if the classes are unknown."""
  if class_names is not None and num_classes is None:
    num_classes = len(class_names)
  if config.num_classes is not None:
    num_classes = config.num_classes
  if num_classes is None:
    raise ValueError(
      f"Cannot tell the number of classes of {config.source} dataset {config.name!r}: "
      "set dataset.num_classes (or write shards with vit_jax.tools.make_shards)."
    )
  names = list(class_names) if class_names is not None else None
  return DatasetInfo(int(num_classes), num_examples, names, bool(config.multi_label))


def task_of(config) -> str:
  """The task of the config's source: segmentation for the `seg_` sources, detection for the
  `det_` ones (a config without a source, as tools/make_shards builds for a folder, is of
  classification)."""
  source = str(getattr(config, "source", ""))
  if source.startswith("seg_"):
    return SEGMENTATION
  return DETECTION if source.startswith("det_") else CLASSIFICATION


def data_dir(config) -> str:
  if not config.data_dir:
    raise ValueError(f"dataset.source={config.source!r} needs dataset.data_dir")
  return config.data_dir


def split_sizes(cls, config) -> dict[str, int | None]:
  """Examples of the config's train and eval splits; None for a split that is not there."""
  sizes = {}
  for split in dict.fromkeys([config.train_split, config.eval_split]):
    try:
      sizes[split] = cls(config, split, 0, 1).host_length(0)
    except (ValueError, FileNotFoundError):
      sizes[split] = None
  return sizes


def uses_files_by_host(num_files: int, process_count: int) -> bool:
  """Split by file when every host gets files and the imbalance is at most one file in eight."""
  if process_count == 1:
    return True
  return num_files >= process_count and (
    num_files % process_count == 0 or num_files >= 8 * process_count
  )


def stateless_seed(seed: int, epoch: tf.Tensor, salt: int) -> tf.Tensor:
  """A stateless seed, int64 [2], for (seed, epoch, salt)."""
  return tf.stack([tf.constant(seed, tf.int64) * 1_000_003 + salt, tf.cast(epoch, tf.int64)])


def shuffle_seed(seed: int, epoch: tf.Tensor, host: int) -> tf.Tensor:
  """An op seed, int64 scalar, for the shuffle buffer of (seed, epoch, host)."""
  return (tf.constant(seed, tf.int64) * 1_000_003 + host) * 104_729 + tf.cast(epoch, tf.int64)


class Source:
  """Base class; see the module docstring for the contract."""

  # Whether a record can fail to parse or decode (then it becomes a masked zero image, which
  # costs a nested tf.data dataset per record); False for arrays already in memory.
  may_fail = True
  # Whether the source has `stream` (one order of the whole run's records, whatever the hosts).
  global_order = False
  # Whether `read` reads files per record.
  reads_files = False
  # Whether `host_length` is known without reading the data.
  lengths_known = True

  def __init__(self, config, split: str, process_index: int, process_count: int):
    self.config, self.task, self.split = config, task_of(config), split
    self.process_index, self.process_count = process_index, process_count

  @classmethod
  def info(cls, config) -> DatasetInfo:
    """Classes and examples per split (train_split, eval_split) of the config's dataset."""
    raise NotImplementedError

  @classmethod
  def check_readable(cls, config, split: str) -> None:
    """Raises (one line) unless `split` is where the config says; reads no example."""
    cls(config, split, 0, 1)

  def host_length(self, host: int) -> int:
    raise NotImplementedError

  def epoch(self, epoch: tf.Tensor, shuffle: bool, seed: int) -> tf.data.Dataset:
    raise NotImplementedError

  def read(self, raw):
    return raw

  def parse(self, raw) -> tuple[tf.Tensor, ...]:
    raise NotImplementedError

  def lost(self, raw) -> tf.Tensor:
    del raw
    return tf.constant(False)

  def where(self, raw) -> tf.Tensor:
    raise NotImplementedError


class IndexedSource(Source):
  """A source of N items addressed by index: a seeded permutation per epoch, every P-th per host.

  Subclasses set `num_items` and may define the permutation (`permutation`).
  """

  num_items: int
  global_order = True

  def host_length(self, host: int) -> int:
    return len(range(host, self.num_items, self.process_count))

  def permutation(self, epoch: tf.Tensor, seed: int) -> tf.Tensor:
    """The order of the items in epoch `epoch`, int64 [N]: a function of (seed, epoch); for
    segmentation and detection numpy's `default_rng([seed, epoch]).permutation(N)` (their runs'
    order)."""
    if self.task != CLASSIFICATION:
      n = self.num_items

      def order(e):
        return np.random.default_rng([seed, int(e)]).permutation(n).astype(np.int64)

      index = tf.numpy_function(order, [tf.cast(epoch, tf.int64)], tf.int64, stateful=False)
      return tf.ensure_shape(index, [n])
    return tf.random.experimental.stateless_shuffle(
      tf.range(self.num_items, dtype=tf.int64), seed=stateless_seed(seed, epoch, 0)
    )

  def epoch(self, epoch, shuffle, seed):
    index = self.permutation(epoch, seed) if shuffle else tf.range(self.num_items, dtype=tf.int64)
    index = index[self.process_index :: self.process_count]
    return tf.data.Dataset.from_tensor_slices({"index": index})

  def stream(self, start: int, rows: np.ndarray, batch_size: int, seed: int) -> tf.data.Dataset:
    """(raw, position) of the run's training stream that this host reads, in order.

    Position p of the stream is item perm_e[p mod N] with e = p div N and perm_e the seeded
    permutation of epoch e (`permutation(e, seed)`): a function of the seed alone. This host
    reads the positions p ≥ `start` whose row p mod `batch_size` is in `rows`. Each epoch costs
    one permutation of N indices, as `epoch` does.
    """
    n = self.num_items
    owned = np.zeros(batch_size, bool)
    owned[rows] = True
    owned = tf.constant(owned)

    @tf.autograph.experimental.do_not_convert
    def epoch(e):
      positions = e * n + tf.range(n, dtype=tf.int64)
      keep = tf.gather(owned, positions % batch_size) & (positions >= start)
      index = self.permutation(e, seed)
      return tf.data.Dataset.from_tensor_slices(
        ({"index": tf.boolean_mask(index, keep)}, tf.boolean_mask(positions, keep))
      )

    return tf.data.Dataset.range(start // n, 2**62).flat_map(epoch)
