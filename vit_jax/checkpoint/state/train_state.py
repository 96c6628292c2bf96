"""The trainer's checkpoints in the workdir (Orbax), and `restore_params` of one of them.

Layout: `<workdir>/checkpoints/<step>/state` holds the train state pytree (params, opt_state,
step, rng, and ema with Polyak averaging), each process writing its own shards, and
`<step>/data` the input iterator's state as JSON. Orbax writes a step to a temporary directory
and renames it when complete, so a run killed at any moment leaves only complete steps behind.
Restoring takes an abstract state (`jax.ShapeDtypeStruct`s carrying the target shardings), so a
checkpoint written on one mesh restores onto any other.

Faults (docs/training.md, "Stopping, faults and recovery"): only evidence that a step is broken
(restore_faults) moves it aside to `<workdir>/broken_checkpoints/`; other restore errors are
retried, each attempt on a worker thread (storage_wait).

This file must not import TensorFlow.
"""

import copy
import errno
import functools
import os
import re
import shutil
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from absl import logging
from etils import epath

from vit_jax.checkpoint.state import restore_faults, storage_wait
from vit_jax.runtime import distributed, gcs

_STATE, _DATA = "state", "data"
CHECKPOINT_DIR = "checkpoints"
BROKEN_DIR = "broken_checkpoints"
_TMP_MARK = ".orbax-checkpoint-tmp"  # Orbax's suffix of a step (or item) still being written
# Orbax writes an array replicated over R devices "replica-parallel", 1/R per replica, each slice
# cut by a program compiled for it: for small arrays the compiles cost more than the write (a
# 20k-parameter ViT on 8 CPU devices: 104 programs; a 2-stage test run 37.7 s -> 28.8 s without).
# Arrays whose slice would be under this size are written whole by one replica.
MIN_REPLICA_SLICE_BYTES = 64 * 1024
# TensorStore's retries of a GCS request within one restore attempt (its default, 32 backing off
# to 32 s, takes about 15 minutes); `_restore_retrying` retries instead. Saves keep the default.
RESTORE_REQUEST_RETRIES = {"max_retries": 5, "initial_delay": "1s", "max_delay": "16s"}
# A restore's outcome on one process; the gravest on any process decides (restore_latest).
_OK, _RETRY, _BROKEN, _MISMATCH = range(4)
# The barrier Orbax's Checkpointer.restore ends with (before its key prefix: see _failed).
_ORBAX_RESTORE_BARRIER = "Checkpointer:restore"


class CheckpointSaveError(OSError):
  """A checkpoint could not be written (the message says which step, where, and why)."""


class Checkpointer:
  """The workdir's checkpoints; every process calls `save`, `restore`, `wait` and `close`."""

  def __init__(self, workdir: str, every_steps: int, keep: int, asynchronous: bool = True):
    gcs.require_client(workdir)  # Orbax opens a gs:// directory with google-cloud-storage
    _register_array_handler()
    self.every_steps = max(int(every_steps), 1)
    options = ocp.CheckpointManagerOptions(
      save_interval_steps=self.every_steps,
      max_to_keep=int(keep) if keep else None,
      enable_async_checkpointing=asynchronous,
      create=True,
      cleanup_tmp_directories=True,
    )
    self._asynchronous = asynchronous
    self.workdir = _absolute(workdir)
    self.directory = self.workdir / CHECKPOINT_DIR
    self._writing: int | None = None  # the step of the save in flight
    self._step_bytes = 0  # the state's size, for the message of a full disk
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=options,
      item_names=(_STATE, _DATA),
      item_handlers={_STATE: ocp.StandardCheckpointHandler(), _DATA: ocp.JsonCheckpointHandler()},
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def reached_preemption(self, step: int) -> bool:
    """Whether all processes agreed at `step` that the job is being preempted (TPU VMs, with
    jax.distributed); always False on a single process without it."""
    return self._manager.reached_preemption(step)

  def should_save(self, step: int) -> bool:
    """Whether `step` is a periodic checkpoint step (the last step is saved with force=True)."""
    return step % self.every_steps == 0

  def save(self, step: int, state: Any, data_state: Any, force: bool = False) -> bool:
    """Starts writing `state` (global arrays) and `data_state` (JSON) at `step`, once the save in
    flight is done; CheckpointSaveError if this save or the one before it failed."""
    items = {_STATE: ocp.args.StandardSave(state), _DATA: ocp.args.JsonSave(data_state)}
    args = ocp.args.Composite(**items)
    try:
      # Orbax reports here the failure of the previous asynchronous save, if any.
      saved = storage_wait.wait(
        lambda: self._manager.save(step, args=args, force=force),
        storage_wait.Notices(f"saving checkpoint step {step} to {self.directory}"),
      )
    except Exception as e:
      self._save_failed(e, self._writing if self._writing is not None else step)
    if saved:
      self._writing = step
      self._step_bytes = sum(int(x.nbytes) for x in jax.tree_util.tree_leaves(state))
      logging.info("checkpoint: saving step %d to %s", step, self.directory)
    return saved

  def _save_failed(self, error: BaseException, step: int) -> None:
    if out_of_space(error):
      raise self.no_space(f"saving checkpoint step {step}") from error
    raise CheckpointSaveError(
      f"saving checkpoint step {step} to {self.directory} failed: {_first_line(error)}"
    ) from error

  def no_space(self, doing: str) -> CheckpointSaveError:
    """The error for a full disk met while `doing` ('saving checkpoint step 20'), once the
    unfinished step directories are removed."""
    try:
      self._manager.wait_until_finished()  # a save still in flight fails or ends first
    except Exception:  # noqa: BLE001 - that save is unfinished, and removed below
      pass
    removed = self._remove_unfinished()
    committed = committed_steps(self.directory)
    kept = f"step {max(committed)} is intact" if committed else "no step was saved before"
    full = CheckpointSaveError(
      f"no space left on the device of {self.workdir} while {doing}: a checkpoint step takes "
      f"about {_megabytes(self._step_size())}, {_megabytes(_free_bytes(self.workdir))} are "
      f"free; {'the unfinished step was removed, ' if removed else ''}{kept}. Free space and "
      f"rerun the same command to continue"
    )
    full.errno = errno.ENOSPC
    return full

  def _step_size(self) -> int | None:
    """Bytes of the latest committed step on disk (local workdirs), else of the state saved."""
    steps = committed_steps(self.directory)
    if not steps or "://" in os.fspath(self.directory):
      return self._step_bytes or None
    walk = os.walk(os.fspath(self.directory / str(steps[-1])))
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in walk for f in files)

  def _remove_unfinished(self) -> bool:
    """Removes unfinished steps' temporary directories (process 0); whether there were any."""
    if jax.process_index() != 0 or not self.directory.is_dir():
      return False
    unfinished = [p for p in self.directory.iterdir() if _TMP_MARK in p.name]
    for path in unfinished:
      path.rmtree(missing_ok=True)
    return bool(unfinished)

  def restore_latest(
    self, abstract_state: Any, stop_requested: Callable[[], bool] = lambda: False
  ) -> tuple[int, Any, Any] | None:
    """(step, state, data_state) of the newest step that restores, or None without any step.

    A step with evidence that it is broken is moved aside once an older step restores, with a
    warning; every process acts on the gravest verdict of all. `stop_requested()` True (a stop
    signal) cuts the waits between retries short.

    Raises:
      CheckpointRestoreError: a step failed to restore, without evidence that it is broken,
        after retries, or before one when a stop was requested (nothing moved).
      CheckpointMismatch: a step does not fit the model (nothing moved).
      RuntimeError: there are steps and none of them restores (all left in place).
    """
    steps = sorted(self.all_steps(), reverse=True)
    broken: list[tuple[int, str]] = []
    for step in steps:
      restored = self._restore_retrying(step, abstract_state, stop_requested)
      if isinstance(restored, str):  # evidence that the step is broken: try the one before
        broken.append((step, restored))
        logging.warning(
          "checkpoint step %d in %s does not restore: %s", step, self.directory, restored
        )
        continue
      for bad, why in broken:
        where = self._move_aside(bad)
        logging.warning(
          "checkpoint step %d does not restore (%s); moved aside to %s", bad, why, where
        )
      if broken:
        self._manager.reload()
        logging.warning(
          "resuming from step %d, older than the newest step %d, which does not restore: %s",
          step,
          steps[0],
          broken[0][1],
        )
      else:
        self._warn_if_newer_moved_aside(step)
      return step, *restored
    if broken:
      step, why = broken[0]
      raise RuntimeError(f"no checkpoint in {self.directory} restores; step {step}: {why}")
    return None

  def _restore_retrying(
    self, step: int, abstract_state: Any, stop_requested: Callable[[], bool]
  ) -> tuple[Any, Any] | str:
    """(state, data_state) of `step`, or the evidence that it is broken; retries a failure
    without evidence after each of restore_faults.RETRY_DELAYS_S (raises: see restore_latest)."""
    delays = restore_faults.RETRY_DELAYS_S
    doing = f"restoring checkpoint step {step} from {self.directory}"
    logging.info("checkpoint: restoring step %d from %s", step, self.directory)
    notices = storage_wait.Notices(doing)
    for attempt in range(len(delays) + 1):
      note = f" (attempt {attempt + 1} of {len(delays) + 1})"
      try:
        outcome, value = storage_wait.wait(
          functools.partial(self._attempt, step, abstract_state), notices, stop_requested, note
        )
      except storage_wait.Abandoned as e:  # on every process (the notice reaches all)
        raise restore_faults.CheckpointRestoreError(
          f"{doing}: a stop was requested while waiting on storage for {e.waited_s:.0f} s"
          f"{note}; nothing was moved. Rerun the same command to continue"
        ) from None
      agreed = distributed.largest(outcome)  # the gravest: _OK < _RETRY < _BROKEN < _MISMATCH
      if agreed == _OK:
        return value
      why = value if outcome == agreed else "another process could not restore (its log says why)"
      value = None  # a state restored here, while another process failed: not kept for the retry
      if agreed == _MISMATCH:
        raise restore_faults.CheckpointMismatch(
          f"checkpoint step {step} in {self.directory} does not fit the model: {why}; nothing "
          f"was moved (a config other than the one of the run that saved it?)"
        )
      if agreed == _BROKEN:
        return why
      failed = (
        f"{doing} failed {attempt + 1} times, without evidence that the step is broken: {why}"
      )
      if attempt == len(delays):
        raise restore_faults.CheckpointRestoreError(
          f"{failed}; nothing was moved. Rerun the same command once the cause is gone"
        )
      retry, delay = f"retry {attempt + 1} of {len(delays)}", delays[attempt]
      logging.warning("%s failed (%s); retrying in %g s (%s)", doing, why, delay, retry)
      notices.said()
      wake = time.monotonic() + delay
      while time.monotonic() < wake and not stop_requested():
        time.sleep(min(0.1, delay))
        notices.tick(f" (before {retry})")
      if stop_requested():  # on every process (the notice reaches all): no more retries
        raise restore_faults.CheckpointRestoreError(
          f"{failed}; a stop was requested before the next retry; nothing was moved"
        )
    raise AssertionError("unreachable")

  def _attempt(self, step: int, abstract_state: Any) -> tuple[int, Any]:
    """One restore of `step` on this process: (_OK, (state, data_state)), or (_BROKEN, evidence),
    (_MISMATCH, how) or (_RETRY, the cause)."""
    step_dir = self.directory / str(step)
    fits = False
    try:
      saved = self._manager.item_metadata(step)[_STATE]
      if saved is None:  # Orbax's answer for a missing metadata file
        metadata = step_dir / _STATE / restore_faults.METADATA_FILE
        if not metadata.exists():
          return self._failed(_BROKEN, f"its metadata file {metadata} is missing")
        return self._failed(_RETRY, f"its metadata file {metadata} could not be read")
      why = restore_faults.mismatch(saved, abstract_state)
      if why:
        return self._failed(_MISMATCH, why)
      fits = True
      return _OK, self.restore(step, abstract_state)
    except Exception as e:  # noqa: BLE001 - classified: evidence, or retried
      why = restore_faults.evidence(e, step_dir, metadata_fits=fits)
      if why:
        return self._failed(_BROKEN, why)
      return self._failed(_RETRY, f"{type(e).__name__}: {_first_line(e)}")

  def _failed(self, outcome: int, why: str) -> tuple[int, str]:
    """(outcome, why) of a restore that did not reach the barrier Orbax's restore ends with, once
    this process has passed it: on several processes the others may wait in it."""
    if jax.process_count() > 1:
      # The key's prefix as Orbax's checkpointer makes it: None if synchronous, else ''.
      prefix = getattr(
        self._manager._checkpointer,  # noqa: SLF001 - the barrier is Orbax's own
        "_barrier_sync_key_prefix",
        "" if self._asynchronous else None,
      )
      ocp.multihost.sync_global_processes(
        ocp.multihost.unique_barrier_key(_ORBAX_RESTORE_BARRIER, prefix=prefix)
      )
    return outcome, why

  def _warn_if_newer_moved_aside(self, step: int) -> None:
    moved = self.workdir / BROKEN_DIR
    if not moved.is_dir():
      return
    names = (re.match(r"\d+", p.name) for p in moved.iterdir())  # "25" or "25-<time>"
    newer = sorted({int(m[0]) for m in names if m and int(m[0]) > step})
    if newer:
      logging.warning(
        "resuming from step %d; %s holds newer step(s) %s, moved aside by an earlier run (they "
        "did not restore)",
        step,
        moved,
        ", ".join(map(str, newer)),
      )

  def _move_aside(self, step: int) -> epath.Path:
    """Moves step `step` to `<workdir>/broken_checkpoints/` (process 0); where to."""
    target = self.workdir / BROKEN_DIR / str(step)
    if target.exists():
      target = target.parent / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
    if jax.process_index() == 0:
      target.parent.mkdir(parents=True, exist_ok=True)
      (self.directory / str(step)).rename(target)
    distributed.on_every_process(True)  # a barrier: no process lists the steps before the move
    return target

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, Any]:
    """Restores (state, data_state) of `step` onto `abstract_state`'s shapes and shardings."""
    items = {_STATE: ocp.args.StandardRestore(abstract_state), _DATA: ocp.args.JsonRestore()}
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    logging.info("checkpoint: restored step %d from %s", step, self.directory)
    return restored[_STATE], restored[_DATA]

  def wait(self) -> None:
    """Blocks until the save in flight is complete (CheckpointSaveError if it failed)."""
    step = "" if self._writing is None else f" step {self._writing}"
    notices = storage_wait.Notices(f"saving checkpoint{step} to {self.directory}")
    try:
      storage_wait.wait(self._manager.wait_until_finished, notices)
    except Exception as e:
      self._save_failed(e, self._writing if self._writing is not None else -1)
    self._writing = None

  def close(self) -> None:
    self._manager.close()


class _ArrayHandler(ocp.type_handlers.ArrayHandler):
  """Orbax's handler of jax.Array, its reads retrying a GCS request RESTORE_REQUEST_RETRIES."""

  async def metadata(self, infos):
    return await super().metadata(_bounded(infos))

  async def deserialize(self, infos, args=None):
    return await super().deserialize(_bounded(infos), args)


def _bounded(infos: Any) -> list[Any]:
  """Copies of Orbax's ParamInfos whose TensorStore context sets RESTORE_REQUEST_RETRIES."""
  bounded = []
  for info in infos:
    info = copy.copy(info)
    retries = {"gcs_request_retries": RESTORE_REQUEST_RETRIES}
    info.ts_context = ts.Context(retries, parent=info.ts_context or ts.Context())
    bounded.append(info)
  return bounded


@functools.cache
def _register_array_handler() -> None:
  """Registers Orbax's handler of jax.Array with MIN_REPLICA_SLICE_BYTES and bounded restore
  retries for every save and restore of this process (the files written are the same)."""
  from orbax.checkpoint._src.metadata import array_metadata_store  # as Orbax's default has

  ocp.type_handlers.register_type_handler(
    jax.Array,
    _ArrayHandler(
      min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES,
      array_metadata_store=array_metadata_store.Store(),
    ),
    override=True,
  )


def _first_line(error: BaseException) -> str:
  """The most telling line of `error`'s chain: the innermost cause that names a file, else its
  own first line (TensorStore's outer message only repeats an array index)."""
  for e in reversed(restore_faults.chain(error)):
    for line in str(e).splitlines():
      if re.search(r"(file|database) ", line) and os.sep in line:
        return restore_faults.one_line(line)
  return restore_faults.one_line(str(error)) or type(error).__name__


def out_of_space(error: BaseException) -> bool:
  """Whether `error` or one of its causes is a full disk (ENOSPC, also as TensorStore says it)."""
  return any(
    (isinstance(e, OSError) and e.errno == errno.ENOSPC)
    or "No space left on device" in str(e)
    or "os_error_code='28'" in str(e)
    for e in restore_faults.chain(error)
  )


def _free_bytes(path: epath.Path) -> int | None:
  try:
    return shutil.disk_usage(os.fspath(path)).free
  except (OSError, TypeError, ValueError):  # an object store
    return None


def _megabytes(n: int | None) -> str:
  return "an unknown amount" if n is None else f"{n / 2**20:,.1f} MiB"


def abstract_tree(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs of `tree` (arrays or shapes) placed with `shardings`."""
  return jax.tree_util.tree_map(
    lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings
  )


def _absolute(path: str | os.PathLike) -> epath.Path:
  """`path` with a local path made absolute (Orbax refuses relative ones)."""
  text = os.fspath(path)
  return epath.Path(text if "://" in text else os.path.abspath(text))


def _state_dir(path: epath.Path) -> epath.Path:
  """The `state` item of a workdir, a checkpoints directory or one step directory."""
  if not path.exists():
    raise FileNotFoundError(f"{path}: no such file or directory")
  if not path.is_dir():
    raise ValueError(f"{path}: not an Orbax checkpoint (checkpoint.load reads weights files)")
  if (path / _STATE).is_dir():
    return path / _STATE
  if (path / CHECKPOINT_DIR).is_dir():
    path = path / CHECKPOINT_DIR
  steps = committed_steps(path)
  if not steps:
    raise FileNotFoundError(f"no committed Orbax checkpoint under {path}")
  return path / str(max(steps)) / _STATE


def committed_steps(path: str | os.PathLike) -> list[int]:
  """Steps under `path` (a workdir or its `checkpoints/`) that Orbax has committed (renamed from
  its temporary directory, or with the commit marker on object stores), by Orbax's discovery."""
  path = _absolute(path)
  if (path / CHECKPOINT_DIR).is_dir():
    path = path / CHECKPOINT_DIR
  if not path.is_dir():
    return []
  found = ocp.step.standard_name_format().find_all(path)
  return sorted(m.step for m in found if (m.path / _STATE).is_dir())


def restore_params(path: str | os.PathLike, ema: bool | None = None) -> dict[str, Any]:
  """The parameters (nested numpy arrays, on every process) of a trainer's Orbax checkpoint: a
  workdir or its `checkpoints/` (the latest step), or one step directory.

  `ema`: with Polyak averaging (`config.ema_decay`), the average (None or True: what the
  evaluators reported) or the raw parameters (False); True without an average: ValueError.
  """
  state_dir = _state_dir(_absolute(path))
  checkpointer = ocp.PyTreeCheckpointer()
  metadata = checkpointer.metadata(state_dir)
  tree = metadata.item_metadata.tree if hasattr(metadata, "item_metadata") else metadata.tree
  if ema and "ema" not in tree:
    raise ValueError(f"restore_params(ema=True): {state_dir} holds no parameter average")
  key = "ema" if "ema" in tree and ema is not False else "params"
  params_meta = tree[key]
  restore_args = jax.tree_util.tree_map(
    lambda _: ocp.RestoreArgs(restore_type=np.ndarray), params_meta
  )
  restored = checkpointer.restore(
    state_dir,
    args=ocp.args.PyTreeRestore(
      item={key: params_meta},
      restore_args={key: restore_args},
      partial_restore=True,
    ),
  )
  logging.info("restore_params: read %s of %s", key, state_dir)
  return jax.tree_util.tree_map(np.asarray, restored[key])
