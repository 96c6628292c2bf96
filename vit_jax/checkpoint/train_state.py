"""Training checkpoints in the workdir (Orbax), and `restore_params` for any checkpoint path.

Layout: `<workdir>/checkpoints/<step>/state` holds the train state pytree (params, opt_state,
step, rng, and ema with Polyak averaging) written by every process (each writes its own shards), and `<step>/data` the input
iterator's state as JSON (written by process 0; the iterator state is the same on every process).
Orbax writes a step to a temporary directory and renames it when complete, so a run killed at
any moment leaves only complete steps behind; `latest_step` ignores the rest.

Restoring takes an abstract state (`jax.ShapeDtypeStruct`s carrying the target shardings), so
a checkpoint written on one mesh restores onto any other.

This file must not import TensorFlow (`.npz` paths with a scheme go through vit_jax.checkpoint).
"""

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from vit_jax.checkpoint import npz

_STATE, _DATA = "state", "data"
CHECKPOINT_DIR = "checkpoints"


class Checkpointer:
  """Orbax CheckpointManager for train state + data iterator state.

  Every process must call `save`, `restore`, `wait` and `close` (they synchronise).
  """

  def __init__(self, workdir: str, every_steps: int, keep: int, asynchronous: bool = True):
    """Args: workdir; save every `every_steps` steps (and when forced); keep the latest `keep`."""
    options = ocp.CheckpointManagerOptions(
      save_interval_steps=max(int(every_steps), 1),
      max_to_keep=int(keep) if keep else None,
      enable_async_checkpointing=asynchronous,
      create=True,
      cleanup_tmp_directories=True,
    )
    self.every_steps = max(int(every_steps), 1)
    self.directory = epath.Path(workdir) / CHECKPOINT_DIR
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=options,
      item_names=(_STATE, _DATA),
      item_handlers={
        _STATE: ocp.StandardCheckpointHandler(),
        _DATA: ocp.JsonCheckpointHandler(),
      },
    )

  def latest_step(self) -> int | None:
    """The latest complete checkpoint's step, or None."""
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
    """Starts writing `state` (a pytree of global arrays) and `data_state` (JSON) at `step`."""
    saved = self._manager.save(
      step,
      args=ocp.args.Composite(
        **{_STATE: ocp.args.StandardSave(state), _DATA: ocp.args.JsonSave(data_state)}
      ),
      force=force,
    )
    if saved:
      logging.info("checkpoint: saving step %d to %s", step, self.directory)
    return saved

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, Any]:
    """Restores (state, data_state) of `step` onto `abstract_state`'s shapes and shardings."""
    restored = self._manager.restore(
      step,
      args=ocp.args.Composite(
        **{_STATE: ocp.args.StandardRestore(abstract_state), _DATA: ocp.args.JsonRestore()}
      ),
    )
    logging.info("checkpoint: restored step %d from %s", step, self.directory)
    return restored[_STATE], restored[_DATA]

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are complete."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


def abstract_tree(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs of `tree` (arrays or shapes) placed with `shardings`."""
  return jax.tree_util.tree_map(
    lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings
  )


def _state_dir(path: epath.Path) -> epath.Path:
  """Finds the `state` item of a workdir, a checkpoints directory or one step directory."""
  if (path / _STATE).is_dir():
    return path / _STATE
  if (path / CHECKPOINT_DIR).is_dir():
    path = path / CHECKPOINT_DIR
  steps = committed_steps(path)
  if not steps:
    raise FileNotFoundError(f"no committed Orbax checkpoint under {path}")
  return path / str(max(steps)) / _STATE


def committed_steps(path: str | os.PathLike) -> list[int]:
  """Steps under `path` (a workdir or its `checkpoints/`) that Orbax has committed.

  Orbax's own discovery, the one CheckpointManager resumes from: a step counts once it was
  renamed from its temporary directory (or, on object stores, carries the commit marker), so a
  half-written step is never read.
  """
  path = epath.Path(path)
  if (path / CHECKPOINT_DIR).is_dir():
    path = path / CHECKPOINT_DIR
  if not path.is_dir():
    return []
  found = ocp.step.standard_name_format().find_all(path)
  return sorted(m.step for m in found if (m.path / _STATE).is_dir())


def restore_params(path: str | os.PathLike, ema: bool | None = None) -> dict[str, Any]:
  """Reads parameters from any checkpoint a stage may start from.

  Args:
    path: a `.npz` (vit_jax or big_vision layout, local or `gs://`) or a timm / Hugging Face
      `.safetensors` (see vit_jax.checkpoint.load),
      or an Orbax checkpoint written by the trainer: a workdir (its latest step), its
      `checkpoints/` directory (latest step) or one step directory `checkpoints/<step>`.
    ema: of an Orbax checkpoint trained with Polyak averaging (`config.ema_decay`), the
      averaged parameters (None or True: the ones its evaluators reported) or the raw ones
      (False). True for a checkpoint without an average raises ValueError.

  Returns:
    Nested dict of numpy arrays (host memory, on every process), in the module layout of
    vit_jax.models.vit. Only the parameters are read, not the optimizer state.
  """
  if npz.is_params_file(path):
    return npz.load(path)
  state_dir = _state_dir(epath.Path(path))
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
