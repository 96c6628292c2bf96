"""Reading one TFRecord file record by record, for the `tfrecord` source.

Reading the file and damage to its content are told apart (vit_jax.input_pipeline.bad_data):
an I/O error is retried, re-reading the file past the records already given; a damaged file (a
CRC mismatch, a truncated record, trailing bytes, an empty file) gives the records before the
damage, then one placeholder (`ok` False) per record it lost, so an epoch keeps the length that
the per-host split and exact resume count on; an undamaged file holding another number of
records than dataset_info.json lists stops the run (DataMismatchError).

The records are read in Python (TensorFlow's record iterator, `_records`, in chunks handed to
tf.data), where an error is attributed to its file; `TFRecordDataset` reads and parses in one op
and fails a whole interleave without saying which file.
"""

import tensorflow as tf
from absl import logging

from vit_jax.input_pipeline import bad_data

_FRAMING_BYTES = 16  # uint64 length, uint32 length CRC, data, uint32 data CRC.
_CHUNK = 64  # records handed from Python to tf.data per call.
UNKNOWN = -1  # a file's record count when dataset_info.json does not list it
# tf.compat.v1.io.tf_record_iterator without its deprecation wrapper, which printed five lines
# on every tfrecord run's first read (its suggested replacement is TFRecordDataset, above).
_records = tf.compat.v1.io.tf_record_iterator.__wrapped__


def _chunk(records: list[bytes], first: int, ok: bool = True):
  return records, list(range(first, first + len(records))), [ok] * len(records)


def read_chunks(path: bytes | str, expected: int = UNKNOWN):
  """Yields ([records], [index], [ok]) chunks of one file, then placeholders (ok False) for the
  records a damaged file lost; `expected` is the file's listed record count, or UNKNOWN."""
  path = path.decode() if isinstance(path, bytes) else path
  expected = int(expected)
  with bad_data.marked_errors():
    retries = bad_data.Retries(path)
    index = 0  # records yielded
    while True:
      chunk, problem = [], None
      try:
        size, consumed, seen = tf.io.gfile.stat(path).length, 0, 0
        try:
          for record in _records(path):
            consumed += len(record) + _FRAMING_BYTES
            seen += 1
            if seen <= index:  # given before a read error: read again, not twice
              continue
            chunk.append(record)
            if len(chunk) == _CHUNK:
              yield _chunk(chunk, index)
              index, chunk = index + len(chunk), []
        except tf.errors.DataLossError as e:
          problem = f"{type(e).__name__}: {e.message.strip().splitlines()[0]}"
        else:
          if consumed != size:
            problem = f"truncated: {size - consumed} trailing bytes are not a whole record"
          elif size == 0:
            problem = "empty file"
      except (tf.errors.OpError, OSError) as e:
        retries.failed(e)  # backs off, or raises DataReadError after the last attempt
        continue
      break
    if chunk:
      yield _chunk(chunk, index)
      index += len(chunk)
    if problem is None:
      if expected not in (UNKNOWN, index):
        raise bad_data.DataMismatchError(
          f"{path} holds {index} records, but dataset_info.json lists {expected}; rewrite the "
          "split (make_shards --overwrite)"
        )
      return
    if expected == UNKNOWN:  # one placeholder, also in count_records: the split's length
      lost, what = 1, "an unknown number of its records are lost (dataset_info.json lists no "
      what += "count for it), counted as one skipped example"
    else:
      lost = max(expected - index, 0)
      what = f"its last {lost} of {expected} records are lost, counted as skipped examples"
    logging.warning(
      "input pipeline: %s is damaged after record %d (%s): %s", path, index, problem, what
    )
    for start in range(0, lost, _CHUNK):
      yield _chunk([b""] * min(_CHUNK, lost - start), index + start, ok=False)


def count_records(path: str) -> int:
  """Raw elements `read_chunks` yields for a file without a listed count (one placeholder for a
  damaged file's loss included): its length in the per-host split."""
  try:
    return sum(len(chunk[0]) for chunk in read_chunks(path))
  except (bad_data.DataReadError, bad_data.DataMismatchError) as e:  # outside tf.data: unmarked
    raise bad_data.translate(e) from e.__cause__


@tf.autograph.experimental.do_not_convert
def file_dataset(path: tf.Tensor, expected: tf.Tensor) -> tf.data.Dataset:
  """{'record', 'file', 'index', 'ok'} of one file, placeholders included (see `read_chunks`)."""
  ds = tf.data.Dataset.from_generator(
    read_chunks,
    args=(path, expected),
    output_signature=(
      tf.TensorSpec([None], tf.string),
      tf.TensorSpec([None], tf.int64),
      tf.TensorSpec([None], tf.bool),
    ),
  ).unbatch()
  return ds.map(
    tf.autograph.experimental.do_not_convert(
      lambda record, index, ok: {"record": record, "file": path, "index": index, "ok": ok}
    )
  )
