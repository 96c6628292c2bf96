"""Optimizers and learning-rate schedules of the paper's recipes, built with optax.

Pretraining (paper §4.1, App. B.1): Adam β1=0.9, β2=0.999, decoupled weight decay, gradient
clipping at global norm 1, linear warmup then linear decay. Fine-tuning (App. B.1.1): SGD with
momentum 0.9, clipping at global norm 1, warmup then cosine decay.

Weight decay is decoupled (Loshchilov & Hutter, as `optax.adamw`): after the optimizer's update,
p ← p − lr_t · wd · p, applied to kernels and embeddings (leaves of rank ≥ 2), not to biases,
LayerNorm scales or the class token.

Gradient accumulation is not done here (it lives in the train step, so the optimizer state
is the same whatever the micro-batching). This file must not import TensorFlow.
"""

from typing import Any

import jax
import ml_collections
import optax


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


def _decay_mask(params: Any) -> Any:
  return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def make_optimizer(
  config: ml_collections.ConfigDict, schedule: optax.Schedule, grad_clip_norm: float | None
) -> optax.GradientTransformation:
  """The optimizer.

  Args:
    config: `name` ('adam' | 'sgd'); for adam `b1`, `b2`, `weight_decay`; for sgd `momentum`,
      `weight_decay`.
    schedule: learning rate per step.
    grad_clip_norm: clip gradients to this global norm first; None or 0 disables.

  Returns:
    An optax GradientTransformation.
  """
  parts = []
  if grad_clip_norm:
    parts.append(optax.clip_by_global_norm(float(grad_clip_norm)))
  if config.name == "adam":
    parts.append(optax.scale_by_adam(b1=float(config.b1), b2=float(config.b2)))
  elif config.name == "sgd":
    if config.momentum:
      parts.append(optax.trace(decay=float(config.momentum)))
  else:
    raise ValueError(f"unknown optimizer {config.name!r}")
  if config.weight_decay:
    parts.append(optax.add_decayed_weights(float(config.weight_decay), mask=_decay_mask))
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts)
