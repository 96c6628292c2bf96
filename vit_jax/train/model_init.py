"""A stage's starting point from `config.model_init`: the checkpoint's architecture and weights.

`with_init_architecture` gives a config whose model is the checkpoint's (for `model_from_init`,
set by `runlocal` fine-tunes of a real workdir); `initial_state` is the trainer's state when no
checkpoint of its own exists: initialised, then, with `model_init`, the pretrained parameters
adapted to this model (a new head, resized position embeddings) and the optimizer state and
Polyak average started from them.
"""

import copy
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from vit_jax import checkpoint, models, sharding
from vit_jax.checkpoint.state import train_state

# What `model_from_init` keeps of the stage's own model config (the rest is the checkpoint's).
STAGE_MODEL_FIELDS = (
  "dropout_rate",
  "attention_dropout_rate",
  "stochastic_depth",
  "dtype",
  "head_bias_init",
)


def with_init_architecture(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `config` whose model is the architecture of `config.model_init` (its saved
  config, else its parameter shapes; its `posemb` with it), with the stage's dropout, stochastic
  depth, dtype, head initialisation and choice of a representation layer."""
  stage_model = config.model
  model_config, _, _ = checkpoint.load_backbone(str(config.model_init))
  for key in STAGE_MODEL_FIELDS:
    # (A ViT saved before a field existed takes the stage's; a BiT ResNet has none of these.)
    if key in stage_model and (key in model_config or not models.is_bit(model_config)):
      model_config[key] = stage_model[key]
  if "representation_size" in model_config and stage_model.get("representation_size") is None:
    model_config.representation_size = None
  new = copy.deepcopy(config)
  with new.unlocked():
    new.model = model_config
  logging.info("model_from_init: the architecture of %s: %s", config.model_init, model_config)
  return new


def to_global(tree: Any, shardings: Any) -> Any:
  """Host numpy tree (the same on every process) → global arrays with `shardings`."""
  return jax.tree_util.tree_map(
    lambda x, s: jax.make_array_from_callback(x.shape, s, lambda idx, x=x: x[idx]), tree, shardings
  )


def load_init_params(config, abstract_params, head, param_shardings, head_dist=None) -> Any:
  """The pretrained parameters named by `config.model_init`, adapted to this model.

  The new head comes from `head` (this model's initialisation; DeiT's distillation head from
  `head_dist`, for a model with `distill_token`), position embeddings are resized
  and `pre_logits` dropped or kept by vit_jax.checkpoint.load_pretrained. Every process reads
  the whole file (host memory), then keeps its shards.
  """
  expected = dict(abstract_params)
  expected["head"] = head
  if head_dist is not None:
    expected["head_dist"] = head_dist
  path = str(config.model_init)
  # A published `.npz` (or timm / HF `.safetensors`) is read by load_pretrained itself; an Orbax
  # workdir of a pretrain run is restored first and adapted in memory.
  source = path if checkpoint.is_params_file(path) else train_state.restore_params(path)
  params = checkpoint.load_pretrained(source, expected, config.model)
  logging.info("initialised from %s", path)
  return to_global(params, param_shardings)


def initial_state(config: ml_collections.ConfigDict, built: Any) -> dict[str, Any]:
  """The state of step 0 of `built` (vit_jax.train.Setup) on its mesh: initialised, with
  `config.model_init`'s parameters when set."""
  shardings = built.state_shardings
  state = jax.jit(built.init_state, out_shardings=shardings)(built.init_key)
  if not config.model_init:
    return state
  if not built.objective.accepts_model_init:
    raise ValueError(
      f"config.model_init with loss={config.loss!r}: this objective starts from scratch"
    )
  replicated = sharding.replicated(built.mesh)
  names = [n for n in ("head", "head_dist") if n in built.abstract_state["params"]]
  init_heads = lambda k: {n: built.init_params(k)[n] for n in names}  # noqa: E731
  heads = jax.jit(init_heads, out_shardings=replicated)(built.init_key)
  heads = jax.tree_util.tree_map(lambda x: np.asarray(x.addressable_data(0)), heads)
  params = load_init_params(
    config,
    built.abstract_state["params"],
    heads["head"],
    shardings["params"],
    head_dist=heads.get("head_dist"),
  )
  opt_state = jax.jit(built.tx.init, out_shardings=shardings["opt_state"])(params)
  state = dict(state, params=params, opt_state=opt_state)
  if "ema" in state:  # the average starts at the pretrained weights
    state["ema"] = jax.tree_util.tree_map(jnp.copy, params)
  return state
