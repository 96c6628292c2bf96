"""Saving and restoring the trainer's state, in both tiers: `Saver`.

The workdir's checkpoints (vit_jax.checkpoint.state.train_state) are saved at `checkpoint.every_steps`,
at the last step and when the run is told to stop (a signal, a preemption notice); the local tier
(vit_jax.checkpoint.state.local_tier), where configured, at its own steps between them. A run resumes
from the newer complete step of the two. Before any save the metrics window's first non-finite
step is read: a bad step ends the run (FloatingPointError naming it) and is never saved. Each
save carries every host's data-iterator position (vit_jax.input_pipeline.host_states), so the
rerun reads on from there.
"""

from collections.abc import Callable
from typing import Any

import jax
import ml_collections
from absl import logging

from vit_jax.checkpoint.state import local_tier, train_state
from vit_jax.input_pipeline import host_states
from vit_jax.runtime import goodput, stopping
from vit_jax.train import model_init


class Saver:
  """The trainer's two checkpoint tiers, the goodput account's checkpoint phases, and the
  stop-then-save of a signal or a preemption notice."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    workdir: str,
    mesh: jax.sharding.Mesh,
    account: goodput.Account,
    stop: stopping.StopOnSignal,
  ):
    self.checkpointer = train_state.Checkpointer(
      workdir,
      every_steps=config.checkpoint.every_steps,
      keep=config.checkpoint.keep,
      asynchronous=config.checkpoint.asynchronous,
    )
    self.local = local_tier.LocalTier(config.checkpoint.local, workdir, mesh, config)
    self.account, self.stop = account, stop
    self.total_steps = int(config.total_steps)
    self.log_every_steps = int(config.log_every_steps)
    # Where the state the run started from is saved (None: initialised), for a stop before step 1.
    self.saved_in: str | None = None

  def restore(self, config: ml_collections.ConfigDict, built: Any) -> tuple[Any, Any, int]:
    """The state to start from, its data state (None: the stream's start) and its step: the
    latest complete checkpoint of either tier, else step 0 (from `config.model_init` if set).
    A signal during the restore or the initialisation ends the run here (nothing new to save)."""
    self.account.enter("restore")
    abstract_state = train_state.abstract_tree(built.abstract_state, built.state_shardings)
    restored, resume = local_tier.restore_latest(
      self.checkpointer, self.local, abstract_state, stop_requested=self.stop.requested
    )
    data_state = None
    if restored is not None:
      _, state, data_state = restored
    else:
      state = model_init.initial_state(config, built)
    start_step = int(jax.device_get(state["step"]))
    self.account.resumed(start_step, resume.source, resume.newest_committed)
    self.account.enter("startup")
    if resume.source == "local":
      self.saved_in = str(self.local.root)
    elif resume.source == "persistent":
      self.saved_in = str(self.checkpointer.directory)
    if self.stop.poll():
      close(True, self.checkpointer.close, self.local.close)
      raise self.stop.stopped(start_step, self.total_steps, self.saved_in)
    return state, data_state, start_step

  def check_finite(self, window: dict[str, jax.Array]) -> None:
    """Raises FloatingPointError where the window recorded a non-finite loss or gradient norm."""
    bad = int(jax.device_get(window["first_bad"]))
    if bad >= 0:
      raise FloatingPointError(
        f"non-finite loss (NaN or inf) at step {bad}; stopping. The last good checkpoint "
        f"(step {self.checkpointer.latest_step()}) in {self.checkpointer.directory} is intact."
      )

  def after_step(self, step: int, state, window, data) -> None:
    """Saves `step` where a tier is due (the workdir's at its steps, at the last one and when
    the run is told to stop, else the local tier at its own), in the account's checkpoint
    phase; then raises stopping.Stopped where a signal or a preemption notice came."""
    stopped = self.stop.reached(step)
    preempted = self.checkpointer.reached_preemption(step)
    force = step == self.total_steps or stopped or preempted
    tier = self.checkpointer if force or self.checkpointer.should_save(step) else self.local
    if tier is self.checkpointer or self.local.due(step, step % self.log_every_steps == 0):
      self.check_finite(window)
      data_state = host_states.gather(data.get_state())
      with self.account.phase("checkpoint", pending=window):
        if tier.save(step, state, data_state, force=force):
          self.account.saved(step)
    if (stopped or preempted) and step < self.total_steps:
      self.account.enter("checkpoint")
      self.checkpointer.wait()
      reason = self.stop.signal_name if stopped else "a preemption notice"
      raise stopping.Stopped(
        reason, self.stop.exit_status or 143, step, self.total_steps, str(self.directory)
      )

  def save_abandoned(self, step: int, state, window, data) -> None:
    """An evaluation at `step` abandoned by a signal: `step` saved in the workdir, unless it
    was just now."""
    if not (step == self.total_steps or self.checkpointer.should_save(step)):
      self.check_finite(window)
      data_state = host_states.gather(data.get_state())
      with self.account.phase("checkpoint"):
        self.checkpointer.save(step, state, data_state, force=True)

  def stopped(self, step: int) -> stopping.Stopped:
    """What a signal inside an evaluation ends the run with, once the saves it started finished."""
    self.account.enter("checkpoint")
    self.checkpointer.wait()
    return self.stop.stopped(step, self.total_steps, str(self.directory))

  def no_space(self, error: Exception, step: int) -> Exception | None:
    """What the run reports for `error` where it is a full disk met by anything writing to the
    workdir (the metrics writer first, say): the checkpointer's words; else None."""
    if train_state.out_of_space(error) and not isinstance(error, train_state.CheckpointSaveError):
      return self.checkpointer.no_space(f"writing to it after step {step}")
    return None

  @property
  def directory(self) -> Any:
    return self.checkpointer.directory

  def closers(self) -> tuple[Callable[[], Any], ...]:
    """What completes the saves started (the last good checkpoint stays whole) and closes both
    tiers."""
    return (self.checkpointer.wait, self.checkpointer.close, self.local.wait, self.local.close)


def close(failed: bool, *closers: Callable[[], Any]) -> None:
  """Calls every closer; their errors are raised after a success, logged after a failure (the
  error that ended the run is the one to report)."""
  errors = []
  for closer in closers:
    try:
      closer()
    except Exception as e:  # noqa: BLE001 - see the docstring
      errors.append(e)
      logging.error("while closing: %s", e, exc_info=e, extra={"terminal": False})
  if errors and not failed:
    raise errors[0]
