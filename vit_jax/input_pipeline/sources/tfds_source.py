"""A prepared TensorFlow Datasets dataset in `data_dir` (the `tfds` source); nothing is downloaded.

Hosts get `tfds.even_splits` of the split (tfds reads only the files it needs); with
`dataset.vtab_task` a VTAB-1k task's label transform and class count apply (vtab.py).
"""

import functools

import tensorflow as tf

from vit_jax.input_pipeline.sources import base, vtab


def tfds_builder(config):
  import tensorflow_datasets as tfds  # Only the tfds source needs it (import takes seconds).

  try:
    return tfds.builder(config.name, data_dir=config.data_dir)
  except Exception as e:  # tfds raises several types for unknown names.
    raise ValueError(f"Cannot open tfds dataset {config.name!r}: {e}") from e


def _known_splits(builder) -> dict[str, int]:
  try:
    return {name: split.num_examples for name, split in builder.info.splits.items()}
  except Exception:  # Under tfds.testing.mock_data the split dict may be unavailable.
    return {}


class TfdsSource(base.Source):
  """A tfds dataset (see the module docstring)."""

  def __init__(self, config, split, process_index, process_count):
    super().__init__(config, split, process_index, process_count)
    import tensorflow_datasets as tfds

    self.builder = tfds_builder(config)
    known = _known_splits(self.builder)
    for part in (p.split("[")[0].strip() for p in split.split("+")):
      if known and part not in known:
        raise ValueError(
          f"tfds dataset {config.name!r} has no split {part!r} (of {split!r}); splits: {sorted(known)}"
        )
    self.vtab_task = vtab.get_task(config.vtab_task) if config.vtab_task else None
    if self.vtab_task:
      vtab.check_tfds_sizes(self.vtab_task, known)
    self.image_key = config.image_key or "image"
    self.label_key = config.label_key or "label"
    self.host_splits = tfds.even_splits(split, n=process_count, drop_remainder=False)
    self._tfds = tfds
    self._lengths: dict[int, int] = {}

  @classmethod
  def info(cls, config) -> base.DatasetInfo:
    builder = tfds_builder(config)
    class_names = None
    if config.vtab_task:
      num_classes = vtab.get_task(config.vtab_task).num_classes
    else:
      label = builder.info.features[config.label_key or "label"]
      num_classes = getattr(label, "num_classes", None)
      class_names = getattr(label, "names", None)
    known = _known_splits(builder)
    num_examples = {}
    for s in dict.fromkeys([config.train_split, config.eval_split]):
      try:
        num_examples[s] = builder.info.splits[s].num_examples if known else None
      except Exception:
        num_examples[s] = None
      if num_examples[s] is None:
        num_examples[s] = cls(config, s, 0, 1).host_length(0)
    return base.dataset_info(config, num_classes, class_names, num_examples)

  @classmethod
  def check_readable(cls, config, split):
    cls(config, split, 0, 1)._as_dataset(0)

  def _as_dataset(self, host: int) -> tf.data.Dataset:
    try:
      return self.builder.as_dataset(
        split=self.host_splits[host],
        shuffle_files=False,
        decoders={self.image_key: self._tfds.decode.SkipDecoding()},
        read_config=self._tfds.ReadConfig(add_tfds_id=True),
      )
    except Exception as e:
      raise base.MissingDataError(
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
        if n < 0:
          n = int(ds.reduce(0, tf.autograph.experimental.do_not_convert(lambda c, _: c + 1)))
        self._lengths[host] = n
    return self._lengths[host]

  @functools.cached_property
  def _host_dataset(self):
    return self._as_dataset(self.process_index)

  def epoch(self, epoch, shuffle, seed):
    ds = self._host_dataset
    if shuffle:
      ds = ds.shuffle(
        self.config.shuffle_buffer, seed=base.shuffle_seed(seed, epoch, self.process_index)
      )
    return ds

  def parse(self, raw):
    if self.vtab_task:
      return self.vtab_task.parse(raw)
    return raw[self.image_key], tf.reshape(tf.cast(raw[self.label_key], tf.int64), [-1])

  def where(self, raw):
    if "tfds_id" in raw:
      return raw["tfds_id"]
    return tf.constant(f"tfds {self.config.name} split {self.split}")
