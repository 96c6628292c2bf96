"""vit_jax.runtime.liveness's watch of process 0's coordination service, and the hold on
SIGABRT that lets its line come before JAX's abort. Through the entry point with two
processes: tests/test_multiprocess_faults.py."""

import socket
import subprocess
import sys
import textwrap
import threading
import time

from vit_jax.runtime import liveness


class _Service:
  """A listening port that accepts connections and closes each at once (as a live
  coordination service drops an idle connection), until `stop()`: then nothing listens."""

  def __init__(self):
    self._socket = socket.create_server(("127.0.0.1", 0))
    self._socket.settimeout(0.1)
    self.address = f"127.0.0.1:{self._socket.getsockname()[1]}"
    self.accepted = 0
    self._stopping = threading.Event()
    self._thread = threading.Thread(target=self._serve, daemon=True)
    self._thread.start()

  def _serve(self):
    while not self._stopping.is_set():
      try:
        connection, _ = self._socket.accept()
      except TimeoutError:
        continue
      self.accepted += 1
      connection.close()

  def stop(self):
    self._stopping.set()
    self._thread.join()
    self._socket.close()


def test_the_watch_ends_the_process_once_nothing_listens_at_the_coordinator():
  service = _Service()
  monitor = liveness.Monitor(None, 1, 2, timeout_s=2, name="vit_jax", coordinator=service.address)
  ends = []

  def end(who, why, failed=False):  # liveness's own ends the process (os._exit)
    ends.append((who, why, time.monotonic()))
    monitor._closing.set()

  monitor._end = end
  monitor._watch.start()
  try:
    time.sleep(1.5)
    assert service.accepted >= 2, service.accepted  # a dropped connection is taken again
    assert ends == [], ends  # ... and is no loss: the service still listens
  finally:
    stopped = time.monotonic()
    service.stop()
  monitor._watch.join(timeout=10)
  assert not monitor._watch.is_alive()
  [(who, why, when)] = ends
  assert who == 0 and why == f"its coordination service at {service.address} refuses connections"
  assert when - stopped < 5, when - stopped


def test_a_watch_that_is_finished_ends_nothing():
  service = _Service()
  monitor = liveness.Monitor(None, 1, 2, timeout_s=2, name="vit_jax", coordinator=service.address)
  ends = []
  monitor._end = lambda *args, **kwargs: ends.append(args)
  monitor._watch.start()
  time.sleep(0.5)
  monitor._closing.set()  # what `finish` does before the run's processes end
  monitor._watch.join(timeout=10)
  service.stop()
  assert not monitor._watch.is_alive() and ends == []


# A process that aborts (abort(), as JAX's client does) in a thread of its own, its main thread
# printing a line every 0.5 s; `held` the hold of liveness, or the hold then its release.
_ABORTING = textwrap.dedent(
  """
  import ctypes, faulthandler, sys, threading, time
  from vit_jax.runtime import liveness
  faulthandler.enable()  # as absl's app.run does
  held = liveness._hold_aborts()
  if sys.argv[1] == "released":
    liveness._release_aborts(held)
  start = time.monotonic()
  threading.Thread(target=ctypes.CDLL(None).abort).start()
  while True:
    time.sleep(0.5)
    print(f"alive {time.monotonic() - start:.1f}", flush=True)
  """
)


def _abort(variant: str) -> tuple[int, str, str, float]:
  start = time.monotonic()
  done = subprocess.run(
    [sys.executable, "-c", _ABORTING, variant], capture_output=True, text=True, timeout=60
  )
  return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def test_an_abort_is_held_6_s_then_ends_the_process_as_before():
  code, out, err, took = _abort("held")
  alive = [float(line.split()[1]) for line in out.splitlines()]
  assert code == -6, (code, out, err)
  assert "Fatal Python error: Aborted" in err, err  # faulthandler's stacks still come first
  assert alive and 5 <= alive[-1] < 15 and took < 30, (alive, took)


def test_a_released_hold_aborts_at_once():
  code, out, err, _ = _abort("released")
  assert code == -6 and out == "", (code, out, err)
  assert "Fatal Python error: Aborted" in err, err
