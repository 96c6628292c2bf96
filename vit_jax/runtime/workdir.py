"""What a stage keeps in its workdir besides checkpoints: `config.json`, and atomic JSON writes.

A workdir belongs to one run. Rerunning a command resumes it; rerunning it with a different
config would pair checkpoints with settings they were not trained with (or fail deep inside the
restore). So before anything is restored or written, the config is compared with the saved
`config.json`; a difference outside `RESUMABLE_FIELDS` stops the run with one line naming the
fields, and nothing in the workdir is touched. `config.json` is written only after the state was
restored or initialised, through a temporary file and a rename, so a reader never sees half a
file and a failed start leaves the old one in place.

One writer per workdir: while a stage runs, process 0 holds `<workdir>/lock.json` (host, pid,
start time), so that a second launch on the same workdir stops with one line naming the holder
instead of writing the same checkpoints. The lock is released when the run ends, however it
ends; a lock left by a process that is gone (killed, its machine restarted) is taken over with a
warning when it names this host. The lock is created exclusively: O_EXCL on a local disk, a
generation precondition on gs:// (vit_jax.runtime.gcs), so of two launches in the same instant one wins
(on other object stores the check and the write are two requests).

This file must not import TensorFlow.
"""

import contextlib
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from etils import epath

from vit_jax.runtime import gcs

CONFIG_FILE = "config.json"
LOCK_FILE = "lock.json"
# The last value of every metric a finished stage logged (process 0 writes it).
FINAL_METRICS_FILE = "final_metrics.json"

# Fields (dotted paths, regular expressions matched in full) that may change when a run is
# resumed: how long it runs, how often it logs, evaluates and saves, evaluator settings, the
# mesh (checkpoints restore onto any mesh) and gradient accumulation (the same trajectory, see
# vit_jax.train), where the data lives and how it is read, and rematerialisation (same
# parameters and numbers). Everything else is part of what was trained.
RESUMABLE_FIELDS = (
  r"total_steps",
  r"log_every_steps",
  r"accum_steps",
  r"eval_batch_size",
  r"evals(\..*)?",
  r"checkpoint\.(every_steps|keep|asynchronous)",
  r"mesh\..*",
  r"model_init",
  r"init_from_scratch",
  r"dataset\.(data_dir|num_threads|prefetch)",
  r"model\.remat",
)


def write_json(path: str | epath.PathLike, value: Any) -> None:
  """Writes `value` as JSON to `path` atomically (a temporary file renamed over the target)."""
  path = epath.Path(path)
  tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
  text = value if isinstance(value, str) else json.dumps(value, indent=2, sort_keys=True)
  tmp.write_text(text)
  tmp.replace(path)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  """A nested mapping as {"a.b.c": leaf} (a config's fields by their dotted names)."""
  if isinstance(tree, Mapping):
    out = {}
    for key, value in tree.items():
      out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out
  return {prefix: tree}


def _comparable(config: ml_collections.ConfigDict | Mapping[str, Any]) -> dict[str, Any]:
  """A config as the flat JSON values `config.json` holds (tuples become lists, ...)."""
  if isinstance(config, ml_collections.ConfigDict):
    config = json.loads(config.to_json_best_effort())
  return flatten(config)


def differences(saved: Mapping[str, Any], config: ml_collections.ConfigDict) -> list[str]:
  """'field: saved -> now' for each field that differs and may not change on resume."""
  old, new = _comparable(saved), _comparable(config)
  allowed = re.compile("|".join(f"(?:{p})" for p in RESUMABLE_FIELDS))
  out = []
  for key in sorted(set(old) | set(new)):
    if allowed.fullmatch(key) or old.get(key, "<absent>") == new.get(key, "<absent>"):
      continue
    out.append(f"{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}")
  return out


def check_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Refuses to resume `workdir` with a config that differs from the saved one.

  Raises:
    ValueError: one line naming the workdir and the differing fields.
  """
  path = epath.Path(workdir) / CONFIG_FILE
  if not path.exists():
    return
  diff = differences(json.loads(path.read_text()), config)
  if diff:
    shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
    raise ValueError(
      f"{workdir} holds a run with another config: {shown}. Use a new --workdir, or the "
      f"saved settings ({path}); what may change on resume: vit_jax.runtime.workdir.RESUMABLE_FIELDS"
    )


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes `config` as the workdir's `config.json` (atomically)."""
  write_json(epath.Path(workdir) / CONFIG_FILE, config.to_json_best_effort(indent=2))


def save_final_metrics(workdir: str, metrics: dict[str, Any]) -> None:
  """Writes the finished stage's last metrics, atomically, as `final_metrics.json`."""
  values = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
  write_json(epath.Path(workdir) / FINAL_METRICS_FILE, values)


class WorkdirLocked(RuntimeError):
  """Another run holds the workdir."""


def _start_time(pid: int) -> str | None:
  """The start time of process `pid` (clock ticks since boot), or None if it does not exist.

  With the pid it identifies a process even where pids are reused (a restarted container runs
  its command under the same pid)."""
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


def _holder_alive(holder: Mapping[str, Any]) -> bool:
  if holder.get("host") != socket.gethostname():
    return True  # another machine's process: cannot tell, so it holds the lock
  started = _start_time(int(holder.get("pid", -1)))
  return started is not None and started in (holder.get("process_start"), "unknown")


def _take(path: epath.Path, record: dict[str, Any]) -> dict[str, Any] | None:
  """Writes `record` to `path` unless it exists; returns the holder's record when it does."""
  text = json.dumps(record, indent=2)
  if "://" not in os.fspath(path):
    try:
      fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return _read_holder(path)
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return None
  if not gcs.is_gcs(path):  # another object store: a check, then a write (not atomic)
    if path.exists():
      return _read_holder(path)
    path.write_text(text)
    return None
  if gcs.create_exclusive(path, text):
    return None
  holder = _read_holder(path)
  # A create retried after a lost answer finds its own record.
  return None if holder == record else holder


def _read_holder(path: epath.Path) -> dict[str, Any]:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return {"host": "?", "pid": "?", "started": "? (unreadable lock file)"}


@contextlib.contextmanager
def lock(workdir: str) -> Iterator[None]:
  """Holds the workdir's lock for the block (process 0 takes it; every process must enter).

  Raises:
    WorkdirLocked: a live run holds it (one line naming its host, pid and start time).
  """
  path = epath.Path(workdir) / LOCK_FILE
  record = dict(
    host=socket.gethostname(),
    pid=os.getpid(),
    process_start=_start_time(os.getpid()),
    started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
  )
  holder = None
  if jax.process_index() == 0:
    gcs.check_bucket(workdir)
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    holder = _take(path, record)
    if holder is not None and not _holder_alive(holder):
      logging.warning(
        "taking over the lock of %s: pid %s on %s (started %s) is no longer running",
        workdir,
        holder.get("pid"),
        holder.get("host"),
        holder.get("started"),
      )
      path.unlink(missing_ok=True)
      holder = _take(path, record)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    held = bool(multihost_utils.broadcast_one_to_all(np.int32(holder is not None)))
    if held and holder is None:
      holder = {"host": "?", "pid": "?", "started": "? (process 0 names it)"}
  if holder is not None:
    raise WorkdirLocked(
      f"{workdir} is in use by another run: pid {holder.get('pid')} on {holder.get('host')}, "
      f"started {holder.get('started')} ({path}). Wait for it or use another --workdir; if "
      f"that run is gone, delete {path}"
    )
  try:
    yield
  finally:
    if jax.process_index() == 0:
      current = _read_holder(path)
      if (current.get("host"), current.get("pid")) == (record["host"], record["pid"]):
        path.unlink(missing_ok=True)
