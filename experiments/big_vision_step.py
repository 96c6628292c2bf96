"""big_vision's ViT in a train step written to big_vision's recipe, compiled for a set of devices.

The peer's model code is imported from a checkout of google-research/big_vision
(`big_vision/models/vit.py`), never copied: `load_model_module(big_vision_dir)` puts the checkout
on the path and imports that one module. It needs `big_vision.utils` only in functions a train
step does not call (checkpoint loading), and importing the real one would pull in big_vision's
preprocessing registry and TensorFlow's gfile, so a stand-in module takes its name for the import
and raises on any use. (The model module still imports `flax.training.checkpoints`, whose
`flax.io` imports TensorFlow where it is installed.)

The step around it is ours, written to what big_vision's trainer (`big_vision/train.py`
`update_fn`) and its recipe (`configs/vit_i21k.py`) do, with optax:

  sigmoid cross-entropy over dense labels, summed over classes and averaged over the batch
  (big_vision.utils.sigmoid_xent); `optax.clip_by_global_norm(1.0)`, `optax.scale_by_adam` with
  the first moment in bfloat16 (`config.optax = dict(mu_dtype='bfloat16')`), the learning rate,
  decoupled weight decay on kernels (`config.wd`, `wd_mults` default `.*/kernel$`), the schedule
  (`optax.scale_by_schedule`, whose count is the step), then `scale(-1)`; parameters in float32;
  the step's norms of gradients, parameters and updates (`measurements`); parameters and
  optimizer state replicated, the batch split over one `data` axis of every device
  (big_vision's default `sharding_strategy` and `mesh`); no scan, no remat (vit_i21k.py sets
  neither).

The model is configured to the run being compared (`model_kwargs`): its width, depth, patch
size, classes, pooling, representation layer, dropout and matmul dtype (`dtype_mm`).
"""

import importlib
import os
import sys
import types
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# big_vision's recipe (configs/vit_i21k.py): Adam's first moment in bfloat16, clipping at 1,
# lr 1e-3, weight decay 1e-4 (decoupled, on kernels), 10k steps of warmup then cosine.
RECIPE = dict(mu_dtype="bfloat16", grad_clip_norm=1.0, lr=1e-3, wd=1e-4, warmup_steps=10_000)
_SCHEDULE_STATE = 4  # index of optax.scale_by_schedule's state in make_optimizer's chain


def model_path(big_vision_dir: str) -> str:
  """big_vision/models/vit.py of the checkout at `big_vision_dir`; one line if it is not one."""
  path = os.path.join(big_vision_dir, "big_vision", "models", "vit.py")
  if not os.path.isfile(path):
    raise ValueError(
      f"--big_vision_dir={big_vision_dir!r}: no big_vision/models/vit.py there (a checkout of "
      "github.com/google-research/big_vision)"
    )
  return path


def load_model_module(big_vision_dir: str) -> types.ModuleType:
  """big_vision.models.vit from the checkout at `big_vision_dir` (the folder holding
  `big_vision/`)."""
  path = model_path(big_vision_dir)
  if "big_vision.utils" not in sys.modules:
    sys.modules["big_vision.utils"] = _StandIn("big_vision.utils")
  root = os.path.abspath(big_vision_dir)
  if root not in sys.path:
    sys.path.insert(0, root)
  module = importlib.import_module("big_vision.models.vit")
  if not os.path.samefile(module.__file__, path):
    raise ValueError(f"big_vision.models.vit was imported from {module.__file__}, not {path}")
  return module


class _StandIn(types.ModuleType):
  """A module that may be imported but not used (see the module docstring)."""

  def __getattr__(self, name: str):
    if name.startswith("__"):
      raise AttributeError(name)
    raise RuntimeError(f"{self.__name__}.{name}: not available (a stand-in for the import only)")


def sigmoid_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean over the batch of the per-class sigmoid cross-entropies' sum (big_vision's loss)."""
  nll = -jnp.sum(
    labels * jax.nn.log_sigmoid(logits) + (1.0 - labels) * jax.nn.log_sigmoid(-logits), axis=-1
  )
  return jnp.mean(nll)


def make_optimizer(params: Any, total_steps: int, recipe: dict = RECIPE):
  """big_vision's optax chain for the recipe (see the module docstring)."""
  warmup = recipe["warmup_steps"]
  schedule = optax.join_schedules(
    [
      optax.linear_schedule(0.0, 1.0, warmup),
      optax.cosine_decay_schedule(1.0, max(total_steps - warmup, 1)),
    ],
    [warmup],
  )
  kernels = jax.tree_util.tree_map_with_path(
    lambda path, _: jax.tree_util.keystr(path).endswith("['kernel']"), params
  )
  return optax.chain(
    optax.clip_by_global_norm(recipe["grad_clip_norm"]),
    optax.scale_by_adam(mu_dtype=jnp.dtype(recipe["mu_dtype"])),
    optax.scale(recipe["lr"]),
    optax.add_decayed_weights(recipe["wd"], kernels),
    optax.scale_by_schedule(schedule),
    optax.scale(-1.0),
  )


def model_kwargs(
  *,
  patch_size: int,
  width: int,
  depth: int,
  mlp_dim: int,
  num_heads: int,
  num_classes: int,
  dropout: float,
  dtype_mm: str,
  pool_type: str = "tok",
  rep_size: bool = True,
) -> dict[str, Any]:
  """big_vision `vit.Model` arguments; the defaults are the ViT paper's head (class token, a
  Dense+tanh representation layer of the model's width)."""
  return dict(
    num_classes=num_classes,
    patch_size=(patch_size, patch_size),
    width=width,
    depth=depth,
    mlp_dim=mlp_dim,
    num_heads=num_heads,
    dropout=dropout,
    dtype_mm=dtype_mm,
    pool_type=pool_type,
    rep_size=rep_size,
    posemb="learn",
  )


class Step(NamedTuple):
  """big_vision's step on a mesh, ready to lower: `jitted.lower(*args)`."""

  jitted: Any
  args: tuple  # (state, rng, batch) as ShapeDtypeStructs with shardings
  state: dict  # {'params', 'opt_state'} ShapeDtypeStructs
  state_shardings: dict
  batch: dict  # {'image' f32 [B, H, W, 3], 'labels' f32 [B, classes]}


def build_step(
  vit_module: types.ModuleType,
  kwargs: dict[str, Any],
  devices: list[Any],
  global_batch: int,
  image_size: int = 224,
  total_steps: int = 100_000,
  head_bias: float = -10.0,
) -> Step:
  """big_vision's train step of the model `kwargs` for `devices`, nothing allocated."""
  mesh = jax.sharding.Mesh(mesh_utils.create_device_mesh((len(devices),), devices), ("data",))
  replicated = NamedSharding(mesh, P())
  model = vit_module.Model(**kwargs)
  classes = int(kwargs["num_classes"])

  def init(rng):
    image = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
    params = model.init(rng, image)["params"]
    params["head"]["bias"] = jnp.full_like(params["head"]["bias"], head_bias)
    return params

  params_shape = jax.eval_shape(init, jax.random.PRNGKey(0))
  tx = make_optimizer(params_shape, total_steps)
  opt_shape = jax.eval_shape(tx.init, params_shape)

  def train_step(state, rng, batch):
    images, labels = batch["image"], batch["labels"]
    rng = jax.random.fold_in(rng, state["opt_state"][_SCHEDULE_STATE].count)
    rng, rng_model = jax.random.split(rng)

    def loss_fn(params):
      logits, _ = model.apply({"params": params}, images, train=True, rngs={"dropout": rng_model})
      return sigmoid_xent(logits, labels)

    params, opt = state["params"], state["opt_state"]
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt = tx.update(grads, opt, params)
    params = optax.apply_updates(params, updates)

    def norm(tree):
      return jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(tree)))

    measurements = dict(
      training_loss=loss, l2_grads=norm(grads), l2_params=norm(params), l2_updates=norm(updates)
    )
    return dict(params=params, opt_state=opt), measurements

  shapes = dict(params=params_shape, opt_state=opt_shape)
  state_shardings = jax.tree_util.tree_map(lambda _: replicated, shapes)
  state = jax.tree_util.tree_map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, state_shardings
  )

  def split(ndim):
    return NamedSharding(mesh, P("data", *([None] * (ndim - 1))))

  batch = dict(
    image=jax.ShapeDtypeStruct(
      (global_batch, image_size, image_size, 3), jnp.float32, sharding=split(4)
    ),
    labels=jax.ShapeDtypeStruct((global_batch, classes), jnp.float32, sharding=split(2)),
  )
  rng = jax.ShapeDtypeStruct((2,), np.uint32, sharding=replicated)
  jitted = jax.jit(
    train_step,
    in_shardings=(state_shardings, replicated, {k: v.sharding for k, v in batch.items()}),
    out_shardings=(state_shardings, replicated),
    donate_argnums=(0,),
  )
  return Step(jitted, (state, rng, batch), state, state_shardings, batch)
