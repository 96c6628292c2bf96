"""The train step: `make_train_step` (one step of the objective on a global batch) and `build`
(the model, optimizer, state shapes and shardings and the step of a config on a mesh, before any
value exists: what `run` trains and the planner, vit_jax.tools.plan, compiles), with the metrics
window the step adds to (see vit_jax.train for the determinism it keeps)."""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax import objectives, sharding
from vit_jax.train import ema, mixup, optim

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
  the global batch is mixed first (vit_jax.train.mixup, labels one-hot over `num_classes`). Each
  example carries its index in the global batch (`index`), which keys its random draws with the
  step's key, the same in every micro-batch. The step adds its sums to `window` (see `Window`) and records
  there the first step with a non-finite loss or gradient norm. With `ema_decay` the state's
  `ema` is averaged towards the new parameters (vit_jax.train.ema). A distillation objective's
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
    batch = select(batch)
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


class Setup(NamedTuple):
  """What `build` sets up for a config on a mesh before any data or state value exists: the
  model, objective, optimizer, initialisation, state shardings and the un-jitted step."""

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


def build(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, num_classes: int) -> Setup:
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
  size = config.dataset.image_size
  height, width = (size, size) if isinstance(size, int) else tuple(size)
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
  teacher = getattr(objective, "teacher", None)  # distillation: laid out as a model's params
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
  return Setup(
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
    teacher_shardings=None if teacher is None else sharding.tree_shardings(teacher.params, mesh),
  )


def select(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The fields of a batch the step reads (the step is compiled for exactly these)."""
  return {k: batch[k] for k in ("image", "label", "mask")}
