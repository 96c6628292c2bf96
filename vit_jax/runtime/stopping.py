"""Stopping a training run on request, at a point that every process agrees on: SIGTERM and SIGINT.

`StopOnSignal` turns the first of either signal into a request to stop, acted on at the next
stopping point the trainer passes (`poll`): after every step (`reached(step)`: that step is
saved), between any two batches of an evaluation (`checked_data`), once a restore or
initialisation returns, and once the first batch was fetched and the step compiled. The trainer
then raises `Stopped`, which the entry point turns into one line and exit status 128 + the
signal's number. A second signal stops without saving: under a command, which calls
`exit_on_second_signal()`, the process exits at once; elsewhere (a notebook, a program of the
user's) KeyboardInterrupt is raised in the main thread. What a user sees: docs/training.md,
"Stopping, faults and recovery".

On several processes (jax.distributed) the signal may reach one process or all of them, at
different points. Every process passes the same stopping points in the same order, counted by
`poll`. The stopping point is agreed through the coordination service, as JAX's preemption
service does for TPU preemption notices: the process that got the signal publishes a notice; on
every process a watcher thread, waiting on that key, publishes the count its trainer has reached
and, once every process has, takes the largest plus one. A trainer that sees the notice waits at
its next stopping point for that agreement, so no process can run past the agreed point, and
none waits on another's trainer (only on its watcher), so the wait cannot deadlock with a
collective another process still has to enter. The check costs nothing per step until a signal
arrives.

This file must not import TensorFlow.
"""

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
from absl import logging

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_POLL_MS = 500  # how often a watcher looks up from waiting for a notice (to notice the run's end)
_AGREE_TIMEOUT_S = 300  # the longest wait for every process to say where it is
_runs = [0]  # trainer runs started in this process: namespaces the coordination keys
_second_signal_exits = [False]  # set by a command: a second signal ends the process at once


def exit_on_second_signal() -> None:
  """From now on a second signal during a run ends the process at once (os._exit) instead of
  raising KeyboardInterrupt: what a command wants (vit_jax.runtime.cli.run calls it)."""
  _second_signal_exits[0] = True


class Stopped(Exception):  # noqa: N818 - a request carried out, not an error
  """The run stopped at `step` because of `reason` (a signal's name); the step is saved in
  `where` (None: nothing was trained yet, so nothing was saved)."""

  def __init__(self, reason: str, exit_status: int, step: int, total_steps: int, where: str | None):
    self.reason, self.exit_status, self.step = reason, exit_status, step
    if where is None:
      text = f"stopped by {reason} before step 1 of {total_steps}; nothing to save. The same "
      text += "command starts from the beginning."
    else:
      text = f"stopped by {reason} at step {step} of {total_steps}; saved to {where}. The same "
      text += f"command continues from step {step}."
    super().__init__(text)


class StopRequested(Exception):  # noqa: N818 - a request, raised to leave an evaluation
  """Raised between two evaluation batches when the run stops there (see `checked_data`)."""


def _client() -> Any:
  """The coordination service client of jax.distributed, or None on a single process."""
  if jax.process_count() == 1:
    return None
  from jax._src import distributed  # the client multihost_utils itself uses

  return distributed.global_state.client


class StopOnSignal:
  """Context manager: while inside, SIGTERM and SIGINT request a stop (see the module docstring).

  Handlers can only be installed from the main thread; elsewhere (a trainer run from a thread)
  the signals keep their handlers and `reached` only answers for notices of other processes.
  """

  def __init__(self):
    _runs[0] += 1
    self._prefix = f"vit_jax/stop/{_runs[0]}"
    self._client = _client()
    self.signal_name: str | None = None
    self.exit_status = 0
    self._previous: dict[int, Any] = {}
    self._current = 0  # the stopping points the trainer has passed (read by the watcher)
    self._notice = threading.Event()  # some process asked to stop
    self._agreed = threading.Event()  # ... and the stopping point is known
    self._target: int | None = None  # the agreed stopping point
    self._acted = False  # the run has stopped at it
    self._error: BaseException | None = None
    self._closing = threading.Event()
    self._watcher: threading.Thread | None = None

  def __enter__(self) -> "StopOnSignal":
    if threading.current_thread() is threading.main_thread():
      for signum in _SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)
    if self._client is not None:
      self._watcher = threading.Thread(target=self._watch, name="vit_jax-stop", daemon=True)
      self._watcher.start()
    return self

  def __exit__(self, *exc) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
    self._closing.set()
    if self._watcher is not None:
      self._watcher.join(timeout=2 * _POLL_MS / 1000)

  def _handle(self, signum, frame) -> None:
    name = signal.Signals(signum).name
    if self.signal_name is not None:
      intact = "without saving; the checkpoints already committed are intact"
      if not _second_signal_exits[0]:
        raise KeyboardInterrupt(f"second signal ({name}): stopped {intact}")
      # Written straight to the terminal: no logging lock is taken inside a signal handler.
      from vit_jax.runtime import console

      console.write_line(f"vit_jax: second signal ({name}): exiting now {intact}")
      os._exit(128 + signum)
    self.signal_name, self.exit_status = name, 128 + signum
    if self._client is not None:
      try:
        self._client.key_value_set(f"{self._prefix}/notice", name, allow_overwrite=True)
      except Exception as e:  # noqa: BLE001 - the local stop still happens
        self._error = e

  def _watch(self) -> None:
    """Watcher thread (several processes): waits for a notice, then agrees on the stopping
    point."""
    client, n = self._client, jax.process_count()
    while not self._closing.is_set():
      start = time.monotonic()
      try:
        reason = client.blocking_key_value_get(f"{self._prefix}/notice", _POLL_MS)
        break
      except Exception:  # noqa: BLE001 - the wait timed out (or failed at once): look again
        if time.monotonic() - start < _POLL_MS / 2000:  # no service to wait on: do not spin
          time.sleep(_POLL_MS / 1000)
        continue
    else:
      return
    if self.signal_name is None:
      self.signal_name, self.exit_status = reason, 128 + signal.Signals[reason].value
    self._notice.set()  # before reading _current: the trainer passes at most one point more
    try:
      client.key_value_set(f"{self._prefix}/point/{jax.process_index()}", str(self._current))
      points = [
        int(client.blocking_key_value_get(f"{self._prefix}/point/{p}", _AGREE_TIMEOUT_S * 1000))
        for p in range(n)
      ]
      self._target = max(points) + 1
    except Exception as e:  # noqa: BLE001 - reported by `poll`
      self._error = e
    self._agreed.set()

  def requested(self) -> bool:
    """Whether a stop was requested, here or (several processes) by any process's signal; what
    a phase that waits (the restore's retries) checks to cut its waits short."""
    return self.signal_name is not None or self._notice.is_set()

  def poll(self) -> bool:
    """Whether the run stops at this stopping point: call it at every one (see the module
    docstring), in the same order on every process; once True, True at every later point."""
    self._current += 1
    if self._client is None:
      return self.signal_name is not None
    if not self._notice.is_set() and self.signal_name is None:
      return False
    if not self._agreed.wait(_AGREE_TIMEOUT_S):
      raise RuntimeError(f"processes did not agree where to stop within {_AGREE_TIMEOUT_S} s")
    if self._error is not None or self._target is None:
      raise RuntimeError(f"agreeing where to stop failed: {self._error}")
    if self._current > self._target and not self._acted:
      raise RuntimeError(
        f"stopping point {self._current} is past the agreed stopping point {self._target}"
      )
    self._acted = self._acted or self._current == self._target
    return self._acted

  def reached(self, step: int) -> bool:
    """Whether the run should save `step` (just dispatched) and stop; call after every step."""
    if not self.poll():
      return False
    logging.warning("%s: saving step %d, then stopping", self.signal_name, step)
    return True

  def check(self) -> None:
    """Raises StopRequested when the run stops at this point (between evaluation batches)."""
    if self.poll():
      logging.warning("%s: abandoning the evaluation", self.signal_name)
      raise StopRequested(self.signal_name)

  def checked_data(self, make_data: Callable[..., Callable[[], Any]]) -> Callable:
    """An evaluators.DataFactory whose every pass over a split calls `check` before each batch,
    so that a signal ends an evaluation between two batches; the same as `make_data` otherwise."""

    def make(*args, **kwargs):
      source = make_data(*args, **kwargs)

      def checked() -> Iterator[Any]:
        batches = iter(source())
        try:
          while True:
            self.check()
            try:
              batch = next(batches)
            except StopIteration:
              return
            yield batch
        finally:
          # An abandoned pass releases its reader now, while its threads run: left to the
          # garbage collector at exit, joining them can wait forever.
          if hasattr(batches, "close"):
            batches.close()

      return checked

    return make

  def stopped(self, step: int, total_steps: int, where: str | None) -> Stopped:
    """The `Stopped` of this request at `step`, saved in `where` (None: nothing saved)."""
    reason = self.signal_name or "a stop request"
    return Stopped(reason, self.exit_status or 143, step, total_steps, where)
