"""The workdir lock: one writer per workdir, held as a lease that its holder renews.

Process 0 holds `<workdir>/lock.json` (host, pid, start time, PID namespace, a token) and renews
it every quarter of its lease (`LEASE_S`); the lock's age (a local file's modification time, a
gs:// object's last write) is how long ago its holder showed it was alive. Each step is atomic
where the storage allows it (O_EXCL and an exclusive take-over marker on a local disk, generation
preconditions on gs://); on other object stores the check and the write are two requests.
docs/training.md ("One writer per workdir, as a lease") has the whole behaviour: refusals,
take-overs, empty lock files, `--break_lock`.

This file must not import TensorFlow.
"""

import contextlib
import dataclasses
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import jax
from absl import logging
from etils import epath

from vit_jax.runtime import distributed, gcs, json_file

LOCK_FILE = "lock.json"
LEASE_S = 300.0  # a holder not heard of for this long is gone
_TAKE_ATTEMPTS = 3  # creates tried before giving up to launches taking over at the same time
_TAKEOVER_STALE_S = 30.0  # a take-over takes milliseconds: its marker older than this is left over


class WorkdirLocked(RuntimeError):
  """Another run holds the workdir."""


# ---------------------------------------------------------------------------------------------
# Who holds it.


def _start_time(pid: int) -> str | None:
  """The start time of process `pid` (clock ticks since boot), or None if it does not exist:
  with the pid it identifies a process where pids are reused (a restarted container)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return None
    except PermissionError:
      pass
    return "unknown"  # alive, start time not readable here (not Linux)


def _pid_namespace() -> int | None:
  """This process's PID namespace (its inode), or None where there is none to read."""
  try:
    return os.stat("/proc/self/ns/pid").st_ino
  except OSError:
    return None


def _seconds(value: Any) -> float:
  """`value` as seconds: a finite number (else ValueError, TypeError)."""
  if type(value) not in (int, float) or not math.isfinite(value):
    raise ValueError(value)
  return float(value)


# A lock record's shape (vit_jax.runtime.json_file): what `_why_expired` and `_describe` read.
_RECORD = {
  "host?": str,
  "pid?": json_file.checked(lambda p: type(p) is int and 0 < p < 2**31, "a process id"),
  "process_start?": (str, None),
  "pid_ns?": (int, None),
  "started?": str,
  "lease_s?": json_file.checked(lambda s: s is None or _seconds(s) > 0, "a lease in seconds"),
  "renewed?": json_file.checked(lambda t: _seconds(t) >= 0, "a time"),
  "token?": str,
}


def _parse(text: str | None) -> dict[str, Any] | None:
  """The lock record in `text`, or None: empty, not JSON, or of another shape."""
  try:
    return json_file.decode(text or "", _RECORD, LOCK_FILE)
  except json_file.InvalidFile:
    return None


def _token(text: str | None) -> str | None:
  return (_parse(text) or {}).get("token")


def _why_expired(holder: Mapping[str, Any] | None, age: float, lease: float) -> str | None:
  """Why the lock may be taken over, or None while its holder counts as alive."""
  if holder is None:
    if age > lease:
      return f"its lock file is empty or unreadable and {age:.0f} s old (lease {lease:.0f} s)"
    return None
  same_pids = holder.get("pid_ns", _pid_namespace()) == _pid_namespace()
  if holder.get("host") == socket.gethostname() and same_pids and "pid" in holder:
    started = _start_time(holder["pid"])
    if started is None or started not in (holder.get("process_start"), "unknown"):
      return "that process is no longer running"
    return None  # alive on this host, whatever its renewals say
  lease = float(holder.get("lease_s") or lease)
  if age > lease:
    return f"its lease expired: not renewed for {age:.0f} s (lease {lease:.0f} s)"
  return None


def _describe(holder: Mapping[str, Any] | None) -> str:
  if holder is None:
    return "an empty or unreadable lock file"
  return (
    f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
    f"started {holder.get('started', '?')}"
  )


# ---------------------------------------------------------------------------------------------
# Where it is kept: a local disk, gs://, another object store.


@dataclasses.dataclass(frozen=True)
class _Seen:
  text: str
  age: float  # seconds since its holder last renewed it
  version: Any  # what `remove_if` compares


class _Store:
  """Where a lock is kept: create, read, renew, take over, remove (subclasses: which storage)."""

  def __init__(self, path: epath.Path):
    self.path = path

  def adopt(self, seen: _Seen) -> None:
    pass

  def remove(self) -> None:
    self.path.unlink(missing_ok=True)


class _LocalStore(_Store):
  """O_EXCL create, renewal by the modification time, take-over under an exclusive marker."""

  def __init__(self, path: epath.Path):
    self.path = os.fspath(path)

  def create(self, text: str) -> bool:
    try:
      fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return True

  def read(self) -> _Seen | None:
    try:
      with open(self.path, errors="replace") as f:  # bytes that are not UTF-8: no record
        stat = os.fstat(f.fileno())
        text = f.read()
    except FileNotFoundError:
      return None
    return _Seen(text, max(0.0, time.time() - stat.st_mtime), (stat.st_ino, stat.st_mtime_ns))

  def renew(self, token: str) -> bool:
    seen = self.read()
    if seen is None or _token(seen.text) != token:
      return False
    os.utime(self.path)
    return True

  def take_over(self, seen: _Seen, text: str) -> bool:
    # One taker at a time (a file created exclusively beside the lock): between its check of
    # the version and its write no other taker can replace the lock.
    mutex = f"{self.path}.takeover"
    try:
      os.close(os.open(mutex, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
      with contextlib.suppress(FileNotFoundError):
        if time.time() - os.stat(mutex).st_mtime > _TAKEOVER_STALE_S:  # its taker died
          os.unlink(mutex)
      return False
    try:
      current = self.read()
      if current is None or current.version != seen.version:  # renewed or replaced since
        return False
      tmp = f"{self.path}.{uuid.uuid4().hex[:8]}"
      with open(tmp, "w") as f:
        f.write(text)
      os.replace(tmp, self.path)
      return True
    finally:
      os.unlink(mutex)

  def remove(self) -> None:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(self.path)


class _GcsStore(_Store):
  """Every write conditional on the object's generation: create, renew, take-over."""

  def __init__(self, path: epath.Path):
    super().__init__(path)
    self.generation = None  # of this process's own lock, once taken

  def create(self, text: str) -> bool:
    if not gcs.create_exclusive(self.path, text):
      return False
    seen = gcs.read_versioned(self.path)
    self.generation = seen[1] if seen else None
    return True

  def read(self) -> _Seen | None:
    seen = gcs.read_versioned(self.path)
    return None if seen is None else _Seen(seen[0], seen[2], seen[1])

  def adopt(self, seen: _Seen) -> None:
    self.generation = seen.version  # a create retried after a lost answer: ours after all

  def renew(self, token: str) -> bool:
    seen = gcs.read_versioned(self.path)
    if seen is None or seen[1] != self.generation or _token(seen[0]) != token:
      return False
    self.generation = gcs.replace_if(self.path, seen[0], seen[1])
    return self.generation is not None

  def take_over(self, seen: _Seen, text: str) -> bool:
    # One request: this run's record replaces exactly the version judged expired.
    self.generation = gcs.replace_if(self.path, text, seen.version)
    return self.generation is not None


class _ObjectStore(_Store):
  """Another object store: a check, then a write (not atomic); the age is the record's own."""

  def create(self, text: str) -> bool:
    if self.path.exists():
      return False
    self.path.write_text(text)
    return True

  def read(self) -> _Seen | None:
    if not self.path.exists():
      return None
    text = self.path.read_bytes().decode(errors="replace")
    renewed = (_parse(text) or {}).get("renewed", 0.0)
    return _Seen(text, max(0.0, time.time() - float(renewed)), text)

  def renew(self, token: str) -> bool:
    seen = self.read()
    record = _parse(seen.text) if seen else None
    if not record or record.get("token") != token:
      return False
    self.path.write_text(json.dumps(dict(record, renewed=time.time()), indent=2))
    return True

  def take_over(self, seen: _Seen, text: str) -> bool:
    current = self.read()
    if current is None or current.text != seen.text:
      return False
    self.path.write_text(text)
    return True


def _store(path: epath.Path):
  if "://" not in os.fspath(path):
    return _LocalStore(path)
  return _GcsStore(path) if gcs.is_gcs(path) else _ObjectStore(path)


# ---------------------------------------------------------------------------------------------
# Taking, renewing, releasing.


def _acquire(store, record: dict[str, Any], workdir: str, lease: float) -> str | None:
  """Takes the lock (None) or returns the line saying who holds it."""
  text = json.dumps(record, indent=2)
  path = epath.Path(workdir) / LOCK_FILE
  for _ in range(_TAKE_ATTEMPTS):
    if store.create(text):
      return None
    seen = store.read()
    if seen is None:
      continue  # released meanwhile
    holder = _parse(seen.text)
    if holder is not None and holder.get("token") == record["token"]:
      store.adopt(seen)
      return None
    why = _why_expired(holder, seen.age, lease)
    if why is None:
      held_for = float((holder or {}).get("lease_s") or lease)
      if holder is None:
        return (
          f"{workdir} is locked by an empty or unreadable lock file, {seen.age:.0f} s old "
          f"({path}): a launch killed while taking it, or one taking it now. It is taken over "
          f"once older than the lease ({held_for:.0f} s), or now with --break_lock"
        )
      return (
        f"{workdir} is in use by another run: {_describe(holder)}, lease renewed "
        f"{seen.age:.0f} s ago ({path}). Wait for it or use another --workdir; if that run is "
        f"gone, a launch takes its lock over once the lease ({held_for:.0f} s) has expired, "
        "or now with --break_lock"
      )
    if store.take_over(seen, text):
      logging.warning("took over the lock of %s from %s: %s", workdir, _describe(holder), why)
      return None
  return f"{workdir}: could not take its lock ({path}): other launches are taking it at once"


def _renew(store, token: str, workdir: str, every: float, stop: threading.Event) -> None:
  """Renews the lock every `every` seconds until `stop` is set (a daemon thread's loop)."""
  while not stop.wait(every):
    try:
      if not store.renew(token):
        logging.error("the lock of %s is no longer this run's (taken over or removed)", workdir)
        return
    except Exception as e:  # noqa: BLE001 - a transient storage error: the next renewal retries
      logging.warning("could not renew the lock of %s: %s", workdir, e)


@contextlib.contextmanager
def lock(workdir: str, lease_s: float | None = None) -> Iterator[None]:
  """Holds the workdir's lock for the block (process 0 takes and renews it; every process must
  enter).

  Raises:
    WorkdirLocked: a live run holds it (one line naming its host, pid, start time and lease).
  """
  lease = LEASE_S if lease_s is None else float(lease_s)
  record = dict(
    host=socket.gethostname(),
    pid=os.getpid(),
    process_start=_start_time(os.getpid()),
    pid_ns=_pid_namespace(),
    started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    lease_s=lease,
    renewed=time.time(),
    token=uuid.uuid4().hex,
  )
  refusal, store = None, None
  if jax.process_index() == 0:
    gcs.check_bucket(workdir)
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    store = _store(epath.Path(workdir) / LOCK_FILE)
    refusal = _acquire(store, record, workdir, lease)
  if distributed.of_process_0(refusal is not None) and refusal is None:
    refusal = f"{workdir} is in use by another run (process 0 names it)"
  if refusal is not None:
    raise WorkdirLocked(refusal)
  stop = threading.Event()
  if store is not None:
    args = (store, record["token"], workdir, lease / 4, stop)
    renewal = threading.Thread(target=_renew, args=args, name="workdir_lock", daemon=True)
    renewal.start()
  try:
    yield
  finally:
    if store is not None:
      stop.set()
      renewal.join(timeout=30)
      seen = store.read()
      if seen is not None and _token(seen.text) == record["token"]:
        store.remove()


def break_lock(workdir: str) -> str:
  """Removes the workdir's lock whoever holds it; the line saying whose it was."""
  path = epath.Path(workdir) / LOCK_FILE
  store = _store(path)
  seen = store.read()
  if seen is None:
    return f"--break_lock: {workdir} had no lock"
  store.remove()
  return f"--break_lock: removed the lock of {workdir} held by {_describe(_parse(seen.text))}"
