"""The trainer of the pretrain, fine-tune and segment stages: `run(config, workdir)`.

One procedure, in bannered sections read top to bottom: setup, data, model and optimizer,
checkpoint, evaluators, data iterator, loop. It runs on any mesh (vit_jax.sharding), on one or many processes,
and resumes from the latest complete checkpoint in the workdir.

Determinism, which makes a resumed run bitwise equal to an uninterrupted one on the same
topology, and the same trajectory up to floating-point summation order on any other: the
examples of step s are positions s·B .. s·B + B − 1 of the run's stream (a function of the seed;
the iterator state saved with each checkpoint is that position), laid out in the global batch in
that order on any number of hosts, devices and mesh (vit_jax.input_pipeline). Every random draw
made for an example is keyed on the seed, the step and its index i in the global batch: its
augmentations in tf.data on (seed, stream position); its dropout masks and masked-patch
corruption on fold_in(layer key of fold_in(rng, s), i) (`batch['index']`, vit_jax.models.ops.
dropout), never on its row in a micro-batch, so `accum_steps` does not change them; mixup's
and cutmix's weight and box on step s's key and the partner on the index (vit_jax.mixup). The
step is part of the state. Nothing depends on wall-clock time or on how often metrics are fetched.

Metrics: each step adds its sums (loss, correct top-1, examples, gradient norm) to an on-device
window that the host reads and resets at every log step, so a logged loss or accuracy is the mean
over the window's examples, not the last step's. Training accuracy is top-1 for single-label data
and precision@1 (the top-scoring class is one of the image's labels) for multi-label data.
The model, the per-example loss and what counts as correct come from the objective of
`config.loss` (vit_jax.objectives: supervised cross-entropy, or masked patch prediction), or of
`config.distill` (DeiT's distillation: its teacher's parameters are the step's 4th argument).
Images/s and MFU count only time spent training: evaluation and checkpoint saves are excluded.

Workdir: a config that differs from the workdir's saved `config.json` in a field that may not
change on resume stops the run before anything is touched (vit_jax.runtime.workdir); `config.json` is
written, atomically, once the state is restored or initialised.

Non-finite losses: each step records on device the first step whose loss or gradient norm was
not finite; the host reads that one scalar whenever it fetches metrics and before every
checkpoint, so a bad step stops the run (FloatingPointError naming the step) and is never saved.

Stopping: SIGTERM or SIGINT (vit_jax.runtime.stopping), and on TPU VMs (with jax.distributed) a
preemption notice, make every process save the same step and raise `stopping.Stopped`; the rerun
resumes there without replaying a step. A signal is acted on after the step it arrives in,
between two evaluation batches (the evaluation is abandoned), or once the restore or the first
compile returns. A second signal stops without saving (a command exits at once;
vit_jax.runtime.stopping). Killed without notice, a run resumes from the latest complete
checkpoint and replays the same steps; a latest checkpoint with evidence of damage is moved aside
and the one before it used (vit_jax.checkpoint.train_state).
A run restarted after its last step runs its evaluators on the final state and returns their
metrics (what vit_jax.main records).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax import (
  ema,
  evaluators,
  input_pipeline,
  mixup,
  model_init,
  objectives,
  optim,
  sharding,
)
from vit_jax.checkpoint import local_tier, train_state
from vit_jax.cost import compiled_stats, flops
from vit_jax.input_pipeline import host_states
from vit_jax.runtime import goodput, logging_util, profiling, stopping
from vit_jax.runtime import workdir as workdir_lib

# step int32 [], params, opt_state, rng uint32 [2]; with config.ema_decay also ema (like params).
State = dict[str, Any]
# Sums over the steps since the last log: loss_sum, correct, examples, grad_norm_sum, steps
# (float32 []), and first_bad (int32 []): 1-based first step whose loss was not finite, or -1.
Window = dict[str, jax.Array]
_WINDOW_SUMS = ("loss_sum", "correct", "examples", "grad_norm_sum", "steps")


def empty_window() -> Window:
  """A fresh metrics window (host values; the step places it on the mesh)."""
  return {**{k: np.float32(0) for k in _WINDOW_SUMS}, "first_bad": np.int32(-1)}


def abstract_window(mesh: jax.sharding.Mesh) -> Window:
  """The window's shapes, replicated on `mesh` (for ahead-of-time compilation)."""
  replicated = sharding.replicated(mesh)
  return {
    k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype, sharding=replicated)
    for k, v in empty_window().items()
  }


def window_metrics(window: Window) -> dict[str, float]:
  """Means over a window read back from the device: loss, accuracy and gradient norm."""
  w = {k: float(v) for k, v in jax.device_get(window).items()}
  examples, steps = max(w["examples"], 1.0), max(w["steps"], 1.0)
  return dict(
    loss=w["loss_sum"] / examples,
    accuracy=w["correct"] / examples,
    grad_norm=w["grad_norm_sum"] / steps,
    examples=w["examples"],
  )


def _image_shape(config: ml_collections.ConfigDict) -> tuple[int, int]:
  size = config.dataset.image_size
  return (size, size) if isinstance(size, int) else tuple(size)


def make_train_step(
  objective: objectives.Objective,
  model: Any,
  tx: optax.GradientTransformation,
  schedule: optax.Schedule,
  accum_steps: int,
  mesh: jax.sharding.Mesh,
  ema_decay: float | None = None,
  mixup_alpha: float = 0.0,
  num_classes: int = 0,
  cutmix_alpha: float = 0.0,
):
  """Returns train_step(state, batch, window) -> (state, window, learning_rate), un-jitted.

  The loss is `objective`'s per-example loss of `model`, averaged over the examples whose mask
  is 1, computed over the whole global batch whatever `accum_steps` is: micro-batches sum
  masked losses and gradients, divided once at the end. With `mixup_alpha` or `cutmix_alpha` > 0
  the global batch is mixed first (vit_jax.mixup, labels one-hot over `num_classes`). Each
  example carries its index in the global batch (`index`), which keys its random draws with the
  step's key, the same in every micro-batch. The step adds its sums to `window` (see `Window`) and records
  there the first step with a non-finite loss or gradient norm. With `ema_decay` the state's
  `ema` is averaged towards the new parameters (vit_jax.ema). A distillation objective's
  teacher parameters are the step's 4th argument `teacher` (not part of the state: never
  differentiated, updated or saved), passed on to its `per_example`.
  """

  mixup.check_alphas(mixup_alpha, cutmix_alpha)

  def micro_step(params, micro, key, teacher):
    extra = {} if teacher is None else {"teacher_params": teacher}

    def loss_sum(p):
      per_example, correct = objective.per_example(model, p, micro, key, **extra)
      mask = micro["mask"]
      return jnp.sum(per_example * mask), jnp.sum(correct * mask)

    (total, correct), grads = jax.value_and_grad(loss_sum, has_aux=True)(params)
    # Metric sums in float32 whatever the model's dtype (a float64 model's loss would not fit
    # the float32 carry of the accumulation below); gradients keep the parameters' dtype.
    return grads, total.astype(jnp.float32), correct

  def split(x):
    # [B, ...] → [A, B/A, ...]: micro-batch i takes every A-th example, so each device keeps
    # its own rows and no data moves between devices.
    x = x.reshape((x.shape[0] // accum_steps, accum_steps) + x.shape[1:])
    x = jnp.swapaxes(x, 0, 1)
    spec = P(None, sharding.BATCH_AXES, *([None] * (x.ndim - 2)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  def train_step(state: State, batch: dict[str, jax.Array], window: Window, teacher=None):
    params, step = state["params"], state["step"]
    model_key, mixup_key = jax.random.split(jax.random.fold_in(state["rng"], step))
    batch = _select(batch)
    batch = mixup.mix_or_cut(batch, mixup_key, num_classes, mixup_alpha, cutmix_alpha)
    batch["index"] = jnp.arange(batch["mask"].shape[0], dtype=jnp.int32)
    if accum_steps == 1:
      grads, loss_sum, correct = micro_step(params, batch, model_key, teacher)
    else:
      micro_batches = jax.tree_util.tree_map(split, batch)

      def body(carry, micro):
        out = micro_step(params, micro, model_key, teacher)
        return jax.tree_util.tree_map(jnp.add, carry, out), None

      zeros = (jax.tree_util.tree_map(jnp.zeros_like, params), jnp.float32(0), jnp.float32(0))
      (grads, loss_sum, correct), _ = jax.lax.scan(body, zeros, micro_batches)
    count = jnp.sum(batch["mask"])
    denom = jnp.maximum(count, 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / denom, grads)
    loss = loss_sum / denom
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state["opt_state"], params)
    params = optax.apply_updates(params, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    first_bad = window["first_bad"]
    window = dict(
      loss_sum=window["loss_sum"] + loss_sum,
      correct=window["correct"] + correct,
      examples=window["examples"] + count,
      # float32 like the window's other sums, also for a float64 model (see micro_step).
      grad_norm_sum=window["grad_norm_sum"] + grad_norm.astype(jnp.float32),
      steps=window["steps"] + 1.0,
      first_bad=jnp.where((first_bad < 0) & ~finite, step + 1, first_bad),
    )
    new_state = dict(step=step + 1, params=params, opt_state=opt_state, rng=state["rng"])
    if ema_decay:
      new_state["ema"] = ema.update(state["ema"], params, ema_decay)
    return new_state, window, schedule(step)

  return train_step


def _check_finite(window: Window, checkpointer: train_state.Checkpointer) -> None:
  bad = int(jax.device_get(window["first_bad"]))
  if bad >= 0:
    last = checkpointer.latest_step()
    raise FloatingPointError(
      f"non-finite loss (NaN or inf) at step {bad}; stopping. The last good checkpoint "
      f"(step {last}) in {checkpointer.directory} is intact."
    )


class TrainStep(NamedTuple):
  """The train step of a config on a mesh, before any data or state value exists (see `build`)."""

  objective: objectives.Objective
  model: Any
  schedule: optax.Schedule
  tx: optax.GradientTransformation
  init_key: jax.Array  # the parameters' initialisation key
  init_params: Callable[[jax.Array], Any]  # key -> params
  init_state: Callable[[jax.Array], State]  # key -> state
  abstract_state: State  # jax.ShapeDtypeStruct leaves
  state_shardings: State  # NamedSharding leaves
  step_fn: Callable  # make_train_step's, un-jitted
  mesh: jax.sharding.Mesh
  teacher_shardings: Any = None  # distillation: the teacher's parameters' NamedShardings

  def jit_step(self, batch: dict[str, Any]) -> Callable:
    """The jitted step with the trainer's shardings, for a batch of these ranks (arrays or shapes).

    Called as step(state, batch, window) -> (state, window, learning_rate), with distillation
    step(state, batch, window, teacher_params); the state is donated.
    """
    batch_shardings = {k: sharding.batch_sharding(self.mesh, np.ndim(v)) for k, v in batch.items()}
    replicated = sharding.replicated(self.mesh)
    in_shardings = (self.state_shardings, batch_shardings, replicated)
    if self.teacher_shardings is not None:
      in_shardings += (self.teacher_shardings,)
    return jax.jit(
      self.step_fn,
      in_shardings=in_shardings,
      out_shardings=(self.state_shardings, replicated, replicated),
      donate_argnums=(0,),
    )


def build(
  config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, num_classes: int
) -> TrainStep:
  """The model, optimizer, state shapes and shardings, and step function of `config` on `mesh`.

  Nothing is allocated: the planner (vit_jax.tools.plan) compiles the same step for a TPU
  topology from this, and `run` initialises or restores the state with it.
  """
  batch_size, accum = int(config.batch_size), int(config.accum_steps)
  shards = sharding.num_batch_shards(mesh)
  if batch_size % (accum * shards):
    raise ValueError(
      f"batch_size {batch_size} must be a multiple of accum_steps ({accum}) × the batch shards "
      f"of the mesh ({shards})"
    )
  objective = objectives.get(config, num_classes, mesh)
  model = objective.model(config.model, mesh)
  height, width = _image_shape(config)
  rng = jax.random.PRNGKey(config.seed)
  init_key, dropout_key = jax.random.split(rng)

  def init_params(key):
    dummy = jnp.zeros((1, height, width, 3), jnp.float32)
    return model.init({"params": key}, dummy, train=False)["params"]

  schedule = optim.make_schedule(config.schedule, int(config.total_steps))
  tx = optim.make_optimizer(config.optimizer, schedule, config.grad_clip_norm)
  ema_decay = float(config.ema_decay) if ema.enabled(config.ema_decay) else None

  def init_state(key):
    params = init_params(key)
    state = dict(step=jnp.int32(0), params=params, opt_state=tx.init(params), rng=dropout_key)
    if ema_decay:
      state["ema"] = params
    return state

  abstract = jax.eval_shape(init_state, init_key)
  replicated = sharding.replicated(mesh)
  state_shardings = dict(
    step=replicated,
    params=sharding.tree_shardings(abstract["params"], mesh),
    opt_state=sharding.tree_shardings(abstract["opt_state"], mesh),
    rng=replicated,
  )
  if ema_decay:
    state_shardings["ema"] = state_shardings["params"]
  step_fn = make_train_step(
    objective,
    model,
    tx,
    schedule,
    int(config.accum_steps),
    mesh,
    ema_decay,
    mixup_alpha=float(config.dataset.mixup_alpha),
    num_classes=num_classes,
    cutmix_alpha=float(config.dataset.cutmix_alpha),
  )
  return TrainStep(
    objective=objective,
    model=model,
    schedule=schedule,
    tx=tx,
    init_key=init_key,
    init_params=init_params,
    init_state=init_state,
    abstract_state=abstract,
    state_shardings=state_shardings,
    step_fn=step_fn,
    mesh=mesh,
    teacher_shardings=_teacher_shardings(objective, mesh),
  )


def run(
  config: ml_collections.ConfigDict, workdir: str, devices: list[jax.Device] | None = None
) -> dict[str, float]:
  """Trains `config` (stage 'pretrain', 'finetune' or 'segment') in `workdir`; returns the last
  metrics.

  Args:
    config: a stage config (configs/pretrain.py, configs/finetune.py, configs/segment.py).
    workdir: checkpoints, `config.json` and TensorBoard files; a run resumes from it.
    devices: the devices of the mesh (default: all of them).
  """
  with goodput.Account(workdir) as account, stopping.StopOnSignal() as stop:
    return _run(config, workdir, devices, stop, account)


def _run(config, workdir, devices, stop, account: goodput.Account) -> dict[str, float]:
  # ----------------------------------------------------------------------------------------------
  # Setup.
  starts_from_checkpoint = config.stage in ("finetune", "segment")
  if starts_from_checkpoint and not config.model_init and not config.init_from_scratch:
    raise ValueError(
      f"{'fine-tuning' if config.stage == 'finetune' else 'segmentation'} without config.model_init (the pretrained checkpoint) would train from "
      "random initialisation; set --config.model_init=<workdir or .npz>, or "
      "--config.init_from_scratch=true to do that on purpose"
    )
  if config.model_from_init and config.model_init:
    config = model_init.with_init_architecture(config)
  if train_state.committed_steps(workdir):
    workdir_lib.check_config(workdir, config)
  mesh = sharding.make_mesh(config.mesh, devices)
  logging.info("mesh %s over %d processes", dict(mesh.shape), jax.process_count())
  total_steps = int(config.total_steps)
  batch_size = int(config.batch_size)

  # ----------------------------------------------------------------------------------------------
  # Data (the iterator is created last, at the position restored from the checkpoint).
  info = input_pipeline.get_dataset_info(config.dataset)
  num_classes = int(info.num_classes)

  # ----------------------------------------------------------------------------------------------
  # Model, optimizer, the state's shapes and shardings, the step function.
  built = build(config, mesh, num_classes)
  replicated = sharding.replicated(mesh)
  # Distillation: the teacher's parameters, an argument of every step (reloaded, never saved).
  teacher = ()
  if built.teacher_shardings is not None:
    teacher = (model_init.to_global(built.objective.teacher.params, built.teacher_shardings),)

  # ----------------------------------------------------------------------------------------------
  # Checkpoint: resume from the latest complete step, else initialise (from model_init if set).
  checkpointer = train_state.Checkpointer(
    workdir,
    every_steps=config.checkpoint.every_steps,
    keep=config.checkpoint.keep,
    asynchronous=config.checkpoint.asynchronous,
  )
  local = local_tier.LocalTier(config.checkpoint.local, workdir, mesh, config)
  account.enter("restore")
  abstract_state = train_state.abstract_tree(built.abstract_state, built.state_shardings)
  restored, resume = local_tier.restore_latest(
    checkpointer, local, abstract_state, stop_requested=stop.requested
  )
  data_state = None
  if restored is not None:
    _, state, data_state = restored
  else:
    state = model_init.initial_state(config, built)
  start_step = int(jax.device_get(state["step"]))
  account.resumed(start_step, resume.source, resume.newest_committed)
  account.enter("startup")
  # Where the state the run starts from is saved (None: initialised), for a stop before step 1.
  saved_in = str(local.root) if resume.source == "local" else None
  saved_in = str(checkpointer.directory) if resume.source == "persistent" else saved_in
  if stop.poll():  # a signal during the restore or initialisation: nothing new to save
    _close(True, checkpointer.close, local.close)
    raise stop.stopped(start_step, total_steps, saved_in)
  logging_util.log_parameter_overview(state["params"])
  writer = logging_util.create_writer(workdir)
  if jax.process_index() == 0:
    # The stage config travels with the checkpoints: the linear probe and predict read the
    # architecture and preprocessing from it.
    workdir_lib.save_config(workdir, config)
    writer.write_hparams(logging_util.flat_hparams(config))

  # ----------------------------------------------------------------------------------------------
  # Evaluators.
  evals = evaluators.build(
    config.evals,
    model=built.model,
    dataset=config.dataset,
    batch_size=config.eval_batch_size,
    mesh=mesh,
    data_axes=sharding.BATCH_AXES,
    # A signal ends an evaluation between two batches (vit_jax.runtime.stopping).
    make_data=stop.checked_data(evaluators.input_pipeline_data(mesh, sharding.BATCH_AXES)),
  )

  # ----------------------------------------------------------------------------------------------
  # Data iterator, at the restored position.
  train_iter = input_pipeline.make_train_iterator(
    config.dataset,
    global_batch_size=batch_size,
    mesh=mesh,
    data_axes=sharding.BATCH_AXES,
    seed=config.seed,
    state=host_states.local(data_state),
  )
  # ----------------------------------------------------------------------------------------------
  # Loop.
  profiler = profiling.Profiler(config.profile, workdir, account, total_steps)
  window = jax.device_put(empty_window(), replicated)
  compiled = None
  progress = logging_util.Progress(total_steps, start_step)
  throughput = None
  metrics: dict[str, float] = {}
  step, failed = start_step, True
  try:
    if start_step >= total_steps and evals:
      # Finished earlier (e.g. stopped after its last save, before its metrics were recorded):
      # the final state is evaluated again, so the run still returns its final metrics.
      metrics["step"] = float(start_step)
      for evaluator in evals:
        with account.phase("eval"):
          metrics.update(evaluator.run(state.get("ema", state["params"])))
    for step in range(start_step + 1, total_steps + 1):
      profiler.step(step, state)
      with jax.profiler.StepTraceAnnotation("train", step_num=step):
        account.enter("data_wait")
        batch = _select(next(train_iter))
        if compiled is None:
          # Compiled ahead of time once: XLA's cost analysis gives the FLOPs for the MFU.
          account.enter("compile")
          compiled = built.jit_step(batch).lower(state, batch, window, *teacher).compile()
          throughput = _report_compiled(compiled, state, built, batch, batch_size)
          throughput(step - 1)
          if stop.poll():  # a signal during the data's warm-up or the compile: nothing new
            raise stop.stopped(step - 1, total_steps, saved_in)
        account.enter("step")
        state, window, learning_rate = compiled(state, batch, window, *teacher)

      if step % config.log_every_steps == 0 or step == total_steps:
        _check_finite(window, checkpointer)
        metrics = window_metrics(window)
        metrics["learning_rate"] = float(learning_rate)
        metrics.update(throughput(step))
        metrics["skipped_examples_this_host"] = float(train_iter.num_skipped)
        shares = account.scalars(step)
        writer.write_scalars(step, {**metrics, **shares})  # a copy: the writer is asynchronous
        progress.step(step, {**metrics, **shares})
        metrics["step"] = float(step)
        window = jax.device_put(empty_window(), replicated)
        profiler.poll(step)

      stopped = stop.reached(step)
      preempted = checkpointer.reached_preemption(step)
      force = step == total_steps or stopped or preempted
      # The workdir's tier at its steps and when forced, else the local tier at its own.
      tier = checkpointer if force or checkpointer.should_save(step) else local
      if tier is checkpointer or local.due(step, step % config.log_every_steps == 0):
        _check_finite(window, checkpointer)
        data_state = host_states.gather(train_iter.get_state())
        with throughput.paused(window), account.phase("checkpoint"):
          if tier.save(step, state, data_state, force=force):
            account.saved(step)
      if (stopped or preempted) and step < total_steps:
        account.enter("checkpoint")
        checkpointer.wait()
        reason = stop.signal_name if stopped else "a preemption notice"
        raise stopping.Stopped(
          reason, stop.exit_status or 143, step, total_steps, str(checkpointer.directory)
        )

      for evaluator in evals:
        if (evaluator.every_steps and step % evaluator.every_steps == 0) or step == total_steps:
          results = {}
          try:
            with progress.evaluation(step, evaluator.name, results), throughput.paused(window):
              # With Polyak averaging the averaged weights are the ones evaluated (and exported).
              with account.phase("eval"):
                results.update(evaluator.run(state.get("ema", state["params"])))
          except stopping.StopRequested:  # abandoned: this step is saved, unless it was above
            if not (step == total_steps or checkpointer.should_save(step)):
              _check_finite(window, checkpointer)
              data_state = host_states.gather(train_iter.get_state())
              with account.phase("checkpoint"):
                checkpointer.save(step, state, data_state, force=True)
            raise
          writer.write_scalars(step, results)
          metrics.update(results)
    failed = False
  except stopping.StopRequested:  # a signal inside an evaluation
    account.enter("checkpoint")
    checkpointer.wait()
    raise stop.stopped(step, total_steps, str(checkpointer.directory)) from None
  except Exception as e:
    if train_state.out_of_space(e) and not isinstance(e, train_state.CheckpointSaveError):
      # The metrics writer (or anything else writing to the workdir) met a full disk first.
      raise checkpointer.no_space(f"writing to it after step {step}") from e
    raise
  finally:
    # A failed run still completes the saves it started (the last good checkpoint stays whole).
    account.enter("checkpoint")
    closers = (checkpointer.wait, checkpointer.close, local.wait, local.close, train_iter.close)
    # The writer closed (its events flushed, the file closed): the command's process ends without
    # running destructors (vit_jax.runtime.cli.end_process).
    _close(failed, lambda: profiler.close(state), *closers, writer.close)
  return metrics


def _close(failed: bool, *closers: Callable[[], Any]) -> None:
  """Calls every closer; their errors are raised after a success, logged after a failure (the
  error that ended the run is the one to report)."""
  errors = []
  for close in closers:
    try:
      close()
    except Exception as e:  # noqa: BLE001 - see the docstring
      errors.append(e)
      logging.error("while closing: %s", e, exc_info=e, extra={"terminal": False})
  if errors and not failed:
    raise errors[0]


def _report_compiled(compiled, state, built: TrainStep, batch, batch_size: int):
  """Logs the compiled step's memory, FLOPs and collectives per device, as the planner prints
  them (vit_jax.tools.plan), and returns the meter of the MFU then achieved: model FLOPs (3 ×
  forward, no recomputation) per device per step against the device's peak."""
  stats = compiled_stats.step_stats(compiled, state, built.state_shardings, batch)
  compiled_stats.log_step_stats(stats)
  height, width = batch["image"].shape[1:3]
  per_example = flops.model_flops_per_example(built.model, (height, width))
  return logging_util.Throughput(batch_size, per_example * batch_size / built.mesh.devices.size)


def _teacher_shardings(objective: objectives.Objective, mesh: jax.sharding.Mesh) -> Any:
  """The teacher's parameters laid out on `mesh` as a model's are; None without a teacher."""
  teacher = getattr(objective, "teacher", None)
  return None if teacher is None else sharding.tree_shardings(teacher.params, mesh)


def _select(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The fields of a batch the step reads (the step is compiled for exactly these)."""
  return {k: batch[k] for k in ("image", "label", "mask")}
