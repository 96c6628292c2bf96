"""Masked patch prediction: corruption statistics, targets, SIGKILL-exact resume, fine-tuning.

Runs use the 'testing' model on 16px Fashion-MNIST / Animal-MNIST (offline `builtin` data) and
the 8 simulated CPU devices of conftest.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train import _assert_trees, _params, run_child

from vit_jax import checkpoint, models, train
from vit_jax.configs import pretrain_mpp
from vit_jax.models import mpp
from vit_jax.objectives import mpp as mpp_objective


def test_corruption_statistics():
  batch, n, width = 32, 196, 4
  x = jax.random.normal(jax.random.PRNGKey(0), (batch, n, width))
  mask_embedding = jnp.full((width,), 100.0)  # no patch embedding is near it
  corrupt = jax.jit(lambda k: mpp.corrupt(k, x, mask_embedding))
  kinds = np.stack([np.asarray(corrupt(jax.random.PRNGKey(i))[1]) for i in range(20)])
  # Exactly half of every image's patches are chosen, on every draw.
  np.testing.assert_array_equal((kinds != mpp.KEPT_CLEAN).sum(-1), n // 2)
  chosen = kinds[kinds != mpp.KEPT_CLEAN]  # 62,720 patches: σ of a 10% fraction ≈ 0.12%
  fractions = [np.mean(chosen == k) for k in (mpp.MASKED, mpp.RANDOM, mpp.KEPT_CORRUPTED)]
  np.testing.assert_allclose(fractions, [0.8, 0.1, 0.1], atol=0.005)
  # Every patch is chosen about as often as any other (no positional bias).
  per_patch = (kinds != mpp.KEPT_CLEAN).mean(axis=(0, 1))
  assert np.all(np.abs(per_patch - 0.5) < 0.1)

  out, kind = corrupt(jax.random.PRNGKey(7))
  out, kind = np.asarray(out), np.asarray(kind)
  x = np.asarray(x)
  keep = (kind == mpp.KEPT_CLEAN) | (kind == mpp.KEPT_CORRUPTED)
  np.testing.assert_array_equal(out[keep], x[keep])
  np.testing.assert_array_equal(out[kind == mpp.MASKED], 100.0)
  # A random patch is another patch of the same image, never itself.
  for b, i in zip(*np.nonzero(kind == mpp.RANDOM), strict=True):
    matches = np.nonzero(np.all(x[b] == out[b, i], axis=-1))[0]
    assert len(matches) == 1 and matches[0] != i


def _numpy_mean_colors(images, p):
  b, h, w, _ = images.shape
  out = np.zeros((b, (h // p) * (w // p)), np.int64)
  for n in range(b):
    k = 0
    for i in range(0, h - p + 1, p):
      for j in range(0, w - p + 1, p):
        mean = images[n, i : i + p, j : j + p].reshape(-1, 3).mean(0)  # in [-1, 1]
        r, g, bl = np.minimum(((mean + 1) / 2 * 8).astype(np.int64), 7)
        out[n, k] = r * 64 + g * 8 + bl
        k += 1
  return out


def test_targets_are_3bit_mean_colours():
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (3, 32, 48, 3)).astype(np.float32)
  images[0] = 1.0  # white: the top colour 511
  images[1, :, :, 0] = -1.0  # no red
  got = np.asarray(mpp.targets(jnp.asarray(images), 8, "mean_color"))
  want = _numpy_mean_colors(images, 8)
  np.testing.assert_array_equal(got, want)
  assert got.shape == (3, 24) and np.all(got[0] == 511) and np.all(got[1] < 64)
  # downsample4x4 of 8px patches: the mean colours of their 2×2 cells (= of 2px patches).
  cells = np.asarray(mpp.targets(jnp.asarray(images), 8, "downsample4x4"))  # [3, 24, 16]
  small = _numpy_mean_colors(images, 2).reshape(3, 4, 4, 6, 4)  # [b, row, cell row, col, cell col]
  np.testing.assert_array_equal(cells, small.transpose(0, 1, 3, 2, 4).reshape(3, 24, 16))
  assert np.asarray(mpp.targets(jnp.asarray(images), 8, "l2")).shape == (3, 24, 8 * 8 * 3)


def test_model_keeps_the_vit_layout_and_learns_only_from_corrupted_patches():
  config = models.get_model_config("testing")
  model = mpp.get_model(config, mpp.mpp_config())
  vit = models.get_model(config, 10)
  images = jax.random.uniform(jax.random.PRNGKey(0), (2, 16, 16, 3), minval=-1, maxval=1)
  params = model.init({"params": jax.random.PRNGKey(0)}, images, train=False)["params"]
  vit_params = vit.init({"params": jax.random.PRNGKey(0)}, images, train=False)["params"]
  assert set(params) - set(vit_params) == {"mask_embedding", "mpp_head"}
  assert set(vit_params) - set(params) == {"head"}
  assert params["mpp_head"]["kernel"].shape == (32, 512)
  logits, out = model.apply(
    {"params": params}, images, train=True, rngs={"mpp": jax.random.PRNGKey(1)}
  )
  kind = out["kind"]
  assert logits.shape == (2, 16, 512) and np.all((kind != 0).sum(-1) == 8)
  # Out of training nothing is corrupted: the pre-logits are the clean image's mean token.
  _, clean_out = model.apply({"params": params}, images, train=False)
  assert clean_out["pre_logits"].shape == (2, 32) and not np.any(clean_out["kind"])
  np.testing.assert_allclose(clean_out["pre_logits"], clean_out["tokens"].mean(axis=1))
  # The loss does not depend on the predictions of uncorrupted patches.
  loss, acc = mpp_objective.per_example_loss(logits, kind, images, 4, "mean_color")
  clean = (kind == mpp.KEPT_CLEAN)[..., None]
  noisy = jnp.where(clean, 1e3 * logits + 5.0, logits)
  loss2, acc2 = mpp_objective.per_example_loss(noisy, kind, images, 4, "mean_color")
  np.testing.assert_allclose(loss, loss2)
  np.testing.assert_allclose(acc, acc2)


def sigkill_config():
  """A runlocal MPP run without evaluators, on the 2×2×2 mesh, dropout on (see test_train)."""
  config = pretrain_mpp.get_config("dataset=fashion_mnist,runlocal")
  config.evals = {}
  config.total_steps = 8
  config.checkpoint.every_steps = 2
  config.checkpoint.keep = 10
  config.model.dropout_rate = 0.1
  config.accum_steps = 2
  config.mesh.update(data=2, fsdp=2, model=2)
  return config


@pytest.mark.slow  # the default tier resumes supervised runs after SIGKILL (test_train, test_faults)
def test_mpp_run_resumes_exactly_after_sigkill(tmp_path):
  """Masked patch prediction on data x fsdp x model, SIGKILLed while the asynchronous save of
  step 4 is written (the default run's kill during a save; tests/test_topology_invariance.py
  kills between steps), then killed again at the 3rd batch of its resumed run (repeated kills:
  the second resumes from whatever the first left committed), resumes bitwise. (Fine-tuning
  from an MPP run, which drops its parameters: tests/test_experiments_start.py's mpp_study
  run.)"""
  config = sigkill_config()
  metrics = train.run(config, str(tmp_path / "reference"))
  # The last log window: steps 7 and 8 (logged every 2) of 16 images each.
  assert metrics["examples"] == 2 * config.batch_size == 32 and np.isfinite(metrics["loss"])
  run_child("save", 4, tmp_path / "killed", config_fn="test_mpp:sigkill_config")
  run_child("batch", 3, tmp_path / "killed", config_fn="test_mpp:sigkill_config")
  resumed = train.run(config, str(tmp_path / "killed"))  # resumes and finishes
  # Same parameters and batches after the resume: the same loss and MPP accuracy, bit for bit.
  assert {k: resumed[k] for k in ("examples", "loss", "accuracy")} == {
    k: metrics[k] for k in ("examples", "loss", "accuracy")
  }
  reference = _params(tmp_path / "reference")
  assert {"mask_embedding", "mpp_head"} <= set(reference)
  _assert_trees(_params(tmp_path / "killed"), reference, exact=True)


def test_load_pretrained_drops_mpp_params_with_a_log_line(caplog):
  config = models.get_model_config("testing")
  images = jnp.zeros((1, 16, 16, 3))
  mpp_params = mpp.get_model(config, mpp.mpp_config()).init(
    {"params": jax.random.PRNGKey(0)}, images, train=False
  )["params"]
  vit_params = models.get_model(config, 5).init(
    {"params": jax.random.PRNGKey(1)}, images, train=False
  )["params"]
  with caplog.at_level("INFO"):
    loaded = checkpoint.load_pretrained(jax.device_get(mpp_params), vit_params, config)
  assert set(loaded) == set(vit_params)
  assert any("mpp_head" in r.message and "mask_embedding" in r.message for r in caplog.records)
  np.testing.assert_array_equal(loaded["embedding"]["kernel"], mpp_params["embedding"]["kernel"])


@pytest.mark.parametrize("target", ["downsample4x4", "l2"])
def test_other_targets_train(target):
  model = mpp.get_model(models.get_model_config("testing"), mpp.mpp_config(target=target))
  images = jax.random.uniform(jax.random.PRNGKey(0), (2, 8, 8, 3), minval=-1, maxval=1)
  params = model.init({"params": jax.random.PRNGKey(0)}, images, train=False)["params"]

  def loss(p):
    return jnp.mean(mpp_objective.objective(model, p, images, jax.random.PRNGKey(3))[0])

  grads = jax.jit(jax.grad(loss))(params)  # one program, not one per operation
  assert float(jnp.abs(grads["mask_embedding"]).sum()) > 0
  assert np.isfinite(float(jax.jit(loss)(params)))
