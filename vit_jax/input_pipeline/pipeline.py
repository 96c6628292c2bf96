"""Per-host batches → global jax.Arrays: the train and eval iterators of every source.

Every source (sources/registry.py), of any task, gives raw records (sources/base.py) that its
task turns into examples (examples.py); the rest is the same code for all.

Every record becomes exactly one example (a record that fails becomes a zero image with mask 0,
bad_data.py), so batch boundaries are fixed in the raw-record stream. Position b·B + r is row r
of global batch b: each host reads the positions of the rows its devices hold
(`layout.host_rows`). For sources with `global_order` the record at a position is a function of
the seed alone (the same trajectory on any topology); sources read per host (shards, tfds) give
host h its own records (`source.epoch(e)` chained without end) in its rows' positions.

The pipeline's whole position is the number of records each host has consumed (the same on every
host; times the number of hosts, the stream position). Resuming skips raw records, before any
decoding: to the stream position for a global order (exact on any number of hosts), else to the
same number of examples per host inside the right epoch (exact on the same number of hosts).

Nothing here knows about models or checkpoints; TensorFlow stays inside the data layer.
"""

import atexit
import math
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from absl import logging

from vit_jax.input_pipeline import bad_data, examples, layout
from vit_jax.input_pipeline.sources import base as source_lib
from vit_jax.input_pipeline.sources import registry as sources

graph_fn = examples.graph_fn


def _process(
  ds: tf.data.Dataset, source: source_lib.Source, task_examples, position_of: Callable
) -> tf.data.Dataset:
  """(raw, index) → unchecked examples (`task_examples`: examples.for_source), each record at
  position `position_of(index)` (int64 scalar), computed in the per-record function (no tf.data
  stage of its own). Files read per record are read first, outside the sandbox."""
  per_record = examples.record_fn(task_examples, source)
  fn = graph_fn(lambda raw, index: per_record(raw, position_of(index)))
  parallel = dict(num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if source.reads_files:
    ds = ds.map(graph_fn(lambda raw, index: (source.read(raw), index)), **parallel)
  if not source.may_fail:
    return ds.map(fn, **parallel)
  cycle = max(16, 2 * (os.cpu_count() or 1))
  return ds.interleave(fn, cycle_length=cycle, block_length=1, **parallel)


def _checked(ds: tf.data.Dataset, task_examples, batch_size: int, config) -> tf.data.Dataset:
  """Batches of `batch_size` examples, each batch checked (examples.check), prefetched."""
  ds = ds.batch(batch_size, drop_remainder=True)
  ds = ds.map(graph_fn(task_examples.check), num_parallel_calls=tf.data.AUTOTUNE)
  options = tf.data.Options()
  options.deterministic = True
  if config.num_threads > 0:
    options.threading.private_threadpool_size = config.num_threads
  return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


class _Prefetcher:
  """Pulls `items` on a thread, `size` ahead of the consumer; errors are re-raised by `get`."""

  def __init__(self, items: Iterator[Any], size: int):
    self._items = items
    self._queue = queue.Queue(maxsize=max(1, size))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _put(self, entry) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(entry, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _run(self):
    try:
      for item in self._items:
        if not self._put((item, None)):
          return
      self._put((None, StopIteration()))
    except Exception as e:  # Handed to the consumer, who raises it.
      self._put((None, e))

  def get(self):
    item, error = self._queue.get()
    if error is not None:
      self._queue.put((None, error))  # Every later call raises the same.
      raise error
    return item

  def close(self):
    """Stops the thread and drops the queued batches; the tf.data iterator is released on a
    thread of its own (`_release`)."""
    self._stop.set()
    self._thread.join()
    _release(self._items)
    while not self._queue.empty():
      self._queue.get_nowait()


# Releasing a tf.data iterator joins its autotuning thread, which does not always wake when it is
# cancelled: it can sleep out its optimisation period first, a period that doubles as the
# iterator lives (measured at the end of short training runs, tensorflow-cpu 2.21: 2 s in a
# quarter of the closes, 10 s after a 20-step run). The run need not wait for that: the
# generator that owns the iterator is closed on a thread of its own. A program's process waits
# for those threads as it exits (before C++ static destructors run under them); a command's does
# not: it ends with os._exit, running no destructor (vit_jax.runtime.cli.end_process).
_releases: list[threading.Thread] = []
_releases_lock = threading.Lock()


def _release(items: Iterator[Any]) -> None:
  """Closes the generator `items` (freeing its tf.data iterator) on a thread of its own."""
  thread = threading.Thread(target=items.close, name="tf.data iterator release", daemon=True)
  with _releases_lock:  # started under the lock: the pruning never drops an unstarted thread
    _releases[:] = [t for t in _releases if t.is_alive()]
    thread.start()
    _releases.append(thread)


@atexit.register
def wait_for_releases() -> None:
  """Returns once every iterator handed to `_release` is freed (at a program's exit; a
  command's exit leaves it out: vit_jax.runtime.cli.end_process)."""
  with _releases_lock:
    pending = list(_releases)
  for thread in pending:
    thread.join()


def _batches(ds: tf.data.Dataset, mesh, data_axes) -> Iterator[tuple[dict[str, Any], dict]]:
  """(global batch, its host fields) of each batch of `ds`; our data errors become our
  exceptions (bad_data.translate)."""
  it = ds.as_numpy_iterator()
  try:
    while True:
      try:
        batch = next(it)
      except StopIteration:
        return
      except tf.errors.OpError as e:
        raise bad_data.translate(e) from e
      host = {k: batch.pop(k) for k in examples.HOST_FIELDS if k in batch}
      yield layout.to_global(batch, mesh, data_axes), host
  finally:
    del it


class TrainIterator:
  """Endless iterator of global training batches with a resumable position (see get_state); it
  holds this host's share of skipped examples, over the run's resumes, to
  `config.max_skipped_fraction` (bad_data.SkipCounter, TooManySkippedError)."""

  def __init__(
    self,
    config,
    *,
    global_batch_size: int,
    mesh=None,
    data_axes=("data",),
    seed: int = 0,
    state: dict[str, Any] | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
  ):
    host, count = layout.hosts(process_index, process_count)
    self.process_index, self.process_count = host, count
    self.global_batch_size = global_batch_size
    self.local_batch_size = layout.local_batch_size(global_batch_size, count)
    self.seed = int(seed)
    self._rows = layout.host_rows(mesh, data_axes, global_batch_size, host, count)
    self._source = sources.get_source(config, config.train_split, host, count)
    start, self._num_skipped = self._restore(state)
    self._num_records = start
    self._skips = bad_data.SkipCounter(
      float(config.max_skipped_fraction),
      int(config.max_image_pixels or 0),
      self._min_records(),
      skipped=self._num_skipped,
      read=self._records_counted(state, start),
    )
    self.num_classes = sources.get_dataset_info(config).num_classes
    ds = self._dataset(config, start)
    self._prefetcher = _Prefetcher(_batches(ds, mesh, data_axes), config.prefetch)
    self._first = True

  def _min_records(self) -> int:
    """Records read before the limit on skipped examples applies: bad_data.MIN_RECORDS, or one
    epoch of this host's data where that is fewer and known without reading the files."""
    if not self._source.lengths_known:
      return bad_data.MIN_RECORDS
    return min(bad_data.MIN_RECORDS, self._source.host_length(self.process_index))

  def _records_counted(self, state, start: int) -> int:
    """The records that the restored `num_skipped` was counted over: this host's own on as many
    hosts as before; on another number, process 0 carries all old hosts' skipped examples
    (vit_jax.train) and so counts the whole stream position, the others start at 0."""
    if not state or int(state["process_count"]) == self.process_count:
      return start
    return start * self.process_count if self.process_index == 0 else 0

  def _restore(self, state) -> tuple[int, int]:
    if not state:
      return 0, 0
    if int(state["seed"]) != self.seed:
      raise ValueError(
        f"Resuming a data stream of seed {int(state['seed'])} with seed {self.seed}."
      )
    position = int(state["num_records"]) * int(state["process_count"])
    if position % self.global_batch_size:
      raise ValueError(
        f"Resuming a data stream at example {position}, which is not a whole number of global "
        f"batches of {self.global_batch_size}: a different global_batch_size is a different run."
      )
    if int(state["process_count"]) != self.process_count and not self._source.global_order:
      logging.warning(
        "Resuming data written by %d hosts on %d hosts: %s sources read records per host, so "
        "the example order is not exactly continued.",
        int(state["process_count"]),
        self.process_count,
        type(self._source).__name__,
      )
    return position // self.process_count, int(state["num_skipped"])

  def _dataset(self, config, start: int) -> tf.data.Dataset:
    source, seed, host = self._source, self.seed, self.process_index
    batch, local = self.global_batch_size, self.local_batch_size
    if source.global_order:
      ds = source.stream(start // local * batch, self._rows, batch, seed)
      return self._examples(config, ds, lambda position: position)
    if source.lengths_known and source.host_length(host) == 0:
      raise ValueError(f"Host {host} has no training data in split {config.train_split!r}.")
    epoch0, offset = divmod(start, source.host_length(host)) if start else (0, 0)

    @graph_fn
    def epoch(e):
      return source.epoch(tf.cast(e, tf.int64), True, seed)

    ds = epoch(epoch0).skip(offset)
    ds = ds.concatenate(tf.data.Dataset.range(epoch0 + 1, 2**62).flat_map(epoch))
    rows = tf.constant(self._rows)

    def position_of(k):  # This host's k-th record fills row k mod L of global batch k div L.
      return k // local * batch + tf.gather(rows, k % local)

    ds = tf.data.Dataset.zip(ds, tf.data.Dataset.counter(start))
    return self._examples(config, ds, position_of)

  def _examples(self, config, ds: tf.data.Dataset, position_of: Callable) -> tf.data.Dataset:
    """(raw, index) → local batches, each record at stream position `position_of(index)`."""
    task_examples = examples.for_source(
      config, self._source, self.num_classes, config.pp_train, self.seed
    )
    ds = _process(ds, self._source, task_examples, position_of)
    return _checked(ds, task_examples, self.local_batch_size, config)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, Any]:
    """{'image': f32 [B, H, W, 3], 'label': i32 [B] | f32 [B, K], 'mask': f32 [B]}."""
    batch, host = self._prefetcher.get()
    self._num_records += self.local_batch_size
    skipped = self._skips.add(host)
    self._num_skipped += skipped
    if self._first:
      self._first = False
      if skipped == self.local_batch_size:
        raise ValueError(
          "Every example of the first training batch failed to decode or preprocess: check "
          f"dataset.pp_train and the data ({self._skips.culprit()})."
        )
    self._skips.check()
    return batch

  @property
  def num_skipped(self) -> int:
    """Bad examples this host has skipped (mask 0) since the stream began, resumes included."""
    return self._num_skipped

  def get_state(self) -> dict[str, int]:
    """Position after the last batch returned, in plain ints (`num_records`: this host's, the
    same on every host; × `process_count` the stream position)."""
    return {
      "num_records": self._num_records,
      "num_skipped": self._num_skipped,
      "seed": self.seed,
      "process_count": self.process_count,
    }

  def close(self):
    self._prefetcher.close()


class EvalIterable:
  """Re-iterable eval batches: every example of the split exactly once over all hosts. A pass
  that skipped an example raises bad_data.IncompleteEvaluationError at its end.

  Attributes:
    num_examples: examples in the split (all hosts).
    num_batches: batches per pass, the same on every host; the tail is padded with mask 0.
  """

  def __init__(
    self,
    config,
    split: str | None = None,
    *,
    global_batch_size: int,
    mesh=None,
    data_axes=("data",),
    process_index: int | None = None,
    process_count: int | None = None,
  ):
    self.process_index, self.process_count = layout.hosts(process_index, process_count)
    self.local_batch_size = layout.local_batch_size(global_batch_size, self.process_count)
    self.split = split or config.eval_split
    self._config, self._mesh, self._data_axes = config, mesh, data_axes
    self._source = sources.get_source(config, self.split, self.process_index, self.process_count)
    lengths = [int(self._source.host_length(h)) for h in range(self.process_count)]
    self.num_examples = sum(lengths)
    self.num_batches = max(1, math.ceil(max(lengths) / self.local_batch_size))
    self._host_length = lengths[self.process_index]
    self.num_classes = sources.get_dataset_info(config).num_classes

  def _dataset(self) -> tf.data.Dataset:
    config = self._config
    ds = self._source.epoch(tf.constant(0, tf.int64), False, 0).take(self._host_length)
    ds = tf.data.Dataset.zip(ds, tf.data.Dataset.counter())
    task_examples = examples.for_source(
      config, self._source, self.num_classes, config.pp_eval, None
    )
    ds = _process(ds, self._source, task_examples, lambda i: i)
    total = self.num_batches * self.local_batch_size
    pad = tf.data.Dataset.from_tensors(task_examples.pad()).repeat()
    return _checked(ds.concatenate(pad).take(total), task_examples, self.local_batch_size, config)

  def __iter__(self) -> Iterator[dict[str, Any]]:
    config = self._config
    skips = bad_data.SkipCounter(1.0, int(config.max_image_pixels or 0), 0)
    prefetcher = _Prefetcher(
      _batches(self._dataset(), self._mesh, self._data_axes), config.prefetch
    )
    try:
      for batch, host in iter(prefetcher.get, None):  # get raises StopIteration at the end
        skips.add(host)
        yield batch
    finally:
      prefetcher.close()
    good, expected = skips.read - skips.skipped, self._host_length
    if good < expected:
      skipped = f": {skips.skipped:,} skipped ({skips.summary()}); {skips.culprit()}"
      raise bad_data.IncompleteEvaluationError(
        f"evaluation of split {self.split!r} read {good:,} of the {expected:,} examples of "
        f"this host{skipped if skips.skipped else ''}; an evaluation needs every example of "
        "its split"
      )
    logging.info(
      "input pipeline: evaluation of split %r read all %s examples of this host (%s on %d hosts)",
      self.split, f"{good:,}", f"{self.num_examples:,}", self.process_count,
    )  # fmt: skip

  def __len__(self) -> int:
    return self.num_batches
