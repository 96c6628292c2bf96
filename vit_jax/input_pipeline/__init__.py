"""Input pipeline: sources → per-host split → preprocessing → global batches on the mesh.

The package of vit_jax that reads data with TensorFlow (tf.data), imported when its readers are
first used (`dataset_config` alone does not import it); model and checkpoint code must not
import TensorFlow. The layout and the preprocessing strings: docs/data.md.

  sources      where examples come from, whatever their task: one contract, one table by name
  ops          preprocessing: the one registry and parser of op strings, and the ops of each kind
  config       `dataset_config(**overrides)`: every field of a config's dataset section
  splits       slices of a split in tfds's syntax for sources that hold a list of examples
  examples     from a source's raw record to the example a batch holds, per task
  bad_data     data the pipeline cannot use: reading a file is not decoding a record
  layout       which rows of a global batch each host supplies, made into jax.Arrays
  pipeline     the train and eval iterators of every source: global batches
  host_states  the iterators' states of all processes, as a checkpoint keeps them
  testing      writers of small synthetic TFRecord shards for tests and benchmarks

Usage (what the trainer calls):

  from vit_jax import input_pipeline

  config.dataset = input_pipeline.dataset_config(source='tfrecord', data_dir='gs://b/jft',
                                                 multi_label=True)
  info = input_pipeline.get_dataset_info(config.dataset)  # a DatasetInfo

  train_iter = input_pipeline.make_train_iterator(
      config.dataset, global_batch_size=4096, mesh=mesh, data_axes=('data', 'fsdp'), seed=0,
      state=restored_state_or_None)
  batch = next(train_iter)
  # 'image': float32 [B, H, W, 3] in [-1, 1] (pp_train decides the range)
  # 'label': int32 [B]; float32 multi-hot [B, K] if multi_label (mixup is the trainer's);
  #          int32 [B, H, W] per pixel for the segmentation sources (255: does not count)
  # 'mask':  float32 [B], 0 for a skipped example (undecodable, too large, lost): never count it
  # With a mesh: global jax.Arrays sharded over the batch on data_axes; mesh=None: numpy arrays
  # of this host's rows. Row r of global batch b is position b·B + r of the run's stream.
  state = train_iter.get_state()   # save it with the checkpoint; state=... continues the order
  train_iter.num_skipped           # bad examples skipped by this host so far (also in the state)

  for batch in input_pipeline.make_eval_iterator(config.dataset, split='test',
                                                 global_batch_size=1024, mesh=mesh,
                                                 data_axes=('data', 'fsdp')):
    ...  # every example exactly once over all hosts; the last batches are padded with mask 0

Bad data (a mask-0 example, counted) and the one-line errors of data that cannot be used
(TooManySkippedError, IncompleteEvaluationError, DataReadError, DataMismatchError,
MissingDataError; `check_readable` asks for a split without reading it): bad_data.py.
"""

import importlib
import math
from typing import TYPE_CHECKING

from vit_jax.input_pipeline.config import dataset_config

if TYPE_CHECKING:
  from vit_jax.input_pipeline.pipeline import EvalIterable, TrainIterator

# Imported on first use: they import TensorFlow (seconds), which building a config does not need
# (a command that stops at a config mistake ends before it).
_LAZY = {
  "EvalIterable": "pipeline",
  "TrainIterator": "pipeline",
  "DataMismatchError": "bad_data",
  "DataReadError": "bad_data",
  "DatasetInfo": "sources.base",
  "IncompleteEvaluationError": "bad_data",
  "MissingDataError": "sources.base",
  "TooManySkippedError": "bad_data",
  "check_readable": "sources.registry",
  "get_dataset_info": "sources.registry",
}


def __getattr__(name: str):
  if name in _LAZY:
    module = importlib.import_module(f"vit_jax.input_pipeline.{_LAZY[name]}")
    return getattr(module, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
  "DataMismatchError",
  "DataReadError",
  "DatasetInfo",
  "EvalIterable",
  "IncompleteEvaluationError",
  "MissingDataError",
  "TooManySkippedError",
  "TrainIterator",
  "check_readable",
  "dataset_config",
  "get_dataset_info",
  "make_eval_iterator",
  "make_train_iterator",
]


def make_train_iterator(dataset_config, **kwargs) -> "TrainIterator":
  """Endless, resumable iterator of global training batches.

  Args:
    dataset_config: from `dataset_config()`.
    **kwargs: TrainIterator's keyword arguments:
      global_batch_size: examples per step over all hosts (a multiple of the number of hosts).
      mesh: jax.sharding.Mesh, or None (the default) for numpy batches.
      data_axes: mesh axis name(s) the batch dimension is sharded over (default ('data',)).
      seed: seed of the example order and of the augmentations (default 0).
      state: a previous `get_state()`, to continue where it stopped.
      process_index, process_count: default jax.process_index() and jax.process_count().

  Returns:
    A TrainIterator (iterator of dicts, plus get_state(), num_skipped, close()).
  """
  from vit_jax.input_pipeline.pipeline import TrainIterator

  return TrainIterator(dataset_config, **kwargs)


def make_eval_iterator(dataset_config, split: str | None = None, **kwargs) -> "EvalIterable":
  """Re-iterable eval batches covering `split` (default eval_split) exactly once.

  Args:
    dataset_config: from `dataset_config()`.
    split: split to evaluate; None = dataset_config.eval_split.
    **kwargs: EvalIterable's keyword arguments: global_batch_size (required), mesh, data_axes,
      process_index and process_count, as `make_train_iterator` takes them.

  Returns:
    An EvalIterable (len() = batches per pass; .num_examples).
  """
  from vit_jax.input_pipeline.pipeline import EvalIterable

  mesh = kwargs.get("mesh")
  if mesh is not None:
    # An evaluation batch is padded (mask 0) anyway: rounded up to a multiple of the devices it
    # is split over, any eval_batch_size runs on any mesh (100 on 8 devices: 104).
    axes = kwargs.get("data_axes", ("data",))
    shards = math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
    kwargs["global_batch_size"] = -(-int(kwargs["global_batch_size"]) // shards) * shards
  return EvalIterable(dataset_config, split, **kwargs)
