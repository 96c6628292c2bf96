"""Stopping a training run on request, at a step that every process saves: SIGTERM and SIGINT.

Kubernetes and Slurm send SIGTERM before they take a machine away, a user's Ctrl-C sends SIGINT.
`StopOnSignal` turns the first of either into a request to stop: the trainer asks `reached(step)`
after every step, saves that step when it answers True, and raises `Stopped`, which the entry
point turns into one line and exit status 128 + the signal's number (143 for SIGTERM, 130 for
SIGINT), so that a scheduler sees a run that did not finish and a rerun of the same command
continues from the saved step without replaying any. A second signal stops without saving
(the checkpoints already committed are whole: Orbax renames a step into place only once it is
complete, and the next run removes the temporary directory): under a command, which calls
`exit_on_second_signal()`, the process exits at once; elsewhere (a notebook, a program of the
user's) KeyboardInterrupt is raised in the main thread, so that the program (a notebook's
kernel) lives on.

On several processes (jax.distributed) the signal may reach one process or all of them, at
different steps. The stop step is agreed through the coordination service, as JAX's preemption
service does for TPU preemption notices: the process that got the signal publishes a notice; on
every process a watcher thread, waiting on that key, publishes the step its trainer has reached
and, once every process has, takes the largest plus one. A trainer that sees the notice waits
at its next step boundary for that agreement, so no process can run past the agreed step, and
none waits on another's trainer (only on its watcher), so the wait cannot deadlock with a step
another process still has to dispatch. The check costs nothing per step until a signal arrives.

This file must not import TensorFlow.
"""

import os
import signal
import threading
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
  """The run saved `step` and stopped because of `reason` (a signal's name)."""

  def __init__(self, reason: str, exit_status: int, step: int, total_steps: int, where: str):
    self.reason, self.exit_status, self.step = reason, exit_status, step
    super().__init__(
      f"stopped by {reason} at step {step} of {total_steps}; saved to {where}. "
      f"The same command continues from step {step}."
    )


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
    self._current = -1  # the step the trainer last reached (read by the watcher)
    self._notice = threading.Event()  # some process asked to stop
    self._agreed = threading.Event()  # ... and the stop step is known
    self._target: int | None = None
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
    """Watcher thread (several processes): waits for a notice, then agrees on the stop step."""
    client, n = self._client, jax.process_count()
    while not self._closing.is_set():
      try:
        reason = client.blocking_key_value_get(f"{self._prefix}/notice", _POLL_MS)
        break
      except Exception:  # noqa: BLE001 - the wait timed out: look again
        continue
    else:
      return
    if self.signal_name is None:
      self.signal_name, self.exit_status = reason, 128 + signal.Signals[reason].value
    self._notice.set()  # before reading _current: the trainer stops at most one step past it
    try:
      client.key_value_set(f"{self._prefix}/step/{jax.process_index()}", str(self._current))
      steps = [
        int(client.blocking_key_value_get(f"{self._prefix}/step/{p}", _AGREE_TIMEOUT_S * 1000))
        for p in range(n)
      ]
      self._target = max(steps) + 1
    except Exception as e:  # noqa: BLE001 - reported by `reached`
      self._error = e
    self._agreed.set()

  def reached(self, step: int) -> bool:
    """Whether the run should save `step` (just dispatched) and stop; call after every step."""
    self._current = step
    if self._client is None:
      if self.signal_name is not None:
        logging.warning("%s received: saving step %d, then stopping", self.signal_name, step)
        return True
      return False
    if not self._notice.is_set() and self.signal_name is None:
      return False
    if not self._agreed.wait(_AGREE_TIMEOUT_S):
      raise RuntimeError(f"processes did not agree on a stop step within {_AGREE_TIMEOUT_S} s")
    if self._error is not None or self._target is None:
      raise RuntimeError(f"agreeing on a stop step failed: {self._error}")
    if step == self._target:
      logging.warning("%s: every process saves step %d, then stops", self.signal_name, step)
    elif step > self._target:
      raise RuntimeError(f"step {step} is past the agreed stop step {self._target}")
    return step == self._target
