"""What the input pipeline does with data it cannot use: reading a file is not decoding a record.

The rules (docs/data.md, "Hosts, determinism, bad data"): a file that cannot be read is read
again (`Retries`), then ends the run (`DataReadError`); a record that cannot be decoded, is too
large, was lost with a damaged file or (detection) breaks the rules on boxes is a skipped example (a zero image with mask 0, so batch
boundaries and stream positions stay fixed), counted by reason (`SkipCounter`) and held to
`dataset.max_skipped_fraction` (`TooManySkippedError`); an evaluation that skipped one fails
(`IncompleteEvaluationError`: a metric over part of a split is not the split's metric). Every
host applies the limit to its own share of the disjoint records it reads.

Errors raised inside tf.data (a reader's Python code, an in-graph assertion) reach the consumer as
a TensorFlow error whose message carries a mark; `translate` turns it back into the exception.
No TensorFlow here.
"""

import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from absl import logging

READ_ATTEMPTS = 4  # reads of a file in all: the first and three more
READ_BACKOFF_S = 0.5  # before the second read; doubled before each further one (3.5 s in all)
# Records a host reads before its share of skipped examples is held to the limit (or one epoch
# of a smaller split): with the default limit, one skipped example in the first 1,000 passes.
MIN_RECORDS = 1000

# Why an example is in the batch: its `status` (the pipeline's per-example field).
# BAD_ANNOTATION: a detection example whose boxes break the rules (sources/detection.py); the
# problem is the example's `why` (a host field of the detection task only).
OK, UNDECODABLE, LOST, TOO_LARGE, BAD_ANNOTATION, PAD = 0, 1, 2, 3, 4, -1
_REASONS = {
  UNDECODABLE: "could not be decoded or preprocessed",
  LOST: "was lost with the rest of its damaged TFRecord file",
  TOO_LARGE: "declares {pixels:,} pixels, more than dataset.max_image_pixels={limit:,}",
  BAD_ANNOTATION: "has a bad annotation: {why}",
}
_COUNTED_AS = {
  UNDECODABLE: "undecodable",
  LOST: "lost in damaged files",
  TOO_LARGE: "too large",
  BAD_ANNOTATION: "with bad annotations",
}


class DataReadError(OSError):
  """A data file could not be read (after the retries): the run ends, nothing is skipped."""


class DataMismatchError(ValueError):
  """A split's files disagree with the dataset_info.json that describes them."""


class TooManySkippedError(ValueError):
  """A host skipped more than `dataset.max_skipped_fraction` of the examples it read."""


class IncompleteEvaluationError(ValueError):
  """An evaluation read fewer examples than its split has."""


# Marks of our errors inside TensorFlow error messages → the exception each one stands for.
_MARKS = {
  "vit_jax.input_pipeline read error: ": DataReadError,
  "vit_jax.input_pipeline mismatch: ": DataMismatchError,
}
ERROR_MARK = "vit_jax.input_pipeline error: "  # in-graph assertions (a bad label): ValueError


@contextlib.contextmanager
def marked_errors():
  """Around Python code that tf.data runs (a reader, a py function): our errors leave it with
  their mark in the message, so that `translate` gives them back to the consumer."""
  try:
    yield
  except (DataReadError, DataMismatchError) as e:
    mark = next(m for m, kind in _MARKS.items() if kind is type(e))
    raise type(e)(mark + str(e)) from e


def translate(error: Exception) -> Exception:
  """A TensorFlow error carrying one of our marks → that exception; others as they are."""
  message = getattr(error, "message", str(error))
  for mark, kind in _MARKS.items():
    match = re.search(re.escape(mark) + r"(.*?)(\n|$)", message)
    if match:
      return kind(match.group(1))
  match = re.search(re.escape(ERROR_MARK) + r"(.*?)(\]|\n|$)", message)
  if match:
    return ValueError(match.group(1))
  return error


class Retries:
  """The retry policy of one file's reads: call `failed(error)` in the `except` of a read."""

  def __init__(self, path: str, sleep: Callable[[float], Any] = time.sleep):
    self.path, self._sleep = path, sleep
    self.attempt, self._delay = 1, READ_BACKOFF_S

  def failed(self, error: BaseException) -> None:
    """Returns after the backoff when another attempt is left; raises DataReadError naming the
    file and the cause when none is, and `error` itself when it is no I/O error."""
    if not isinstance(error, OSError) and not hasattr(error, "error_code"):  # tf.errors.OpError
      raise error
    message = getattr(error, "message", None) or str(error)
    cause = f"{type(error).__name__}: {message.strip().splitlines()[0] if message else ''}"
    if self.attempt >= READ_ATTEMPTS:
      raise DataReadError(f"cannot read {self.path} ({self.attempt} attempts): {cause}") from error
    logging.warning("reading %s failed (attempt %d of %d), again in %.1f s: %s",
                    self.path, self.attempt, READ_ATTEMPTS, self._delay, cause)  # fmt: skip
    self._sleep(self._delay)
    self.attempt += 1
    self._delay *= 2


def read_file(path: str, opener: Callable = open) -> bytes:
  """The bytes of the file `path`, opened with `opener` (`open`, or tf.io.gfile.GFile for gs://
  paths), read again after an I/O error (see `Retries`)."""
  retries = Retries(path)
  while True:
    try:
      with opener(path, "rb") as f:
        return f.read()
    except Exception as e:  # noqa: BLE001 - Retries.failed re-raises what is no I/O error
      retries.failed(e)


def reason(status: int, pixels: int = 0, max_pixels: int = 0, why: str = "") -> str:
  """Why an example of `status` was skipped, in words (`why`: a bad annotation's problem)."""
  return _REASONS[status].format(pixels=int(pixels), limit=int(max_pixels), why=why)


def _text(value) -> str:
  return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class SkipCounter:
  """One host's count of the records it read and the examples it skipped, by reason.

  Args:
    max_fraction: the limit on skipped / read (dataset.max_skipped_fraction).
    max_pixels: dataset.max_image_pixels, for the messages.
    min_records: records read before the limit applies.
    skipped, read: the counts so far (a resumed run's).
  """

  def __init__(
    self, max_fraction: float, max_pixels: int, min_records: int, skipped: int = 0, read: int = 0
  ):
    self.max_fraction, self.max_pixels, self.min_records = max_fraction, max_pixels, min_records
    self.skipped, self.read = int(skipped), int(read)
    self.by_status = {status: 0 for status in _REASONS}
    self.last: tuple[str, str] | None = None  # (where, why) of the most recent skipped example

  def add(self, batch: dict[str, np.ndarray], log: bool = True) -> int:
    """Counts a batch's records (`status`, `where`, `pixels` [B], and for detection `why` [B],
    a bad annotation's problem; padding is not a record) and logs each skipped example but a
    damaged file's lost records (the reader named the file once); returns the batch's skipped
    examples."""
    status = np.asarray(batch["status"])
    self.read += int(np.sum(status != PAD))
    rows = np.flatnonzero(status > OK)
    for r in rows:
      code, where = int(status[r]), _text(batch["where"][r])
      self.by_status[code] += 1
      if code == BAD_ANNOTATION:
        problem = _text(batch["why"][r])
        self.last = (where, reason(code, why=problem))
        if log:
          logging.warning("input pipeline: skipped %s: %s", where, problem)
        continue
      why = reason(code, batch["pixels"][r], self.max_pixels)
      self.last = (where, why)
      if log and code != LOST:
        logging.warning("input pipeline: skipped %s: it %s", where, why)
    self.skipped += len(rows)
    return len(rows)

  def summary(self) -> str:
    """'3 undecodable, 2 too large' (the reasons seen)."""
    return ", ".join(f"{n:,} {_COUNTED_AS[s]}" for s, n in self.by_status.items() if n)

  def culprit(self) -> str:
    if self.last is None:
      return "all of them before the run resumed (its log names them)"
    where, why = self.last
    return f"the most recent: {where}, which {why}"

  def check(self) -> None:
    """Raises TooManySkippedError (one line) when the share is over the limit, once enough
    records were read."""
    if self.read < self.min_records or self.skipped <= self.max_fraction * self.read:
      return
    counts = f" ({self.summary()})" if self.summary() else ""
    if sum(self.by_status.values()) < self.skipped:  # the reasons are not kept over a resume
      counts = f" ({self.summary() or 'none'} since the run resumed)"
    raise TooManySkippedError(
      f"input pipeline: {self.skipped:,} of the {self.read:,} examples this host read "
      f"({100 * self.skipped / self.read:.2f}%) were skipped{counts}, more than "
      f"dataset.max_skipped_fraction={self.max_fraction:g}; {self.culprit()}"
    )
