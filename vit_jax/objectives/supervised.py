"""Supervised classification: softmax or sigmoid (multi-label) cross-entropy on the labels.

The losses take float32 logits [batch, classes] and dense targets [batch, classes] (one-hot,
multi-hot or soft mixup targets) and return [batch]; the trainer and the classification
evaluator weight them with the batch mask.

Label smoothing (Szegedy et al. 2016; the DeiT and AugReg recipes, `config.label_smoothing` ε)
changes the training loss only: its targets become (1 − ε)·t + ε/K for K classes, t the one-hot,
multi-hot or mixup/cutmix targets (the trainer mixes before the loss). The sigmoid loss gets the
same formula, each class's binary target moved towards ε/K, as timm's `BinaryCrossEntropy` does
(Wightman et al. 2021 train with it); big_vision leaves it off there, as does the default ε = 0.
What counts as correct, and every evaluator's loss, use the un-smoothed targets.

This file must not import TensorFlow.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import models


def softmax_xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """−Σ_k t_k log softmax(z)_k, per example."""
  return -jnp.sum(targets * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def sigmoid_xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Σ_k binary cross-entropy of each class, per example (pretraining on multi-label data)."""
  log_p = jax.nn.log_sigmoid(logits)
  log_not_p = jax.nn.log_sigmoid(-logits)
  return -jnp.sum(targets * log_p + (1.0 - targets) * log_not_p, axis=-1)


LOSSES = {"softmax_xent": softmax_xent, "sigmoid_xent": sigmoid_xent}


def check_label_smoothing(epsilon: float) -> None:
  """Raises ValueError unless 0 <= `epsilon` < 1 (1 would leave no trace of the labels)."""
  if not 0.0 <= float(epsilon) < 1.0:
    raise ValueError(f"config.label_smoothing={epsilon!r} must be in [0, 1); 0 turns it off")


def smooth(targets: jax.Array, epsilon: float) -> jax.Array:
  """(1 − ε)·targets + ε/K, targets float32 [batch, K]; the targets themselves at ε = 0."""
  if not epsilon:
    return targets
  return (1.0 - epsilon) * targets + epsilon / targets.shape[-1]


def dense_targets(labels: jax.Array, num_classes: int) -> jax.Array:
  """int labels [batch] → one-hot [batch, classes]; dense targets pass through as float32."""
  if labels.ndim == 1:
    return jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  return labels.astype(jnp.float32)


def top1_correct(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """[batch] bool: the top-scoring class is a positive label (top-1; precision@1 for
  multi-hot targets)."""
  top1 = jnp.argmax(logits, axis=-1)
  return jnp.take_along_axis(targets, top1[:, None], axis=-1)[:, 0] > 0


def forward(model: Any, params: Any, batch: dict[str, jax.Array], key: jax.Array):
  """(logits, out) of `model` on a training batch: dropout keyed by `key` and each example's
  index in the global batch (`batch['index']`)."""
  ids, rngs = batch["index"], {"dropout": key}
  return model.apply({"params": params}, batch["image"], train=True, example_ids=ids, rngs=rngs)


@dataclasses.dataclass(frozen=True)
class Supervised:
  """`loss` ('softmax_xent' | 'sigmoid_xent') on `num_classes` labels, the training targets
  smoothed by `label_smoothing` (see the module docstring)."""

  loss: str
  num_classes: int
  multi_label: bool = False
  label_smoothing: float = 0.0
  name: str = "supervised"
  accepts_model_init: bool = True

  def __post_init__(self):
    if self.loss not in LOSSES:
      raise ValueError(
        f"config.loss={self.loss!r}; expected one of {(*LOSSES, 'mpp', 'seg_softmax_xent')}"
      )
    check_label_smoothing(self.label_smoothing)

  def model(self, model_config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None):
    return models.get_model(model_config, self.num_classes, mesh=mesh)

  def per_example(self, model: Any, params: Any, batch: dict[str, jax.Array], key: jax.Array):
    logits, _ = forward(model, params, batch, key)
    return self.loss_and_correct(logits, batch["label"])

  def loss_and_correct(self, logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(loss [B], correct [B]) of logits [B, K] against int labels [B] or dense targets [B, K]
    (what vit_jax.objectives.distill wraps); the loss's targets smoothed, `correct` not."""
    targets = dense_targets(labels, self.num_classes)
    per_example = LOSSES[self.loss](logits, smooth(targets, self.label_smoothing))
    if self.multi_label:  # precision@1: the top class is one of the labels
      correct = top1_correct(logits, targets)
    else:
      correct = jnp.argmax(logits, -1) == jnp.argmax(targets, -1)
    return per_example, correct
