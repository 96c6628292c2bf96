"""Waiting on storage: a checkpoint call run on a worker thread that the caller waits on in slices.

A storage client retries a failing request inside one call that does not return to Python until
it gives up (TensorStore's GCS driver: 32 times, backing off to 32 s; 898 s for one restore in
the tests), while the run says nothing and a stop signal waits. `wait` runs the call on a daemon
thread instead, says what it waits for, and abandons it on a stop (its result is dropped).

This file must not import TensorFlow.
"""

import threading
import time
from collections.abc import Callable
from typing import Any

from absl import logging

# A wait on storage says what it waits for at least this often (seconds).
NOTICE_EVERY_S = 30.0
# How long a call may still take once a stop was requested: one that is only reading (a restore
# from a local disk) ends as usual, and the run stops as it returns, at a stopping point.
STOP_GRACE_S = 5.0
# How often the waiting thread looks up.
_SLICE_S = 0.5


class Abandoned(Exception):  # noqa: N818 - a request carried out, not an error
  """A stop was requested while waiting; `waited_s`: how long the call had run."""

  def __init__(self, waited_s: float):
    self.waited_s = waited_s
    super().__init__(f"a stop was requested after waiting on storage for {waited_s:.0f} s")


class Notices:
  """What one wait on storage says (it may span several calls and the pauses between them):
  '<doing>: waiting on storage for 30 s<note>', once nothing was said for NOTICE_EVERY_S."""

  def __init__(self, doing: str):  # e.g. 'restoring checkpoint step 40 from gs://b/run'
    self.doing = doing
    self.start = self._last = time.monotonic()

  def said(self) -> None:
    """Another line about this wait was logged (a retry's warning): the next notice waits."""
    self._last = time.monotonic()

  def tick(self, note: str = "") -> None:
    """Logs the notice (`note` appended, e.g. ' (attempt 1 of 4)') if it is due."""
    now = time.monotonic()
    if now - self._last >= NOTICE_EVERY_S:
      logging.warning("%s: waiting on storage for %.0f s%s", self.doing, now - self.start, note)
      self._last = now


def wait(
  call: Callable[[], Any],
  notices: Notices,
  stop_requested: Callable[[], bool] | None = None,
  note: str = "",
) -> Any:
  """What `call()` (a restore attempt, a save) returns, run on a worker thread; its exception is
  raised here. `notices` tick with `note` appended (e.g. ' (attempt 1 of 4)'); once
  `stop_requested()` (None: never) is True, the call has STOP_GRACE_S more, then `Abandoned`."""
  done = threading.Event()
  outcome: dict[str, Any] = {}

  def run():
    try:
      outcome["value"] = call()
    except BaseException as e:  # noqa: BLE001 - raised in the waiting thread
      outcome["error"] = e
    done.set()

  # A daemon: a call abandoned on a stop must not keep the interpreter from exiting.
  threading.Thread(target=run, name="vit_jax-storage", daemon=True).start()
  start = time.monotonic()
  give_up = None  # once a stop was requested: when the call is abandoned
  while not done.wait(_SLICE_S):
    now = time.monotonic()
    if give_up is None and stop_requested is not None and stop_requested():
      give_up = now + STOP_GRACE_S
    if give_up is not None and now >= give_up:
      raise Abandoned(now - start)
    notices.tick(note)
  if "error" in outcome:
    raise outcome["error"]
  return outcome["value"]
