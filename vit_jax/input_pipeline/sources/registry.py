"""The one table of data sources, by the name `dataset.source` gives, whatever their task.

Every source implements base.Source and says its task (`task`: classification, segmentation or
detection); the pipeline (vit_jax.input_pipeline.pipeline) reads every one through the same
iterators, and the task decides what a record becomes (vit_jax.input_pipeline.examples). A new
source is a Source subclass and one line here.
"""

from vit_jax.input_pipeline.sources import base, indexed, shards, tfds_source

SOURCES: dict[str, type[base.Source]] = {
  # Classification: an int64 label (or several, multi_label) per image.
  "tfrecord": shards.TFRecordSource,
  "tfds": tfds_source.TfdsSource,
  "folder": indexed.FolderSource,
  "builtin": indexed.BuiltinSource,
  # Segmentation: a label per pixel.
  "seg_builtin": indexed.BuiltinSource,
  "seg_folder": indexed.FolderSource,
  "seg_shards": shards.ShardsSource,
  # Detection: boxes of classes (sources/detection.py).
  "det_builtin": indexed.BuiltinSource,
  "det_folder": indexed.FolderSource,
  "det_shards": shards.DetectionShardsSource,
}


def source_class(config) -> type[base.Source]:
  """The class of `config.source`; one line for an unknown name."""
  if config.source not in SOURCES:
    raise ValueError(f"dataset.source={config.source!r}; expected one of {sorted(SOURCES)}")
  return SOURCES[config.source]


def get_source(config, split: str, process_index: int, process_count: int) -> base.Source:
  return source_class(config)(config, split, process_index, process_count)


def check_readable(config, split: str) -> None:
  """Raises (one line; MissingDataError where the data is not there) unless `split` of the
  dataset is where the config says: its files found (a tfds dataset opened), no example read,
  an image folder not listed."""
  source_class(config).check_readable(config, split)


def get_dataset_info(config) -> base.DatasetInfo:
  """Number of classes, examples per split, class names; see DatasetInfo."""
  return source_class(config).info(config)
