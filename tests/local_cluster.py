"""Launches N local JAX processes that meet at a coordinator on 127.0.0.1 (tests only).

Picking a free port and handing it to the processes is racy: between the check and the
coordinator's bind another process (a parallel test worker under `pytest -n`, or the kernel
choosing an ephemeral port for some connection) can take it. So:
- ports come from below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range),
  where the kernel never assigns one on its own;
- a port is reserved among test processes by an exclusive lock on a file named after it, held
  until the processes have exited, so two launches on this machine never share a port;
- if the coordinator still fails to bind (a port some other program holds), every process of
  the attempt is stopped and the launch retried on another port.
"""

import contextlib
import fcntl
import os
import pathlib
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

# What process 0 prints when jax.distributed's coordinator cannot bind its port.
_BIND_FAILURES = ("Failed to start RPC server", "Failed to add port")


def _port_range() -> range:
  """Ports outside the kernel's ephemeral range."""
  try:
    low, high = map(int, pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
  except (OSError, ValueError):
    low, high = 32768, 60999
  return range(10000, low) if low > 12000 else range(high + 1, 65536)


def _bindable(port: int) -> bool:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    try:
      s.bind(("0.0.0.0", port))
    except OSError:
      return False
  return True


@contextlib.contextmanager
def reserved_port(exclude: frozenset[int] = frozenset()) -> Iterator[int]:
  """A port, not in `exclude`, that no other user of this function here holds in the block."""
  ports = [p for p in _port_range() if p not in exclude]
  lock_dir = pathlib.Path(tempfile.gettempdir())
  for _ in range(200):
    port = random.choice(ports)
    with open(lock_dir / f"vit_jax_test_port_{port}.lock", "w") as lock:
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        continue
      if _bindable(port):
        yield port
        return
  raise RuntimeError("no free port for the coordinator")


def launch(
  command: Callable[[int, int], Sequence[str]],
  num_processes: int = 2,
  timeout: float = 600,
  grace: float = 60,
  attempts: int = 3,
  ended: list[float | None] | None = None,
  **popen_kwargs,
) -> list[tuple[int, str]]:
  """Runs `command(port, process_id)` for each process; returns [(returncode, output)].

  Output is stdout and stderr together. Once a process fails, the others get `grace` seconds
  to end on their own (they may be blocked on the failed one) and are then killed. The whole
  launch is retried on another port when process 0 reports that the coordinator could not bind.
  `ended`, if given, receives each process's time of exit (time.monotonic(), seen within 0.2 s;
  None for a process the launcher killed).
  """
  failed = set()
  for attempt in range(attempts):
    with reserved_port(frozenset(failed)) as port:
      times: list[float | None] = [None] * num_processes
      results = _run_once(command, port, num_processes, timeout, grace, popen_kwargs, times)
      if ended is not None:
        ended[:] = times
    coordinator_output = results[0][1]
    if results[0][0] != 0 and any(m in coordinator_output for m in _BIND_FAILURES):
      failed.add(port)
      if attempt + 1 < attempts:
        continue
    return results
  raise AssertionError("unreachable")


def _run_once(command, port, num_processes, timeout, grace, popen_kwargs, ended):
  with contextlib.ExitStack() as stack:
    logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(num_processes)]
    procs = [
      subprocess.Popen(
        list(command(port, i)), stdout=logs[i], stderr=subprocess.STDOUT, text=True, **popen_kwargs
      )
      for i in range(num_processes)
    ]
    deadline = time.monotonic() + timeout
    failed_at = None
    try:
      while None in [p.poll() for p in procs]:  # every process polled: `ended` is accurate
        now = time.monotonic()
        for i, p in enumerate(procs):
          if ended[i] is None and p.returncode is not None:
            ended[i] = now
        if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
          failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + grace):
          break
        time.sleep(0.2)
    finally:
      killed = set()
      for i, p in enumerate(procs):
        if ended[i] is None and p.poll() is not None:
          ended[i] = time.monotonic()
        if p.poll() is None:
          os.kill(p.pid, signal.SIGKILL)
          p.wait()
          killed.add(i)
    results = []
    for i, (p, log) in enumerate(zip(procs, logs, strict=True)):
      log.seek(0)
      out = log.read()
      if i in killed:  # the output says so: a test's failure message then tells what happened
        why = f"{grace:.0f} s after another process failed" if failed_at else f"{timeout:.0f} s"
        out += f"\n[local_cluster: SIGKILLed by the launcher after {why}]"
      results.append((p.returncode, out))
    return results
