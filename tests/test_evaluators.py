"""Evaluators on in-memory data: few-shot equals a direct numpy solve, masks, probes, build."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import evaluators, models
from vit_jax.evaluators import _utils, classification, fewshot, linear


def _clusters(n, num_classes, dim, seed, spread=1.5):
  centres = np.random.default_rng(0).normal(size=(num_classes, dim)) * spread  # shared by splits
  rng = np.random.default_rng(seed)
  labels = rng.integers(num_classes, size=n)
  x = centres[labels] + rng.normal(size=(n, dim))
  return x.astype(np.float32), labels.astype(np.int32)


def _source(x, y, batch_size, one_hot=None):
  """A DataSource of batches whose 'image' [B, 1, 1, R] holds the features; last batch padded."""

  def source():
    for start in range(0, len(x), batch_size):
      xb, yb = x[start : start + batch_size], y[start : start + batch_size]
      n = len(xb)
      mask = np.concatenate([np.ones(n), np.zeros(batch_size - n)]).astype(np.float32)
      # Padding carries real-looking data; only the mask says it is not real.
      xb = np.concatenate([xb, np.full((batch_size - n, x.shape[1]), 7.0, np.float32)])
      yb = np.concatenate([yb, np.zeros(batch_size - n, np.int32)])
      if one_hot:
        yb = np.eye(one_hot, dtype=np.float32)[yb]
      yield {"image": xb[:, None, None, :], "label": yb, "mask": mask}

  return source


def _features(params, images):
  return jnp.reshape(images, (images.shape[0], -1)) * params["scale"]


def _numpy_fewshot_accuracy(
  x_train, y_train, x_test, y_test, num_classes, l2_reg, dtype=np.float64
):
  """The closed form written out independently: augmented system, unpenalised intercept; in
  `dtype` (float64: the exact scores, float32: the plain path's rounding)."""
  x_train, x_test = x_train.astype(dtype), x_test.astype(dtype)
  mean = x_train.mean(0)

  def norm(x):
    z = x - mean
    return z / np.linalg.norm(z, axis=1, keepdims=True)

  a = np.hstack([norm(x_train), np.ones((len(x_train), 1), dtype)])
  t = 2.0 * np.eye(num_classes, dtype=dtype)[y_train] - 1.0
  penalty = l2_reg * np.eye(a.shape[1], dtype=dtype)
  penalty[-1, -1] = 0.0
  wb = np.linalg.solve(a.T @ a + penalty, a.T @ t)
  scores = np.hstack([norm(x_test), np.ones((len(x_test), 1), dtype)]) @ wb
  assert scores.dtype == dtype
  return float(np.mean(np.argmax(scores, 1) == y_test)), scores


@pytest.mark.parametrize("max_cache_bytes", [2**30, 0])
def test_fewshot_equals_numpy_closed_form(max_cache_bytes):
  num_classes, dim = 5, 16
  x_tr, y_tr = _clusters(300, num_classes, dim, seed=0, spread=0.6)
  x_te, y_te = _clusters(203, num_classes, dim, seed=1, spread=0.6)
  params = {"scale": jnp.float32(3.0)}
  ev = fewshot.FewShotEvaluator(
    _features,
    _source(x_tr, y_tr, 32),
    _source(x_te, y_te, 32),
    num_classes,
    shots=(1, 5, 10, 25),  # 1-shot (5 rows < 16 dims) takes the dual form, 25-shot the primal
    l2_reg=0.5,
    seed=3,
    max_cache_bytes=max_cache_bytes,
  )
  results = ev.run(params)
  positions, labels = ev.sample()
  np.testing.assert_array_equal(labels, y_tr[positions])
  accs = []
  for k in (1, 5, 10, 25):
    idx = positions[ev.subset(k)]
    assert np.bincount(y_tr[idx], minlength=num_classes).tolist() == [k] * num_classes
    args = (3.0 * x_tr[idx], y_tr[idx], 3.0 * x_te, y_te, num_classes, 0.5)
    expected, scores = _numpy_fewshot_accuracy(*args)
    _, plain32 = _numpy_fewshot_accuracy(*args, dtype=np.float32)
    w, b, mean = fewshot.ridge_fit(3.0 * x_tr[idx], y_tr[idx], num_classes, 0.5)
    got = np.asarray(fewshot.ridge_scores(3.0 * x_te, w, b, mean))
    # Our float32 scores are as close to float64 as numpy's own float32 solve (within 2x, plus a
    # few ulps); a fixed tolerance would depend on the CPU's roundings.
    error, plain_error = (np.abs(np.float64(s) - scores).max() for s in (got, plain32))
    assert error <= 2 * plain_error + 8 * np.finfo(np.float32).eps * np.abs(scores).max()
    # The accuracy is the float64 one, except where a test point's top-2 score margin is within
    # the score error (twice it: both scores may move): such points may go either way.
    top2 = np.sort(scores, axis=1)[:, -2:]
    undecided = (top2[:, 1] - top2[:, 0]) <= 2 * max(error, plain_error)
    correct64 = np.argmax(scores, 1) == y_te
    assert abs(results[f"fewshot/{k}shot"] - expected) * len(y_te) <= undecided.sum() + 1e-3
    # The evaluator's float32 predictions agree with float64 on every decided point.
    preds = np.argmax(got, 1)
    np.testing.assert_array_equal((preds == y_te)[~undecided], correct64[~undecided])
    accs.append(expected)
  assert accs[-1] > accs[0]  # more shots help on these clusters
  assert accs[-1] > 0.6


def test_fewshot_sample_is_nested_seeded_and_never_padding():
  num_classes = 4
  x, y = _clusters(90, num_classes, 3, seed=5)

  def make(seed):
    return fewshot.FewShotEvaluator(
      _features, _source(x, y, 16), _source(x, y, 16), num_classes, shots=(2, 5), seed=seed
    )

  ev = make(0)
  positions, _ = ev.sample()
  assert positions.max() < len(x)  # the 6 padding rows of the last batch are never drawn
  two, five = set(positions[ev.subset(2)]), set(positions[ev.subset(5)])
  assert two < five and len(two) == 2 * num_classes and len(five) == 5 * num_classes
  np.testing.assert_array_equal(make(0).sample()[0], positions)
  assert not np.array_equal(make(1).sample()[0], positions)


def test_fewshot_sampling_is_uniform_over_the_split():
  # Reservoir sampling must not favour the start of the stream.
  y = np.zeros(200, np.int32)
  x = np.zeros((200, 2), np.float32)
  counts = np.zeros(200)
  for seed in range(200):
    ev = fewshot.FewShotEvaluator(_features, _source(x, y, 50), _source(x, y, 50), 1, shots=(5,))
    ev.seed = seed
    counts[ev.sample()[0]] += 1
  assert counts[:100].sum() == pytest.approx(counts[100:].sum(), rel=0.2)


def test_gather_rows_of_a_sharded_batch():
  # The multi-host path of the few-shot sample: only the sampled rows are gathered.
  mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  x = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
  sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
  for rows in ([5], [0, 15, 7], list(range(9))):
    np.testing.assert_array_equal(_utils.gather_rows(sharded, np.array(rows)), x[rows])


@pytest.mark.parametrize("one_hot", [None, 3])
def test_classification_honours_mask(one_hot):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(45, 3)).astype(np.float32)
  labels = rng.integers(3, size=45).astype(np.int32)
  ev = classification.ClassificationEvaluator(
    lambda p, images: jnp.reshape(images, (images.shape[0], -1)),
    _source(logits, labels, 20, one_hot=one_hot),  # 60 rows, 15 of them padding
    name="val",
  )
  got = ev.run({})
  logits64 = np.float64(logits)
  log_probs = logits64 - np.log(np.exp(logits64).sum(1, keepdims=True))
  assert got["val/num_examples"] == 45
  # argmax of the very logits the evaluator sees (no arithmetic, no ties): exact.
  assert got["val/accuracy"] == np.mean(logits.argmax(1) == labels)
  exact_loss = -np.mean(log_probs[np.arange(45), labels])
  # The plain float32 path (jax's log_softmax and a mean) sets the tolerance.
  plain = -jnp.mean(jax.nn.log_softmax(jnp.asarray(logits))[np.arange(45), labels])
  plain_error = abs(float(plain) - exact_loss)
  tol = 2 * plain_error + 8 * np.finfo(np.float32).eps * exact_loss
  assert abs(got["val/loss"] - exact_loss) <= tol


def test_classification_sigmoid_loss():
  logits = jnp.array([[2.0, -1.0], [0.0, 0.5]])
  labels = jnp.array([0, 0])
  sums = classification.batch_metrics(logits, labels, jnp.array([1.0, 0.0]), "sigmoid_xent")
  expected = np.log1p(np.exp(-2.0)) + np.log1p(np.exp(-1.0))  # float64
  # A few float32 roundings of two log1p(exp) terms and their sum: well within 16 ulps.
  assert abs(float(sums["loss"]) - expected) <= 16 * np.finfo(np.float32).eps * expected
  assert float(sums["correct"]) == 1.0 and float(sums["count"]) == 1.0


def test_linear_probes_recover_separable_problem():
  num_classes, dim = 4, 8
  rng = np.random.default_rng(0)
  w_true = rng.normal(size=(dim, num_classes))

  def data(n, seed):
    x = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    scores = x @ w_true
    top2 = np.sort(scores, 1)[:, -2:]
    keep = top2[:, 1] - top2[:, 0] > 0.5  # a margin: linearly separable with room to spare
    return x[keep], scores[keep].argmax(1).astype(np.int32)

  x_tr, y_tr = data(3000, 1)
  x_te, y_te = data(1000, 2)
  ev = linear.LinearProbeEvaluator(
    _features, _source(x_tr, y_tr, 128), _source(x_te, y_te, 128), num_classes, name="probe"
  )
  got = ev.run({"scale": jnp.float32(1.0)})
  assert got["probe/num_train"] == len(x_tr) and got["probe/num_test"] == len(x_te)
  assert got["probe/logreg_accuracy"] >= 0.98
  assert got["probe/ridge_accuracy"] >= 0.9  # least squares is not a max-margin fit
  assert got["probe/logreg_l2_reg"] in linear.LOGREG_L2_REGS
  assert got["probe/ridge_l2_reg"] in linear.RIDGE_L2_REGS
  # A huge penalty is picked against on the held-out slice, so it cannot be chosen here.
  out = linear.fit_and_score("logreg", x_tr, y_tr, x_te, y_te, num_classes, (1e-4, 1e3))
  assert out["l2_reg"] == 1e-4 and out["accuracy"] >= 0.98


def test_build_runs_every_kind_on_a_model():
  model = models.get_model("testing", num_classes=3)
  images = jnp.zeros((1, 8, 8, 3))
  params = model.init(jax.random.key(0), images, train=False)["params"]
  rng = np.random.default_rng(0)
  x = rng.uniform(-1, 1, size=(40, 8, 8, 3)).astype(np.float32)
  y = (np.arange(40) % 3).astype(np.int32)

  def make_data(dataset, split, batch_size):
    assert dataset["name"] == ("other" if split and split.startswith("fs") else "main")

    def source():
      for start in range(0, 40, batch_size):
        yield {
          "image": x[start : start + batch_size],
          "label": y[start : start + batch_size],
          "mask": np.ones(min(batch_size, 40 - start), np.float32),
        }

    return source

  evals = {
    "val": {"type": "classification", "every_steps": 10},
    "fs": {
      "type": "fewshot",
      "dataset": {"name": "other"},
      "train_split": "fs_train",
      "test_split": "fs_test",
      "shots": (1, 2),
    },
    "lin": {"type": "linear", "ridge_l2_regs": (1.0,), "logreg_l2_regs": (1e-3,)},
  }
  evs = evaluators.build(
    evals,
    model=model,
    dataset={"name": "main"},
    batch_size=8,
    make_data=make_data,
    num_classes=lambda ds: 3,
  )
  assert [e.name for e in evs] == ["val", "fs", "lin"]
  assert [e.every_steps for e in evs] == [10, 0, 0]
  metrics = {}
  for e in evs:
    metrics.update(e.run(params))
  assert metrics["val/num_examples"] == 40
  # The head is zero-initialised: every logit ties, argmax is class 0, a third are right.
  assert metrics["val/accuracy"] == pytest.approx(14 / 40)
  assert set(metrics) >= {"fs/1shot", "fs/2shot", "lin/ridge_accuracy", "lin/logreg_accuracy"}
  with pytest.raises(ValueError, match="type"):
    evaluators.build({"x": {"type": "nope"}}, model=model, make_data=make_data)
