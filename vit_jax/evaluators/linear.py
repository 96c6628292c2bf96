"""Linear probes on frozen features of a whole training split: closed-form ridge and logistic.

Two classifiers are fitted on the representations of every training example:
- `ridge`: the few-shot evaluator's closed-form regression to {-1, +1}^K targets
  (`fewshot.ridge_fit`), on all the data instead of k per class;
- `logreg`: multinomial logistic regression (softmax cross-entropy + L2 on the weights) on
  standardised features, solved full-batch with optax's L-BFGS inside one jitted while loop.

Each regulariser is picked from a grid on a seeded held-out slice of the training split
(`val_fraction`), then the classifier is refitted on the whole split and scored on the test
split; the test split never influences a choice.
"""

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax.evaluators import _utils, fewshot

RIDGE_L2_REGS = (1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)
LOGREG_L2_REGS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)

_HIGHEST = jax.lax.Precision.HIGHEST


@functools.partial(jax.jit, static_argnames=("num_classes",))
def ridge_predict(x_train, y_train, x_test, num_classes: int, l2_reg) -> jax.Array:
  """Predicted classes [N_test] of the closed-form ridge classifier fitted on (x_train, y_train)."""
  w, b, mean = fewshot.ridge_fit(x_train, y_train, num_classes, l2_reg)
  return jnp.argmax(fewshot.ridge_scores(x_test, w, b, mean), axis=-1)


@functools.partial(jax.jit, static_argnames=("num_classes", "max_iters"))
def logreg_predict(
  x_train, y_train, x_test, num_classes: int, l2_reg, max_iters: int = 500, tol: float = 1e-6
) -> jax.Array:
  """Predicted classes [N_test] of L2-regularised softmax regression fitted with L-BFGS.

  Minimises mean softmax cross-entropy + l2_reg / 2 * ||W||^2 over standardised features; the
  bias is not regularised. Stops after `max_iters` steps or when the gradient norm < `tol`.
  """
  mu = jnp.mean(x_train, axis=0)
  sigma = jnp.std(x_train, axis=0) + 1e-6
  xs = (x_train - mu) / sigma
  targets = jax.nn.one_hot(y_train, num_classes, dtype=jnp.float32)

  def loss_fn(p):
    logits = jnp.matmul(xs, p["w"], precision=_HIGHEST) + p["b"]
    xent = jnp.mean(optax.softmax_cross_entropy(logits, targets))
    return xent + 0.5 * l2_reg * jnp.sum(jnp.square(p["w"]))

  params = {
    "w": jnp.zeros((xs.shape[1], num_classes), jnp.float32),
    "b": jnp.zeros((num_classes,), jnp.float32),
  }
  opt = optax.lbfgs()
  value_and_grad = optax.value_and_grad_from_state(loss_fn)

  def step(carry):
    p, state, i, _ = carry
    value, grad = value_and_grad(p, state=state)
    updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=loss_fn)
    return optax.apply_updates(p, updates), state, i + 1, optax.tree.norm(grad)

  def keep_going(carry):
    _, _, i, grad_norm = carry
    return (i < max_iters) & (grad_norm >= tol)

  init = (params, opt.init(params), 0, jnp.array(jnp.inf, jnp.float32))
  params, *_ = jax.lax.while_loop(keep_going, step, init)
  logits = jnp.matmul((x_test - mu) / sigma, params["w"], precision=_HIGHEST) + params["b"]
  return jnp.argmax(logits, axis=-1)


PROBES = {"ridge": ridge_predict, "logreg": logreg_predict}


def fit_and_score(
  probe: str,
  x_train: np.ndarray,
  y_train: np.ndarray,
  x_test: np.ndarray,
  y_test: np.ndarray,
  num_classes: int,
  l2_regs: Sequence[float],
  *,
  val_fraction: float = 0.1,
  seed: int = 0,
) -> dict[str, float]:
  """Picks the regulariser on a held-out slice of train, refits on all of train, scores test.

  `probe`: a key of PROBES; x_*: features [N, R], y_*: int labels [N]; `l2_regs`: the grid (one
  value: no held-out slice); `val_fraction` of train is held out, shuffled by `seed`. Returns
  {'accuracy': test top-1, 'l2_reg': the chosen value, 'val_accuracy': its held-out top-1}.
  """
  predict = PROBES[probe]
  out = {}
  l2_regs = tuple(l2_regs)
  if len(l2_regs) > 1:
    perm = np.random.default_rng(seed).permutation(len(x_train))
    n_val = max(1, int(round(val_fraction * len(x_train))))
    val, fit = perm[:n_val], perm[n_val:]
    scores = []
    for l2 in l2_regs:
      preds = np.asarray(predict(x_train[fit], y_train[fit], x_train[val], num_classes, l2))
      scores.append(float(np.mean(preds == y_train[val])))
    best = int(np.argmax(scores))
    out["val_accuracy"] = scores[best]
    l2_regs = (l2_regs[best],)
  preds = np.asarray(predict(x_train, y_train, x_test, num_classes, l2_regs[0]))
  out["accuracy"] = float(np.mean(preds == y_test))
  out["l2_reg"] = float(l2_regs[0])
  return out


class LinearProbeEvaluator(_utils.Probe):
  """Ridge and logistic-regression probes of `fn(params, images) -> [B, R]` on a whole split.

  Metrics: `{name}/{probe}_accuracy` and `{name}/{probe}_l2_reg` for each probe, and
  `{name}/num_train`, `{name}/num_test`. `max_examples` caps how much of each split is read.
  """

  def __init__(
    self,
    *args,
    probes: Sequence[str] = ("ridge", "logreg"),
    ridge_l2_regs: Sequence[float] = RIDGE_L2_REGS,
    logreg_l2_regs: Sequence[float] = LOGREG_L2_REGS,
    val_fraction: float = 0.1,
    name: str = "linear",
    **kwargs,
  ):
    """`args` and `kwargs`: `_utils.Probe`'s."""
    unknown = set(probes) - set(PROBES)
    if unknown:
      raise ValueError(f"unknown probe(s) {sorted(unknown)}; known: {sorted(PROBES)}")
    super().__init__(*args, name=name, **kwargs)
    self.probes = tuple(probes)
    self.l2_regs = {"ridge": tuple(ridge_l2_regs), "logreg": tuple(logreg_l2_regs)}
    self.val_fraction = val_fraction

  def features(self, params: Any) -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test) on the host."""
    x_train, y_train = _utils.extract_features(self.fn, params, self.train_data, self.max_examples)
    x_test, y_test = _utils.extract_features(self.fn, params, self.test_data, self.max_examples)
    return x_train, y_train, x_test, y_test

  def score(self, x_train, y_train, x_test, y_test) -> dict[str, float]:
    """Fits every probe on given features; returns the metrics `run` returns."""
    results = {
      f"{self.name}/num_train": float(len(x_train)),
      f"{self.name}/num_test": float(len(x_test)),
    }
    for probe in self.probes:
      out = fit_and_score(
        probe,
        x_train,
        y_train,
        x_test,
        y_test,
        self.num_classes,
        self.l2_regs[probe],
        val_fraction=self.val_fraction,
        seed=self.seed,
      )
      for key, value in out.items():
        results[f"{self.name}/{probe}_{key}"] = value
    return results

  def run(self, params: Any) -> dict[str, float]:
    return self.score(*self.features(params))
