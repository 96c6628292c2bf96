"""The trainer's procedure: `run(config, workdir)` (see vit_jax.train for what it guarantees)."""

import dataclasses
from typing import Any

import jax
import ml_collections
from absl import logging

from vit_jax import evaluators, input_pipeline, sharding
from vit_jax.checkpoint.state import train_state
from vit_jax.cost import compiled_stats, flops
from vit_jax.input_pipeline import host_states
from vit_jax.runtime import goodput, logging_util, profiling, stopping
from vit_jax.runtime import workdir as workdir_lib
from vit_jax.train import ema, model_init
from vit_jax.train import saver as saver_lib
from vit_jax.train import step as step_lib


def run(
  config: ml_collections.ConfigDict, workdir: str, devices: list[jax.Device] | None = None
) -> dict[str, float]:
  """Trains `config` (stage 'pretrain', 'finetune', 'segment' or 'detect') in `workdir`; returns
  the last metrics.

  Args:
    config: a stage config (configs/pretrain.py, finetune.py, segment.py, detect.py).
    workdir: checkpoints, `config.json` and TensorBoard files; a run resumes from it.
    devices: the devices of the mesh (default: all of them).
  """
  with goodput.Account(workdir) as account, stopping.StopOnSignal() as stop:
    return _run(config, workdir, devices, stop, account)


def itstime(step: int, every: int | None, total_steps: int) -> bool:
  """Whether something done every `every` steps (never: 0 or None) and after the last is due
  at `step`."""
  return bool(every and step % every == 0) or step == total_steps


def _run(config, workdir, devices, stop, account: goodput.Account) -> dict[str, float]:
  """Setup (config, mesh, step, state, writer, evaluators, data at the restored position), then
  the loop: a step; at log steps the window's means; the saves due; the evaluations due."""
  config = _checked(config, workdir)
  mesh = sharding.make_mesh(config.mesh, devices)
  logging.info("mesh %s over %d processes", dict(mesh.shape), jax.process_count())
  total_steps = int(config.total_steps)
  num_classes = int(input_pipeline.get_dataset_info(config.dataset).num_classes)
  built = step_lib.build(config, mesh, num_classes)
  teacher = _teacher(built)
  saver = saver_lib.Saver(config, workdir, mesh, account, stop)
  state, data_state, start_step = saver.restore(config, built)
  writer = _start_writing(workdir, config, state)
  evals = _evaluators(config, built, mesh, stop)
  data = input_pipeline.make_train_iterator(
    config.dataset,
    global_batch_size=int(config.batch_size),
    mesh=mesh,
    data_axes=sharding.BATCH_AXES,
    seed=config.seed,
    state=host_states.local(data_state),
  )
  profiler = profiling.Profiler(config.profile, workdir, account, total_steps)
  progress = logging_util.Progress(total_steps, start_step)
  out = _Reporting(account, saver, progress, writer, data, total_steps)
  window = _empty_window(mesh)
  compiled, metrics = None, {}
  step, failed = start_step, True
  try:
    if start_step >= total_steps and evals:  # finished earlier: its final metrics again
      metrics = dict(step=float(start_step))
      for evaluator in evals:
        with account.phase("eval"):
          metrics.update(evaluator.run(ema.evaluated(state)))
    for step in range(start_step + 1, total_steps + 1):
      profiler.step(step, state)
      with jax.profiler.StepTraceAnnotation("train", step_num=step):
        account.enter("data_wait")
        batch = step_lib.select(next(data))
        if compiled is None:
          compiled = out.compile(built, state, batch, window, teacher, step - 1)
        account.enter("step")
        state, window, learning_rate = compiled(state, batch, window, *teacher)
      if itstime(step, config.log_every_steps, total_steps):
        metrics = out.log(step, window, learning_rate)
        window = _empty_window(mesh)
        profiler.poll(step)
      saver.after_step(step, state, window, data)
      for evaluator in evals:
        if itstime(step, evaluator.every_steps, total_steps):
          metrics.update(out.evaluate(evaluator, step, state, window))
    failed = False
  except stopping.StopRequested:  # a signal inside an evaluation
    raise saver.stopped(step) from None
  except Exception as e:
    full = saver.no_space(e, step)
    if full is None:
      raise
    raise full from e
  finally:  # a failed run still completes the saves it started
    account.enter("checkpoint")
    closers = (*saver.closers(), data.close, writer.close)
    saver_lib.close(failed, lambda: profiler.close(state), *closers)
  return metrics


# The stages that start from a pretrained checkpoint, by what they do.
_STARTS_FROM_CHECKPOINT = {
  "finetune": "fine-tuning",
  "segment": "segmentation",
  "detect": "detection",
}


def _checked(config: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
  """`config` as it trains: refused in one line where a stage that starts from a checkpoint has
  none, with the initialising checkpoint's architecture where asked (`model_from_init`), and
  checked against the config the workdir's checkpoints were made with."""
  if config.stage in _STARTS_FROM_CHECKPOINT and not (
    config.model_init or config.init_from_scratch
  ):
    raise ValueError(
      f"{_STARTS_FROM_CHECKPOINT[config.stage]} without "
      "config.model_init (the pretrained checkpoint) would train from random initialisation; "
      "set --config.model_init=<workdir or .npz>, or --config.init_from_scratch=true to do "
      "that on purpose"
    )
  if config.model_from_init and config.model_init:
    config = model_init.with_init_architecture(config)
  if train_state.committed_steps(workdir):
    workdir_lib.check_config(workdir, config)
  return config


def _teacher(built: step_lib.Setup) -> tuple[Any, ...]:
  """Distillation: the teacher's parameters on the mesh, the step's extra argument (reloaded
  with every run, never saved); () without a teacher."""
  if built.teacher_shardings is None:
    return ()
  return (model_init.to_global(built.objective.teacher.params, built.teacher_shardings),)


def _start_writing(workdir: str, config: ml_collections.ConfigDict, state) -> Any:
  """The metrics writer; the parameter overview logged, and on process 0 the stage config
  saved beside the checkpoints (the linear probe and predict read the architecture and
  preprocessing from it) and written as hyperparameters."""
  logging_util.log_parameter_overview(state["params"])
  writer = logging_util.create_writer(workdir)
  if jax.process_index() == 0:
    workdir_lib.save_config(workdir, config)
    writer.write_hparams(logging_util.flat_hparams(config))
  return writer


def _evaluators(config, built: step_lib.Setup, mesh, stop) -> list[Any]:
  return evaluators.build(
    config.evals,
    model=built.model,
    dataset=config.dataset,
    batch_size=config.eval_batch_size,
    mesh=mesh,
    data_axes=sharding.BATCH_AXES,
    # A signal ends an evaluation between two batches (vit_jax.runtime.stopping).
    make_data=stop.checked_data(evaluators.input_pipeline_data(mesh, sharding.BATCH_AXES)),
  )


def _empty_window(mesh: jax.sharding.Mesh) -> step_lib.Window:
  """A fresh metrics window, replicated on `mesh`."""
  return jax.device_put(step_lib.empty_window(), sharding.replicated(mesh))


@dataclasses.dataclass
class _Reporting:
  """What the loop's log steps, evaluations and first compile share: the goodput account, the
  saver, the terminal's progress, the writer, the training data and the throughput meter."""

  account: goodput.Account
  saver: saver_lib.Saver
  progress: logging_util.Progress
  writer: Any
  data: Any
  total_steps: int
  throughput: Any = None  # from the first compile on

  def compile(self, built: step_lib.Setup, state, batch, window, teacher, step: int):
    """The step compiled ahead of time, once (XLA's cost analysis gives the FLOPs for the MFU);
    its memory, FLOPs and collectives logged. A signal during the data's warm-up or the compile
    ends the run here: nothing new to save."""
    self.account.enter("compile")
    compiled = built.jit_step(batch).lower(state, batch, window, *teacher).compile()
    self.throughput = _report_compiled(compiled, state, built, batch, self.account)
    self.throughput(step)
    if self.saver.stop.poll():
      raise self.saver.stop.stopped(step, self.total_steps, self.saver.saved_in)
    return compiled

  def log(self, step: int, window, learning_rate) -> dict[str, float]:
    """The window's means, the learning rate, images/s and MFU, and the goodput shares at
    `step`: written, shown, and returned (without the shares)."""
    self.saver.check_finite(window)
    metrics = step_lib.window_metrics(window)
    metrics["learning_rate"] = float(learning_rate)
    metrics.update(self.throughput(step))
    metrics["skipped_examples_this_host"] = float(self.data.num_skipped)
    shares = self.account.scalars(step)
    self.writer.write_scalars(step, {**metrics, **shares})  # a copy: the writer is asynchronous
    self.progress.step(step, {**metrics, **shares})
    return dict(metrics, step=float(step))

  def evaluate(self, evaluator, step: int, state, window) -> dict[str, float]:
    """`evaluator` on the evaluated weights at `step`, in the account's eval phase; a signal
    abandons it (between two batches), `step` saved."""
    start = self.account.spent()["eval"]
    try:
      with self.account.phase("eval", pending=window):
        results = evaluator.run(ema.evaluated(state))
    except stopping.StopRequested:
      self.saver.save_abandoned(step, state, window, self.data)
      raise
    seconds = self.account.spent()["eval"] - start
    self.progress.evaluation(step, evaluator.name, results, seconds)
    self.writer.write_scalars(step, results)
    return results


def _report_compiled(compiled, state, built: step_lib.Setup, batch, account):
  """Logs the compiled step's memory, FLOPs and collectives per device, as the planner prints
  them (vit_jax.tools.plan), and returns the meter of the MFU then achieved: model FLOPs (3 ×
  forward, no recomputation) per device per step against the device's peak."""
  stats = compiled_stats.step_stats(compiled, state, built.state_shardings, batch)
  compiled_stats.log_step_stats(stats)
  batch_size, height, width = batch["image"].shape[:3]
  per_example = flops.model_flops_per_example(built.model, (height, width))
  flops_per_step = per_example * batch_size / built.mesh.devices.size
  return logging_util.Throughput(account, batch_size, flops_per_step)
