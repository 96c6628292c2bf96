"""Label smoothing (`config.label_smoothing` ε) of the supervised training loss, against float64
numpy: targets (1 − ε)·t + ε/K for the softmax and the sigmoid loss, after mixup; what counts
as correct and the evaluators' loss stay un-smoothed; ε outside [0, 1) is one line.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import objectives
from vit_jax.configs import pretrain, pretrain_mpp
from vit_jax.evaluators import classification
from vit_jax.objectives import supervised

B, K = 6, 5


class _FixedLogits:
  """A model whose logits are given: the objective's arithmetic is what is tested."""

  def __init__(self, logits):
    self.logits = jnp.asarray(logits, jnp.float32)

  def apply(self, variables, images, **kwargs):
    return self.logits, {}


def _logits(seed=0):
  return np.random.default_rng(seed).normal(0, 3, (B, K)).astype(np.float32)


def _log_softmax64(z):
  z = z.astype(np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _log_sigmoid64(z):
  z = z.astype(np.float64)
  return -np.logaddexp(0.0, -z)


def _per_example(objective, logits, labels):
  batch = {
    "image": np.zeros((B, 2, 2, 3), np.float32),
    "label": labels,
    "mask": np.ones([B], np.float32),
    "index": np.arange(B, dtype=np.int32),
  }
  loss, correct = objective.per_example(_FixedLogits(logits), {}, batch, None)
  return np.asarray(loss), np.asarray(correct)


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.5])
def test_softmax_targets_are_smoothed_one_hot_and_mixed_labels(epsilon):
  logits, rng = _logits(), np.random.default_rng(1)
  labels = rng.integers(0, K, B).astype(np.int32)
  one_hot = np.eye(K)[labels]
  lam = 0.3  # soft targets as mixup/cutmix leave them: smoothing comes after the mixing
  mixed = lam * one_hot + (1 - lam) * np.roll(one_hot, 1, axis=0)
  objective = supervised.Supervised("softmax_xent", K, label_smoothing=epsilon)
  for targets, given in ((one_hot, labels), (mixed, mixed.astype(np.float32))):
    reference = -np.sum(((1 - epsilon) * targets + epsilon / K) * _log_softmax64(logits), -1)
    loss, correct = _per_example(objective, logits, given)
    np.testing.assert_allclose(loss, reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(correct, logits.argmax(-1) == targets.argmax(-1))


def test_sigmoid_targets_get_the_same_formula_and_precision_at_1_stays_unsmoothed():
  epsilon, logits = 0.2, _logits(2)
  multi_hot = np.zeros((B, K))
  multi_hot[np.arange(B), np.arange(B) % K] = 1
  multi_hot[:, 3] = 1
  objective = supervised.Supervised("sigmoid_xent", K, multi_label=True, label_smoothing=epsilon)
  loss, correct = _per_example(objective, logits, multi_hot.astype(np.float32))
  t = (1 - epsilon) * multi_hot + epsilon / K
  reference = -np.sum(t * _log_sigmoid64(logits) + (1 - t) * _log_sigmoid64(-logits), -1)
  np.testing.assert_allclose(loss, reference, rtol=1e-5, atol=1e-5)
  # Smoothed targets are > 0 for every class: precision@1 must read the labels themselves.
  top1 = logits.argmax(-1)
  np.testing.assert_array_equal(correct, multi_hot[np.arange(B), top1] > 0)
  assert not correct.all()


def test_the_config_field_reaches_the_training_loss_only():
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  assert config.label_smoothing == 0.0  # off by default
  config.label_smoothing = 0.1
  objective = objectives.get(config, K)
  assert objective.label_smoothing == 0.1
  logits, labels = _logits(3), np.arange(B, dtype=np.int32) % K
  smoothed, _ = _per_example(objective, logits, labels)
  # The classification evaluator's loss of the same logits is plain cross-entropy.
  sums = classification.batch_metrics(jnp.asarray(logits), labels, np.ones([B], np.float32))
  plain = -_log_softmax64(logits)[np.arange(B), labels]
  np.testing.assert_allclose(float(sums["loss"]), plain.sum(), rtol=1e-5)
  assert not np.allclose(smoothed.sum(), plain.sum(), rtol=1e-3)


@pytest.mark.parametrize("epsilon", [-0.1, 1.0, 1.5, float("nan")])
def test_epsilon_outside_0_1_is_refused_in_one_line(epsilon):
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  config.label_smoothing = epsilon
  with pytest.raises(ValueError) as error:
    objectives.get(config, K)
  message = str(error.value)
  assert "config.label_smoothing=" in message and "[0, 1)" in message and "\n" not in message


def test_label_smoothing_with_masked_patch_prediction_is_refused():
  config = pretrain_mpp.get_config("dataset=fashion_mnist,runlocal")
  config.label_smoothing = 0.1
  with pytest.raises(ValueError, match="label_smoothing=0.1 applies to the supervised losses"):
    objectives.get(config, K)
