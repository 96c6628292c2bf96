"""Optimizers and learning-rate schedules of the paper's recipes, built with optax.

Pretraining (paper §4.1, App. B.1): Adam β1=0.9, β2=0.999, decoupled weight decay, gradient
clipping at global norm 1, linear warmup then linear decay. Fine-tuning (App. B.1.1): SGD with
momentum 0.9, clipping at global norm 1, warmup then cosine decay.

Weight decay is decoupled (Loshchilov & Hutter, as `optax.adamw`): after the optimizer's update,
p ← p − lr_t · wd · p, applied to the parameters whose `/`-joined name matches one of
`optimizer.decay_patterns` (regular expressions, `re.search`; default: kernels only, as
big_vision's `wd_mults`), never by rank: a leaf's rank changes with `model.scan=True` (a leading
layer axis), its name does not, so the decayed set is the same with scan on and off. Biases,
LayerNorm scales, the class token and the position embeddings are not decayed by default.

Gradient accumulation is not done here (it lives in the train step, so the optimizer state
is the same whatever the micro-batching). This file must not import TensorFlow.
"""

import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax import sharding

# Kernels of every Dense/Conv layer (patch embedding, attention, MLP, pre-logits, head, ResNet).
DEFAULT_DECAY_PATTERNS = (r"(^|/)kernel$",)


def make_schedule(config: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """The learning rate as a function of the step.

  Args:
    config: `name` ('warmup_linear' | 'warmup_cosine' | 'constant'), `base_lr`, `warmup_steps`,
      `end_lr` (value reached at `total_steps`).
    total_steps: length of the run.

  Returns:
    An optax schedule, step → learning rate.
  """
  base, end = float(config.base_lr), float(config.end_lr)
  warmup = min(int(config.warmup_steps), total_steps)
  decay_steps = max(total_steps - warmup, 1)
  if config.name == "constant":
    return optax.constant_schedule(base)
  if config.name == "warmup_linear":
    decay = optax.linear_schedule(base, end, decay_steps)
  elif config.name == "warmup_cosine":
    decay = optax.cosine_decay_schedule(base, decay_steps, alpha=end / base if base else 0.0)
  else:
    raise ValueError(f"unknown schedule {config.name!r}")
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, base, warmup), decay], [warmup])


def decay_mask(params: Any, patterns: Sequence[str] = DEFAULT_DECAY_PATTERNS) -> Any:
  """A tree of bools like `params`: True where the leaf's name matches one of `patterns`."""
  compiled = [re.compile(p) for p in patterns]
  return jax.tree_util.tree_map_with_path(
    lambda path, _: any(c.search(sharding.path_name(path)) for c in compiled), params
  )


def _mu_dtype(config: ml_collections.ConfigDict) -> Any:
  """Adam's first-moment dtype: 'float32' (and a config saved before the field existed) keeps it
  in the parameters' dtype, optax's default (float32; float64 in the tests' float64 references);
  'bfloat16' narrows it."""
  name = config.get("mu_dtype", "float32")
  if name not in ("float32", "bfloat16"):
    raise ValueError(f"optimizer.mu_dtype={name!r}; expected 'float32' or 'bfloat16'")
  return jnp.bfloat16 if name == "bfloat16" else None


def make_optimizer(
  config: ml_collections.ConfigDict, schedule: optax.Schedule, grad_clip_norm: float | None
) -> optax.GradientTransformation:
  """The optimizer.

  Args:
    config: `name` ('adam' | 'sgd'); for adam `b1`, `b2` and `mu_dtype` (of the first moment);
      for sgd `momentum`; both `weight_decay` and optionally `decay_patterns` (default
      DEFAULT_DECAY_PATTERNS).
    schedule: learning rate per step.
    grad_clip_norm: clip gradients to this global norm first; None or 0 disables.

  Returns:
    An optax GradientTransformation.
  """
  parts = []
  if grad_clip_norm:
    parts.append(optax.clip_by_global_norm(float(grad_clip_norm)))
  if config.name == "adam":
    parts.append(
      optax.scale_by_adam(b1=float(config.b1), b2=float(config.b2), mu_dtype=_mu_dtype(config))
    )
  elif config.name == "sgd":
    if config.momentum:
      parts.append(optax.trace(decay=float(config.momentum)))
  else:
    raise ValueError(f"unknown optimizer {config.name!r}")
  if config.weight_decay:
    patterns = tuple(config.get("decay_patterns", DEFAULT_DECAY_PATTERNS))
    parts.append(
      optax.add_decayed_weights(float(config.weight_decay), mask=lambda p: decay_mask(p, patterns))
    )
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts)
