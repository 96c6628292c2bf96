"""A lost process of a multi-process run ends the run on every other process, within seconds,
with one line naming it (docs/training.md, "A lost process" and "A crash of process 0").

JAX's coordination service watches heartbeats too, but ends the others from C++ (SIGABRT, nothing
on the terminal) and only after its timeout (vit_jax.runtime.distributed sets it well above
this module's). So every process runs a `Monitor` thread that, every `interval_s`, writes a
counter of its own to the coordination service (`vit_jax/liveness/<process>/state`) and reads
the counter of the next process in a ring that has not ended. A counter that has not moved for
`timeout_s`, or a coordination service that has not answered for as long, makes the monitor
publish the loss (`vit_jax/lost/<process>`, read by every monitor on its next round), write its
line to the terminal and end its process with status 1 (os._exit: the main thread may be
blocked in a collective that never returns).

A process that ends on its own says so first (`finish`: 'finished' or 'failed'), so that the
others never take it for lost. A process that fails (`settle`, before its line) first waits
until every other process has shown a sign of life, ended, or been found gone: a collective that
failed because a peer died (gloo: "Connection reset by peer") is then reported as that loss.

A crash of process 0 (which runs the coordination service) resets its TCP connections, and
JAX's client then aborts every other process at once. So every other process also holds a TCP
connection to the coordinator's port (`coordinator` of `start`; the service drops an idle one
after a minute, and it is taken again): once it closes and a new one is refused, the process
writes its line and ends. A process 0 that ends on its own keeps its service up until every
other process has ended (JAX's shutdown barrier). To let that line come first, a SIGABRT is held
for 6 s (`_hold_aborts`) while the monitor runs.

This file must not import TensorFlow.
"""

import ctypes
import faulthandler
import os
import signal
import socket
import threading
import time
from typing import Any

from absl import logging

_ALIVE = "vit_jax/liveness"
_LOST = "vit_jax/lost/"
_FINISHED, _FAILED = "finished", "failed"

_monitor: "Monitor | None" = None  # this process's, once `start` ran


class Monitor:
  """The threads of one process (see the module docstring); `client` is jax.distributed's,
  `coordinator` the `host:port` of its coordination service (watched by processes other than 0)."""

  def __init__(
    self,
    client: Any,
    process: int,
    count: int,
    timeout_s: float,
    name: str,
    coordinator: str | None = None,
  ):
    self._client, self._me, self._count = client, process, count
    self._coordinator = coordinator if process != 0 else None
    self._timeout, self._name = float(timeout_s), name
    self._interval = max(0.2, self._timeout / 10)
    self._closing = threading.Event()
    self._failing = False  # this process is failing: a peer that failed is no news
    self._ending = threading.Lock()
    self._thread = threading.Thread(target=self._run, name="vit_jax-liveness", daemon=True)
    self._watch = threading.Thread(
      target=self._watch_coordinator, name="vit_jax-coordinator", daemon=True
    )
    self._held_aborts = None  # what `_release_aborts` needs

  def start(self) -> "Monitor":
    self._set(str(0))
    self._thread.start()
    if self._coordinator:
      self._held_aborts = _hold_aborts()
      self._watch.start()
    return self

  def _set(self, state: str) -> None:
    self._client.key_value_set(f"{_ALIVE}/{self._me}/state", state, allow_overwrite=True)

  def _states(self) -> dict[int, str]:
    """Every process's state (one read of the coordination service)."""
    entries = self._client.key_value_dir_get(f"{_ALIVE}/")
    return {int(key.split("/")[-2]): value for key, value in entries}

  def _poll(self, unanswered_s: float, beat: str | None = None) -> dict[int, str] | None:
    """Every process's state, after this one's `beat` (if any) and a look for a published loss;
    None if the coordination service does not answer, which ends this process once it has not
    answered for the timeout (`unanswered_s`: for how long it has not, until now)."""
    try:
      if beat is not None:
        self._set(beat)
      self._announced()
      return self._states()
    except Exception as e:  # noqa: BLE001 - the coordination service does not answer
      if unanswered_s > self._timeout:
        self._service_lost(unanswered_s, e)
      return None

  def _announced(self) -> None:
    """Ends this process if some monitor has published a loss."""
    lost = self._client.key_value_dir_get(_LOST)
    if lost:
      key, why = lost[0]
      self._end(int(key.rsplit("/", 1)[1]), why)

  def _run(self) -> None:
    beat, peer, seen, changed, answered = 0, None, None, time.monotonic(), time.monotonic()
    while not self._closing.wait(self._interval):
      beat += 1
      now = time.monotonic()
      states = self._poll(now - answered, str(beat))
      if states is None:
        continue
      answered = now
      watched = self._watched(states)
      if watched is None:
        continue
      if watched != peer:  # a new one to watch: its clock starts now
        peer, seen, changed = watched, states.get(watched), now
      state = states.get(peer)
      if state == _FAILED and not self._failing:
        self._end(peer, "its log says why", failed=True)
      if state != seen:
        seen, changed = state, now
      elif now - changed > self._timeout:
        self._lost(peer, f"no sign of life for {now - changed:.0f} s")

  def _watch_coordinator(self) -> None:
    """Ends this process once process 0's coordination service refuses connections."""
    host, port = self._coordinator.rsplit(":", 1)
    address = (host.strip("[]"), int(port))
    held = None  # a connection that closes when process 0 ends
    while not self._closing.is_set():
      if held is None:
        try:
          held = socket.create_connection(address, timeout=self._interval)
        except ConnectionRefusedError:  # a host that answers, and nothing listening
          self._end(0, f"its coordination service at {self._coordinator} refuses connections")
        except OSError:  # no answer (a lost host: the counters find it), or no such name
          self._closing.wait(self._interval)
        continue
      try:
        closed = not held.recv(4096)  # the service's HTTP/2 frames, read and dropped
      except TimeoutError:  # nothing for `interval` s (the socket's timeout): look up
        continue
      except OSError:  # reset
        closed = True
      if closed:  # process 0 ended, or its service dropped an idle connection (after 60 s)
        held.close()
        held = None
        self._closing.wait(0.05)
    if held is not None:
      held.close()

  def _watched(self, states: dict[int, str]) -> int | None:
    """The next process in the ring that has not finished (a failed one is watched: it ends
    this one)."""
    for k in range(1, self._count):
      p = (self._me + k) % self._count
      if states.get(p) != _FINISHED:
        return p
    return None

  def settle(self) -> None:
    """Before this process reports its own failure: returns once every other process has shown
    a sign of life or ended; ends this process naming a lost one instead (see the module)."""
    self._failing = True
    start = answered = time.monotonic()
    first: dict[int, str | None] = {}
    alive: set[int] = set()
    while True:
      now = time.monotonic()
      states = self._poll(now - answered)
      if states is None:
        time.sleep(self._interval)
        continue
      answered = now
      pending = []
      for p in range(self._count):
        state = states.get(p)
        if p == self._me or p in alive or state in (_FINISHED, _FAILED):
          continue
        if first.setdefault(p, state) != state:
          alive.add(p)
          continue
        if now - start > self._timeout:
          self._lost(p, f"no sign of life for {now - start:.0f} s")
        pending.append(p)
      if not pending:
        return
      time.sleep(self._interval)

  def finish(self, failed: bool) -> None:
    """Stops the thread and says this process ended (finished, or failed)."""
    self._closing.set()
    self._thread.join(timeout=self._interval + 5)  # its last counter never follows the state
    if self._coordinator:
      self._watch.join(timeout=self._interval + 5)
      _release_aborts(self._held_aborts)
    try:
      self._set(_FAILED if failed else _FINISHED)
    except Exception as e:  # noqa: BLE001 - the others then find it gone
      logging.info("liveness: could not say this process ended: %s", e)

  def _service_lost(self, silent_s: float, error: BaseException) -> None:
    why = f"the coordination service it runs has not answered for {silent_s:.0f} s"
    self._end(0, f"{why}: {str(error).strip().splitlines()[0] if str(error).strip() else error}")

  def _lost(self, who: int, why: str) -> None:
    try:
      self._client.key_value_set(f"{_LOST}{who}", why, allow_overwrite=True)
    except Exception:  # noqa: BLE001 - the others find it gone themselves
      pass
    self._end(who, why)

  def _end(self, who: int, why: str, failed: bool = False) -> None:
    """Writes the line naming process `who` and ends this process (status 1)."""
    from vit_jax.runtime import console

    with self._ending:
      what = "failed" if failed else "is gone"
      line = (
        f"{self._name}: error: process {who} of {self._count} {what} ({why}): stopping. "
        f"Nothing after the last committed checkpoint is kept; the same command on every "
        f"process continues from it"
      )
      logging.error("%s", line, extra={"terminal": False})
      console.end(line)
      os._exit(1)


def _libc() -> Any:
  """The C library, its `signal` taking and returning handlers' addresses; None where ctypes
  finds none (then nothing holds JAX's abort, which comes at once)."""
  try:
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.sleep  # noqa: B018 - looked up before anything is changed: it must exist
  except (OSError, AttributeError):
    return None
  return libc


def _set_abort_handler(libc: Any, handler: int | None) -> int | None:
  """Sets SIGABRT's handler to the function at address `handler` (None: the default), behind
  Python's faulthandler where that is on (absl turns it on: on an abort it writes every
  thread's stack to the log, then calls the handler it found); returns the previous one."""
  dumps = faulthandler.is_enabled()
  faulthandler.disable()  # puts back the handler it found
  previous = libc.signal(signal.SIGABRT, handler)
  if dumps:
    try:
      faulthandler.enable()  # to sys.stderr, as absl's call (a command's is its log file)
    except (OSError, ValueError, AttributeError, RuntimeError):  # sys.stderr has no file
      pass
  return previous


def _hold_aborts() -> tuple[Any, int | None] | None:
  """Holds a thread that aborts this process for 6 s: libc's `sleep` becomes SIGABRT's handler
  (a handler is called with the signal's number: sleep(6)). abort() ends the process once the
  handler returns; meanwhile the other threads run, and when the abort is JAX's reaction to
  process 0's crash, the coordinator's watch ends the process first, with its line. A SIGABRT
  sent with `kill` is held 6 s, then ignored. Returns what `_release_aborts` needs."""
  libc = _libc()
  if libc is None:
    return None
  return libc, _set_abort_handler(libc, ctypes.cast(libc.sleep, ctypes.c_void_p).value)


def _release_aborts(held: tuple[Any, int | None] | None) -> None:
  """Puts back SIGABRT's handler from before `_hold_aborts`."""
  if held is not None:
    _set_abort_handler(*held)


def start(
  client: Any, process: int, count: int, timeout_s: float, name: str, coordinator: str | None = None
) -> None:
  """Starts this process's monitor (several processes; see the module docstring)."""
  global _monitor
  _monitor = Monitor(client, process, count, timeout_s, name, coordinator).start()
  logging.info(
    "liveness: a process silent for %g s counts as gone", timeout_s, extra={"terminal": False}
  )


def settle() -> None:
  """`Monitor.settle` of this process's monitor (nothing without one)."""
  if _monitor is not None:
    _monitor.settle()


def finish(failed: bool = False) -> None:
  """`Monitor.finish` of this process's monitor (nothing without one)."""
  global _monitor
  if _monitor is not None:
    _monitor.finish(failed)
    _monitor = None
