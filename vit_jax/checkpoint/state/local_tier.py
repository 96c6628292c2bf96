"""A fast local checkpoint tier: frequent saves of each process's own shards to its own disk.

`config.checkpoint.local` saves every N steps or minutes under
`<local.dir>/process_<i>/steps/<step>`, each process only the shards of its own devices and the
data position, without waiting for the others; `restore_latest` takes the newest step complete
on every process in either tier. A tier belongs to one workdir and one topology (the token of
`<workdir>/local_tier.json`, repeated in each process's `tier.json`); another's is emptied. A
failed local save turns the tier off for the run. docs/training.md ("A local checkpoint tier")
has the whole behaviour.

This file must not import TensorFlow.
"""

import dataclasses
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from orbax.checkpoint._src.serialization import type_handler_registry

from vit_jax.checkpoint.state import train_state
from vit_jax.runtime import distributed, json_file
from vit_jax.runtime import workdir as workdir_lib

TOKEN_FILE = "local_tier.json"  # in the workdir
_TIER_FILE = "tier.json"  # in each process's local directory
_STATE, _DATA = "state", "data"
_MAX_STEPS = 64  # local steps a process reports to the others (keep is far below)


@dataclasses.dataclass(frozen=True)
class Resume:
  """Where a run continues from: `step` (0: initialised), its tier ('local', 'persistent' or
  None) and the newest step any process had committed in either tier."""

  step: int
  source: str | None
  newest_committed: int | None


class LocalTier:
  """The local tier of one process (every method is called on every process)."""

  def __init__(
    self,
    local: ml_collections.ConfigDict,
    workdir: str,
    mesh: jax.sharding.Mesh,
    config: ml_collections.ConfigDict | None = None,
  ):
    """`local`: `config.checkpoint.local` (dir '' turns the tier off); `config`: the stage
    config, compared with the workdir's before local steps are used."""
    self.enabled = bool(local.dir)
    self.committed: int | None = None  # see restore_newest
    if not self.enabled:
      return
    if int(local.every_steps) <= 0 and float(local.every_minutes) <= 0:
      raise ValueError(
        f"checkpoint.local.dir={local.dir!r} saves nothing: set checkpoint.local.every_steps or "
        "checkpoint.local.every_minutes above 0"
      )
    if "://" in str(local.dir):
      raise ValueError(
        f"checkpoint.local.dir={local.dir!r} must be a local path (disk or /dev/shm)"
      )
    self._every_steps = max(int(local.every_steps), 0)
    self._every_s = max(float(local.every_minutes), 0.0) * 60
    self._last_save = time.monotonic()
    self.root = epath.Path(os.path.abspath(local.dir)) / f"process_{jax.process_index()}"
    token = _workdir_token(workdir)
    identity = dict(workdir=str(workdir), token=token, topology=_topology(mesh))
    try:
      self._claim(identity)
      self._manager = _manager(self.root / "steps", int(local.keep))
    except OSError as e:  # the setting's directory, not the run: say which setting
      raise ValueError(
        f"checkpoint.local.dir={local.dir!r}: cannot use {self.root}: {e.strerror or e}; set "
        "it to a writable local directory, or to '' to turn the local tier off"
      ) from e
    if self._manager.all_steps() and config is not None:
      workdir_lib.check_config(workdir, config)  # local steps are of this workdir's config

  def _claim(self, identity: dict[str, str]) -> None:
    """Makes this process's directory the tier of `identity`, emptying one of another (or with
    an unreadable `tier.json`)."""
    tier_file = self.root / _TIER_FILE
    try:
      seen = json_file.read(tier_file, {"*": str})
    except json_file.InvalidFile as e:
      why = f"has a {_TIER_FILE} that is not one ({e.why})"
    else:
      mine = seen in (None, identity)
      why = None if mine else f"was written for another workdir, run or topology ({seen})"
    if why:
      logging.warning("local checkpoint tier %s %s; emptying it", self.root, why)
      self.root.rmtree(missing_ok=True)
    self.root.mkdir(parents=True, exist_ok=True)
    workdir_lib.write_json(tier_file, identity)

  def steps(self) -> list[int]:  # this process's complete local steps
    return sorted(self._manager.all_steps()) if self.enabled else []

  def due(self, step: int, at_log_step: bool) -> bool:
    """Whether to save `step` locally: every `every_steps` steps, or at the first log step
    `every_minutes` after the last local save (by process 0's clock, so every process agrees)."""
    if not self.enabled:
      return False
    if self._every_steps and step % self._every_steps == 0:
      return True
    if not (self._every_s and at_log_step):
      return False
    return bool(distributed.of_process_0(time.monotonic() - self._last_save >= self._every_s))

  def save(self, step: int, state: Any, data_state: Any, force: bool = False) -> bool:
    """Starts writing this process's shards of `state` and `data_state` at `step`; whether it
    did (False once a save failed). `force`: the Checkpointer's signature; always saved."""
    del force
    if not self.enabled:
      return False
    self._last_save = time.monotonic()
    items = {_STATE: ocp.args.PyTreeSave(state), _DATA: ocp.args.JsonSave(data_state)}
    try:
      saved = self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    except Exception as e:  # noqa: BLE001 - the persistent tier still holds the run
      self._failed(e, step)
      return False
    if saved:
      logging.info("checkpoint: saving step %d to the local tier %s", step, self.root)
    return saved

  def _failed(self, error: BaseException, step: int) -> None:
    logging.warning(
      "local checkpoint tier %s: saving step %d (or the save before it) failed: %s; the local "
      "tier is off for the rest of this run, the workdir's checkpoints go on",
      self.root,
      step,
      train_state._first_line(error),
    )
    self.enabled = False

  def restore_newest(self, at_least: int | None, abstract_state: Any) -> tuple | None:
    """(step, state, data_state) of the newest local step that every process holds, if it is
    not older than `at_least` and restores on every process; else None. Sets `committed`: the
    newest step every process with a local step holds (what a rerun that loses it trains again).
    """
    if not self.enabled:  # the config's choice: the same on every process
      return None
    held = np.full(_MAX_STEPS, -1, np.int64)
    mine = self.steps()[-_MAX_STEPS:]
    held[: len(mine)] = mine
    every = [set(row[row >= 0].tolist()) for row in distributed.gather(held)]  # per process
    common = set.intersection(*every)
    surviving = set.intersection(*[steps for steps in every if steps] or [set()])
    self.committed = max(surviving) if surviving else None
    if not common or (at_least is not None and max(common) < at_least):
      return None
    step = max(common)
    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_state)
    items = {
      _STATE: ocp.args.PyTreeRestore(item=abstract_state, restore_args=restore_args),
      _DATA: ocp.args.JsonRestore(),
    }
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
      reason = ""
    except Exception as e:  # noqa: BLE001 - the workdir's steps are used instead
      restored, reason = None, train_state._first_line(e)
    if not distributed.on_every_process(not reason):
      logging.warning(
        "local checkpoint step %d does not restore (%s); using the workdir's checkpoints",
        step,
        reason or "another process could not read its part",
      )
      return None
    logging.info("checkpoint: restored step %d from the local tier %s", step, self.root)
    return step, restored[_STATE], restored[_DATA]

  def discard_after(self, step: int) -> None:
    """Deletes this process's local steps after `step`, which the run continues from."""
    for newer in [s for s in self.steps() if s > step]:
      self._manager.delete(newer)

  def wait(self) -> None:
    """Blocks until this process's local save in flight is written (a failure: a warning)."""
    if self.enabled:
      try:
        self._manager.wait_until_finished()
      except Exception as e:  # noqa: BLE001 - see _failed
        self._failed(e, -1)

  def close(self) -> None:
    if hasattr(self, "_manager"):
      self._manager.close()


def restore_latest(
  checkpointer: train_state.Checkpointer,
  local: LocalTier,
  abstract_state: Any,
  stop_requested: Callable[[], bool] = lambda: False,
) -> tuple[tuple | None, Resume]:
  """The newest step complete on every process in either tier, restored onto `abstract_state`
  (the local tier at a tie), as `Checkpointer.restore_latest` returns it (`stop_requested`: see
  there), and where it came from. Local steps after the restored step are deleted."""
  persistent = checkpointer.all_steps()
  newest_persistent = max(persistent) if persistent else None
  restored = local.restore_newest(newest_persistent, abstract_state)
  source = "local"
  if restored is None:
    restored = checkpointer.restore_latest(abstract_state, stop_requested)
    source = "persistent"
    step = restored[0] if restored is not None else -1
    if local.committed is not None and local.committed > step:
      # The workdir's newest step did not restore, and an older one did: a newer local step?
      again = local.restore_newest(step + 1, abstract_state)
      restored, source = (again, "local") if again is not None else (restored, source)
  step = restored[0] if restored is not None else 0
  local.discard_after(step)
  newest = [s for s in (newest_persistent, local.committed) if s is not None]
  return restored, Resume(
    step=step,
    source=source if restored is not None else None,
    newest_committed=max(newest) if newest else None,
  )


def bytes_per_host(num_params: int, share: float = 1.0, ema: bool = False) -> int:
  """Bytes a local step takes on a host holding `share` of the state (1: replicated; 1/F with
  FSDP over F hosts): float32 parameters, Adam's two moments and with `ema` the average."""
  copies = 3 + int(ema)
  return int(round(4 * copies * num_params * share))


def _manager(directory: epath.Path, keep: int) -> ocp.CheckpointManager:
  """Orbax's CheckpointManager over one process's own directory: that process is the only one
  taking part (no barrier with the others) and writes every shard of its devices once."""
  processes = {jax.process_index()}
  multiprocessing = ocp.options.MultiprocessingOptions(
    primary_host=None,
    active_processes=processes,
    barrier_sync_key_prefix=f"vit_jax-local-{jax.process_index()}",
  )
  registry = type_handler_registry.create_type_handler_registry(
    (
      jax.Array,
      ocp.type_handlers.ArrayHandler(
        primary_host=None, replica_id=None, use_replica_parallel=False
      ),
    ),
  )
  directory.mkdir(parents=True, exist_ok=True)
  options = ocp.CheckpointManagerOptions(
    max_to_keep=max(keep, 1),
    create=False,
    cleanup_tmp_directories=True,
    multiprocessing_options=multiprocessing,
    enable_async_checkpointing=True,
    save_root_metadata=False,
    enable_per_process_directory_creation=True,
  )
  return ocp.CheckpointManager(
    directory,
    options=options,
    item_names=(_STATE, _DATA),
    item_handlers={
      _STATE: ocp.PyTreeCheckpointHandler(
        use_ocdbt=True,
        use_zarr3=True,
        multiprocessing_options=multiprocessing,
        type_handler_registry=registry,
      ),
      _DATA: ocp.JsonCheckpointHandler(multiprocessing_options=multiprocessing),
    },
  )


_TOKEN = {"token": json_file.checked(lambda t: 0 <= int(t, 16) < 2**62, "a token (16 hex digits)")}


def _workdir_token(workdir: str) -> str:
  """The workdir's local-tier token, read or made by process 0 (an invalid `local_tier.json` is
  set aside), the same on every process."""
  token = 0
  if jax.process_index() == 0:
    path = epath.Path(workdir) / TOKEN_FILE
    try:
      saved = json_file.read(path, _TOKEN)
    except json_file.InvalidFile as e:
      then = "a new token empties the local tiers written before (the workdir's steps remain)"
      json_file.set_aside(path, e.why, then=then)
      saved = None
    if saved is not None:
      token = int(saved["token"], 16)
    else:
      token = secrets.randbits(62)
      epath.Path(workdir).mkdir(parents=True, exist_ok=True)
      workdir_lib.write_json(path, {"token": f"{token:016x}"})
  # On several processes the token passes through jax's int32 (vit_jax.runtime.distributed): the
  # tiers written so far carry it so; an exact one would empty them once.
  return f"{distributed.of_process_0(token):016x}"


def _topology(mesh: jax.sharding.Mesh) -> str:
  """What fixes which shards a process holds."""
  axes = ",".join(f"{name}={size}" for name, size in mesh.shape.items())
  devices = ",".join(str(d.id) for d in mesh.devices.flat)
  return f"{jax.process_count()} processes, process {jax.process_index()}; {axes}; {devices}"
