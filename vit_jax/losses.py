"""Per-example classification losses: softmax and sigmoid (multi-label) cross-entropy.

Both take float32 logits [batch, classes] and dense targets [batch, classes] (one-hot, multi-hot
or soft mixup targets) and return [batch]; the trainer weights them with the batch mask.
"""

import jax
import jax.numpy as jnp


def softmax_xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """−Σ_k t_k log softmax(z)_k, per example."""
  return -jnp.sum(targets * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def sigmoid_xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Σ_k binary cross-entropy of each class, per example (pretraining on multi-label data)."""
  log_p = jax.nn.log_sigmoid(logits)
  log_not_p = jax.nn.log_sigmoid(-logits)
  return -jnp.sum(targets * log_p + (1.0 - targets) * log_not_p, axis=-1)


LOSSES = {"softmax_xent": softmax_xent, "sigmoid_xent": sigmoid_xent}


def dense_targets(labels: jax.Array, num_classes: int) -> jax.Array:
  """int labels [batch] → one-hot [batch, classes]; dense targets pass through as float32."""
  if labels.ndim == 1:
    return jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  return labels.astype(jnp.float32)
