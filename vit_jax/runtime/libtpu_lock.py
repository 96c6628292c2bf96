"""libtpu's one-process lock, /tmp/libtpu_lockfile, for the processes that compile for TPU topologies.

When JAX initialises libtpu's plugin, for a TPU backend or only for a topology's description
(what the planner compiles for), libtpu takes a POSIX write lock on /tmp/libtpu_lockfile for the
life of the process; a second process then aborts with advice ("sudo rm /tmp/libtpu_lockfile")
that, under a live holder, lets a second process at the chips. On a machine without a TPU
`topology_desc` sets ALLOW_MULTIPLE_LIBTPU_LOAD=1 (unless set already), with which libtpu
(0.0.42.1) neither opens nor locks the file; on a TPU VM the lock is kept, and a held one ends in
one line naming its holder (docs/pod_planning.md).

This file imports JAX only in `topology_desc`.
"""

import os

from vit_jax.kernels import xla_cpu_memory

LOCKFILE = "/tmp/libtpu_lockfile"  # libtpu's own, fixed path
ALLOW = "ALLOW_MULTIPLE_LIBTPU_LOAD"


def topology_desc(topology: str, **kwargs):
  """`jax.experimental.topologies.get_topology_desc(topology, "tpu", **kwargs)`, without libtpu's
  lock where this machine has no TPU; raises RuntimeError (one line, naming the holder) where
  the lock is held."""
  if xla_cpu_memory.device_node(xla_cpu_memory.TPU_NODES) is None:
    os.environ.setdefault(ALLOW, "1")
  from jax.experimental import topologies  # noqa: PLC0415 - the caller has set JAX_PLATFORMS

  try:
    return topologies.get_topology_desc(topology, "tpu", **kwargs)
  except RuntimeError as e:  # jax.errors.JaxRuntimeError
    if LOCKFILE not in str(e):
      raise
    raise RuntimeError(held_message()) from e


def held_message(path: str = LOCKFILE) -> str:
  """What to say when libtpu found its lock held: by whom, and what to do instead."""
  return (
    f"libtpu's lock {path} is held by {holder(path) or 'another process'}: one process at a "
    "time may use this machine's TPU; plan once it has ended or on a machine without a TPU (the "
    "planner needs none), and leave the file in place while its holder lives"
  )


def holder(path: str = LOCKFILE) -> str | None:
  """'process <pid> (<its command line>)' of a process holding a lock on `path`, from
  /proc/locks; None where none is found (no such file, no /proc, a holder in another PID
  namespace)."""
  try:
    st = os.stat(path)
    with open("/proc/locks") as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
  for line in lines:
    # '1: POSIX  ADVISORY  WRITE 7252 fe:00:2147601 0 EOF'; a waiter's line has '->' after '1:'.
    fields = line.split()
    if len(fields) >= 6 and fields[1] != "->" and fields[5] == inode:
      return f"process {fields[4]}{_command_line(fields[4])}"
  return None


def _command_line(pid: str) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      argv = f.read().split(b"\0")
  except OSError:
    return ""
  text = " ".join(b" ".join(argv).decode(errors="replace").split())  # on one line
  return f" ({text[:120]}{'...' if len(text) > 120 else ''})" if text else ""
