"""Two model parts of the "better plain ViT baselines" (Beyer et al., 2022) and AugReg (Steiner
et al., 2021) recipes, off by default (vit_jax.models.vit):

- `posemb='sincos2d'`: the table against the formula written out again in float64; the model
  against the float64 numpy forward pass (tests/helpers/numpy_vit.py) given that table as its
  position embedding, on non-square grids, with scan and for a hybrid; its checkpoints: written
  with the table in the published layout and read by a `posemb='learn'` model as the same
  function, a learned table refused by a sincos2d model and a table-less checkpoint by a learned
  one, another resolution without resizing, the architecture coming back as sincos2d;
- `stochastic_depth`: nothing changes at rate 0 or in evaluation; each block's share of dropped
  branches follows the linear schedule (binomial bounds); a block and the whole model against the
  float64 reference given the decisions, a dropped example's block being the identity; the
  decisions follow the example ids (a batch split in halves, rows permuted) and are the same
  with scan and remat as without, and in float64;
- both through the entry point (`python -m vit_jax.main`), whose workdir comes back as sincos2d.
"""

import json
import logging
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests.helpers import REPO, numpy_vit, trees, xla_env
from vit_jax import checkpoint, models
from vit_jax.models import vit
from vit_jax.train import model_init

POSEMB = checkpoint.POSEMB
_EPS32 = float(np.finfo(np.float32).eps)
# Relative to max |reference|, as in tests/test_reference_forward.py (which measured 1.2-8.7 eps
# for these small models): generous for any float32 evaluation, far below a structural mistake.
FLOAT32_TOLERANCE = 300 * _EPS32
FLOAT64_TOLERANCE = 1e-10
_WIDTH = 32  # the 'testing' preset's
_HYBRID = dict(patch_size=1, resnet=dict(num_layers=(2, 1), width_factor=0.5))


def _relative_error(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.abs(got - want).max() / np.abs(want).max())


def _random_params(model, images, seed=1):
  """Every parameter random, float32 numpy (norm scales around 1): no zero head or class token."""
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), images)
  rng = np.random.default_rng(seed)

  def value(path, leaf):
    mean = np.float32(path[-1].key == "scale")
    return mean + np.float32(0.3) * rng.standard_normal(leaf.shape, np.float32)

  return jax.tree_util.tree_map_with_path(value, shapes["params"])


def _images(batch, height, width, seed=2):
  return np.random.default_rng(seed).uniform(-1, 1, (batch, height, width, 3)).astype(np.float32)


def _apply(model, params, images, key=None, ids=None, **kw):
  """Logits (and the `intermediates` with key: training, stochastic depth's decisions sown)."""
  if key is None:
    return np.asarray(
      jax.jit(lambda p, x: model.apply({"params": p}, x, train=False, **kw)[0])(params, images)
    )

  @jax.jit
  def train(p, x, k, i):
    return model.apply(
      {"params": p}, x, train=True, rngs={"dropout": k}, example_ids=i, mutable=["intermediates"]
    )

  (logits, _), state = train(params, images, key, np.arange(len(images)) if ids is None else ids)
  return np.asarray(logits), jax.tree.map(np.asarray, state["intermediates"])


def _sincos_reference(grid, width):
  """big_vision's posemb_sincos_2d written out element by element in float64: the token of row
  y, column x (row-major), frequency k of width/4 going from 1 to 1/10000 geometrically, gets
  sin(x w_k), cos(x w_k), sin(y w_k), cos(y w_k) in the four quarters of its channels."""
  quarter = width // 4
  table = np.zeros((grid[0] * grid[1], width))
  for y in range(grid[0]):
    for x in range(grid[1]):
      for k in range(quarter):
        w_k = 10_000.0 ** (-k / (quarter - 1))
        row = table[y * grid[1] + x]
        row[k], row[quarter + k] = math.sin(x * w_k), math.cos(x * w_k)
        row[2 * quarter + k], row[3 * quarter + k] = math.sin(y * w_k), math.cos(y * w_k)
  return table


def _with_table(params, grid, prefix, table=None):
  """float64 parameters (blocks unstacked) with `table` (default: the sincos2d reference for
  `grid`, zero rows for the `prefix` tokens) as the learned position embedding."""
  table = _sincos_reference(grid, _WIDTH) if table is None else table
  flat = checkpoint.flatten_params(checkpoint.unstack_encoder_blocks(params))
  flat[POSEMB] = np.concatenate([np.zeros((prefix, _WIDTH)), table])[None]
  return numpy_vit.as_float64(checkpoint.unflatten_params(flat))


def _keep(intermediates, num_layers):
  """Stochastic depth's decisions, bool [layers, 2 branches, batch], scanned or not."""
  encoder = intermediates["Transformer"]
  if "encoderblock" in encoder:
    return encoder["encoderblock"]["drop_path_keep"][0]
  return np.stack([encoder[f"encoderblock_{i}"]["drop_path_keep"][0] for i in range(num_layers)])


def _scales(keep, rates):
  """The reference's branch scales [layers, 2, batch]: 1/(1 - rate) where kept, else 0 (the
  rate rounded to float32, as the model holds it)."""
  rates = np.float64(np.float32(rates))
  return keep / (1.0 - rates)[:, None, None]


# ---------------------------------------------------------------------------------------------
# posemb='sincos2d'


def test_sincos2d_table_is_the_formula():
  table = vit.sincos2d_posemb((3, 5), 16)  # a non-square grid: rows and columns not swapped
  assert table.shape == (15, 16) and table.dtype == np.float64
  np.testing.assert_allclose(table, _sincos_reference((3, 5), 16), rtol=0, atol=1e-15)
  # The first token (row 0, column 0): sines 0, cosines 1; the lowest frequency is 1/10000.
  np.testing.assert_array_equal(table[0], np.repeat([0.0, 1.0, 0.0, 1.0], 4))
  assert table[4, 3] == math.sin(4 / 10_000.0) and table[10, 11] == math.sin(2 / 10_000.0)
  # The class token's row is zero; the grid follows it.
  fixed = vit.fixed_posemb((3, 5), 16, 1)
  assert fixed.shape == (1, 16, 16)
  np.testing.assert_array_equal(fixed[0, 0], 0.0)
  np.testing.assert_array_equal(fixed[0, 1:], table)
  for width in (30, 4):
    with pytest.raises(ValueError, match=f"posemb='sincos2d' needs hidden_size .* got {width}"):
      vit.sincos2d_posemb((2, 2), width)


# name -> (overrides of the 'testing' preset, image height and width, patch grid, prefix tokens).
_CASES = {
  "token": (dict(), (16, 24), (4, 6), 1),
  "gap": (dict(classifier="gap"), (16, 24), (4, 6), 0),
  "scan": (dict(scan=True, remat=True), (24, 16), (6, 4), 1),
  # 32x24 → /2 (root conv), /2 (pool), /2 (the second stage): a 4x3 grid of 1x1 patches.
  "hybrid": (_HYBRID, (32, 24), (4, 3), 1),
}


@pytest.mark.parametrize("name", list(_CASES))
def test_sincos2d_model_is_the_reference_with_the_fixed_table(name):
  """The sincos2d model is the numpy reference ViT whose position embedding is the formula's
  table (zeros for the class token), and that table has no parameter."""
  overrides, (h, w), grid, prefix = _CASES[name]
  model = models.get_model("testing", 5, posemb="sincos2d", **overrides)
  images = _images(2, h, w)
  params = _random_params(model, images)
  assert "posembed_input" not in params["Transformer"]
  logits = _apply(model, params, images)
  reference = numpy_vit.forward(_with_table(params, grid, prefix), images)
  assert _relative_error(logits, reference) <= FLOAT32_TOLERANCE
  if name == "token":  # not vacuous: a transposed grid, or no table, is far off
    transposed = _sincos_reference(grid[::-1], _WIDTH)
    for table in (transposed, np.zeros_like(transposed)):
      wrong = numpy_vit.forward(_with_table(params, grid, prefix, table), images)
      assert _relative_error(logits, wrong) > 100 * FLOAT32_TOLERANCE


@pytest.mark.parametrize("name", ["token", "hybrid"])
def test_a_saved_sincos2d_model_reads_as_a_learned_one(name, tmp_path, caplog):
  """`with_posemb_table` then `save`: the published layout, with the table of the published
  shape, which a `posemb='learn'` model (and `load_model` without a config) reads as the same
  function; read back into a sincos2d model, the table is recognised and left out."""
  overrides, (h, w), grid, prefix = _CASES[name]
  sincos = models.get_model("testing", 5, posemb="sincos2d", **overrides)
  images = _images(2, h, w)
  params = _random_params(sincos, images)
  config = models.get_model_config("testing")
  config.update(dict(overrides, posemb="sincos2d"))
  path = tmp_path / "sincos.npz"
  checkpoint.save(checkpoint.with_posemb_table(params, config, (h, w)), path)
  with np.load(path) as npz:
    assert npz[POSEMB].shape == (1, prefix + grid[0] * grid[1], _WIDTH)
    assert npz[POSEMB].dtype == np.float32
  reference = numpy_vit.forward(_with_table(params, grid, prefix), images)
  learned = models.get_model("testing", 5, **overrides)  # posemb='learn'
  loaded = checkpoint.load_model(path)  # the architecture from the shapes
  for model, p in [
    (sincos, params),
    (learned, checkpoint.load(path)),
    (loaded.model, loaded.params),
  ]:
    assert _relative_error(_apply(model, p, images), reference) <= FLOAT32_TOLERANCE
  assert loaded.model.posemb == "learn" and POSEMB in checkpoint.flatten_params(loaded.params)
  # Into a sincos2d model: the same parameters as before saving, the table left out (one line).
  init = jax.tree.map(np.zeros_like, params)
  with caplog.at_level(logging.INFO):
    back = checkpoint.load_pretrained(path, dict(init, head=params["head"]), config)
  trees.assert_equal(back, params)
  assert [r.levelno for r in caplog.records if "is the sincos2d table" in r.message] == [
    logging.INFO
  ]


def test_sincos2d_fine_tunes_at_another_resolution_without_resizing(tmp_path):
  """A sincos2d checkpoint (with or without its table) loads into a sincos2d model at another
  resolution unchanged, and the model there is the reference with that grid's table."""
  model = models.get_model("testing", 5, posemb="sincos2d")
  small, large = _images(2, 16, 16), _images(2, 24, 32)
  params = _random_params(model, small)
  config = models.get_model_config("testing")
  config.posemb = "sincos2d"
  checkpoint.save(params, tmp_path / "plain.npz")
  checkpoint.save(checkpoint.with_posemb_table(params, config, 16), tmp_path / "table.npz")
  init = jax.tree.map(np.zeros_like, _random_params(model, large))
  for name in ("plain.npz", "table.npz"):
    adapted = checkpoint.load_pretrained(tmp_path / name, dict(init, head=params["head"]), config)
    trees.assert_equal(adapted, params)
  for images, grid in ((small, (4, 4)), (large, (6, 8))):
    reference = numpy_vit.forward(_with_table(params, grid, 1), images)
    assert _relative_error(_apply(model, params, images), reference) <= FLOAT32_TOLERANCE


def test_a_learned_table_into_a_sincos2d_model_and_back_are_refused_in_one_line(tmp_path):
  """A learned table would be thrown away by a sincos2d model, and a checkpoint without one
  cannot fill a learned model: each is one line naming posemb."""
  learned = models.get_model("testing", 5)
  images = _images(1, 16, 16)
  params = _random_params(learned, images)
  checkpoint.save(params, tmp_path / "learned.npz")
  sincos = learned.clone(posemb="sincos2d")
  config = models.get_model_config("testing")
  config.posemb = "sincos2d"
  init = _random_params(sincos, images)
  for refuse in (
    lambda: checkpoint.load_pretrained(tmp_path / "learned.npz", init, config),
    lambda: checkpoint.fit_posemb(params, sincos, config, 16),  # the linear probe's, predict's
  ):
    with pytest.raises(ValueError) as e:
      refuse()
    message = str(e.value)
    assert "\n" not in message and "learned position embedding table" in message, message
    assert "posemb='sincos2d'" in message and "config.model.posemb" in message
  checkpoint.save(init, tmp_path / "sincos.npz")  # (with a warning: no table)
  learned_config = models.get_model_config("testing")
  for refuse in (
    lambda: checkpoint.load_pretrained(tmp_path / "sincos.npz", params, learned_config),
    lambda: checkpoint.fit_posemb(init, learned, learned_config, 16),
  ):
    with pytest.raises(ValueError) as e:
      refuse()
    assert "\n" not in str(e.value) and "posemb='sincos2d'" in str(e.value)


def test_the_architecture_of_a_sincos2d_checkpoint_comes_back(tmp_path):
  """Without a table the shapes say sincos2d; a saved config says so too, and `model_from_init`
  keeps it, with the stage's own stochastic depth."""
  model = models.get_model("testing", 5, posemb="sincos2d")
  params = _random_params(model, _images(1, 16, 16))
  assert checkpoint.model_config_from_params(params).posemb == "sincos2d"
  learned = _random_params(model.clone(posemb="learn"), _images(1, 16, 16))
  assert checkpoint.model_config_from_params(learned).posemb == "learn"
  run = tmp_path / "run"
  run.mkdir()
  config = models.get_model_config("testing")
  config.update(dict(posemb="sincos2d", dropout_rate=0.1))
  (run / "config.json").write_text(json.dumps({"model": config.to_dict()}))
  checkpoint.save(params, run / "params.npz")
  loaded = checkpoint.load_model(run / "params.npz")
  assert loaded.model.posemb == "sincos2d" and loaded.model_config.dropout_rate == 0.1
  stage = ml_collections.ConfigDict(
    dict(model=models.get_model_config("testing"), model_init=str(run / "params.npz"))
  )
  stage.model.stochastic_depth = 0.2
  new = model_init.with_init_architecture(stage)
  assert new.model.posemb == "sincos2d" and new.model.stochastic_depth == 0.2


# ---------------------------------------------------------------------------------------------
# stochastic_depth


def test_the_schedule_is_linear_from_zero():
  np.testing.assert_allclose(vit.stochastic_depth_rates(0.6, 4), [0.0, 0.2, 0.4, 0.6], atol=1e-15)
  np.testing.assert_array_equal(vit.stochastic_depth_rates(0.3, 1), [0.0])


def test_stochastic_depth_off_or_in_evaluation_changes_nothing():
  """Rate 0 draws nothing (no decisions sown; the other dropout masks as they were), and the
  rate does not matter in evaluation: bitwise."""
  model = models.get_model("testing", 4, dropout_rate=0.1)
  images = _images(8, 16, 16)
  params = _random_params(model, images)
  on = model.clone(stochastic_depth=0.5)
  np.testing.assert_array_equal(_apply(on, params, images), _apply(model, params, images))
  key = jax.random.key(7)
  plain, state = _apply(model, params, images, key)
  assert "drop_path_keep" not in str(jax.tree_util.tree_structure(state))
  # A rate so small that every branch is kept with a scale of exactly 1 in float32: the same
  # logits bitwise, so turning stochastic depth on leaves the dropout masks as they were.
  tiny, state = _apply(model.clone(stochastic_depth=1e-9), params, images, key)
  assert _keep(state, 2).all()
  np.testing.assert_array_equal(tiny, plain)


def test_share_of_dropped_branches_follows_the_schedule():
  """4,000 examples (4x4 images: one patch and the class token) through three blocks at rates
  0, 0.3, 0.6: each branch's share of drops within 5 binomial standard deviations of its rate,
  the two branches and the blocks deciding independently."""
  n, rates = 4000, vit.stochastic_depth_rates(0.6, 3)
  model = models.get_model("testing", 2, num_layers=3, stochastic_depth=0.6)
  images = _images(n, 4, 4)
  _, state = _apply(model, _random_params(model, images), images, jax.random.key(3))
  dropped = ~_keep(state, 3)  # [layers, 2, n]

  def within(share, p):
    return abs(share - p) <= 5 * math.sqrt(p * (1 - p) / n)

  assert not dropped[0].any()  # rate 0 at the first block
  for i in (1, 2):
    r = rates[i]
    for b in (0, 1):
      assert within(dropped[i, b].mean(), r), (i, b, dropped[i, b].mean(), r)
    assert within((dropped[i, 0] & dropped[i, 1]).mean(), r * r)
  assert within((dropped[1, 1] & dropped[2, 1]).mean(), rates[1] * rates[2])


def test_a_dropped_branch_is_the_identity_and_a_kept_one_scaled():
  """One block at rate 0.5 on 64 examples: where both branches are dropped the output is the
  input bitwise; every example equals the float64 reference block with its branches scaled by
  1/(1 - rate) or 0 as decided."""
  block = vit.Encoder1DBlock(mlp_dim=64, num_heads=2)
  rng = np.random.default_rng(4)
  x = rng.standard_normal((64, 5, _WIDTH)).astype(np.float32)
  shapes = jax.eval_shape(lambda: block.init(jax.random.key(0), x, True))["params"]
  params = jax.tree_util.tree_map_with_path(
    lambda path, leaf: (
      np.float32(path[-1].key == "scale")
      + np.float32(0.3) * rng.standard_normal(leaf.shape, np.float32)
    ),
    shapes,
  )
  rate = np.float32(0.5)

  @jax.jit
  def run(p, x):
    drop_path = (jnp.float32(rate), jax.random.key(11))
    return block.apply({"params": p}, x, False, None, drop_path, mutable=["intermediates"])

  out, state = run(params, x)
  keep = np.asarray(state["intermediates"]["drop_path_keep"][0])  # [2, 64]
  combos = {tuple(k) for k in keep.T}
  assert combos == {(True, True), (True, False), (False, True), (False, False)}
  both = ~keep[0] & ~keep[1]
  np.testing.assert_array_equal(np.asarray(out)[both], x[both])
  scales = keep / (1.0 - np.float64(rate))
  reference = numpy_vit.encoder_block(np.float64(x), numpy_vit.as_float64(params), True, scales)
  assert _relative_error(out, reference) <= FLOAT32_TOLERANCE
  unscaled = numpy_vit.encoder_block(np.float64(x), numpy_vit.as_float64(params), True, keep)
  assert _relative_error(out, unscaled) > 100 * FLOAT32_TOLERANCE  # the scale is applied


def test_decisions_follow_the_example_ids():
  """The decisions and logits of a batch, of its two halves and of its rows permuted (each with
  its examples' ids), and of the float64 model, are the same example by example; all match the
  float64 reference given the decisions."""
  model = models.get_model("testing", 4, num_layers=3, stochastic_depth=0.5)
  images = _images(16, 16, 16)
  params = _random_params(model, images)
  ids = np.arange(16) * 7 + 3
  key = jax.random.key(5)
  logits, state = _apply(model, params, images, key, ids)
  keep = _keep(state, 3)
  assert not keep.all() and keep.any()
  reference = numpy_vit.forward(
    params, images, branch_scales=_scales(keep, vit.stochastic_depth_rates(0.5, 3))
  )
  assert _relative_error(logits, reference) <= FLOAT32_TOLERANCE
  halves = [_apply(model, params, images[s], key, ids[s]) for s in (slice(0, 8), slice(8, 16))]
  np.testing.assert_array_equal(np.concatenate([_keep(s, 3) for _, s in halves], -1), keep)
  assert _relative_error(np.concatenate([h for h, _ in halves]), reference) <= FLOAT32_TOLERANCE
  perm = np.random.default_rng(0).permutation(16)
  permuted, state = _apply(model, params, images[perm], key, ids[perm])
  np.testing.assert_array_equal(_keep(state, 3), keep[..., perm])
  assert _relative_error(permuted, reference[perm]) <= FLOAT32_TOLERANCE
  with jax.enable_x64(True):  # float64 draws the float32 run's decisions
    model64 = model.clone(
      dtype=jnp.float64, param_dtype=jnp.float64, attention_kernel="xla", layer_norm_kernel="xla"
    )
    logits64, state = _apply(model64, numpy_vit.as_float64(params), np.float64(images), key, ids)
  np.testing.assert_array_equal(_keep(state, 3), keep)
  assert _relative_error(logits64, reference) <= FLOAT64_TOLERANCE


def test_scan_and_remat_make_the_same_decisions():
  """scan=True (with remat), the unrolled blocks and the unrolled blocks with remat: the same
  decisions, logits within float32 error of the float64 reference, and the scanned model's
  gradients within float32 error of the float64 model's."""
  unrolled = models.get_model("testing", 4, num_layers=3, stochastic_depth=0.5)
  scanned = unrolled.clone(scan=True, remat=True)
  images = _images(8, 16, 16)
  params = _random_params(unrolled, images)
  stacked = checkpoint.stack_encoder_blocks(params)
  key = jax.random.key(9)
  logits, state = _apply(unrolled, params, images, key)
  keep = _keep(state, 3)
  assert not keep.all()
  reference = numpy_vit.forward(
    params, images, branch_scales=_scales(keep, vit.stochastic_depth_rates(0.5, 3))
  )
  assert _relative_error(logits, reference) <= FLOAT32_TOLERANCE
  for model, p in ((scanned, stacked), (unrolled.clone(remat=True), params)):
    other_logits, other_state = _apply(model, p, images, key)
    np.testing.assert_array_equal(_keep(other_state, 3), keep)
    assert _relative_error(other_logits, reference) <= FLOAT32_TOLERANCE

  def grads(model, p, x):
    def loss(p):
      logits, _ = model.apply({"params": p}, x, train=True, rngs={"dropout": key})
      return jnp.sum(logits**2)

    return jax.jit(jax.grad(loss))(p)

  with jax.enable_x64(True):
    exact = grads(
      unrolled.clone(dtype=jnp.float64, param_dtype=jnp.float64),
      numpy_vit.as_float64(params),
      np.float64(images),
    )
    exact = checkpoint.flatten_params(exact)  # numpy float64
  got = checkpoint.flatten_params(
    checkpoint.unstack_encoder_blocks(grads(scanned, stacked, images))
  )
  scale = max(np.abs(g).max() for g in exact.values())
  assert max(np.abs(got[k] - exact[k]).max() for k in exact) <= FLOAT32_TOLERANCE * scale


def test_bad_values_are_one_line_errors():
  images = _images(1, 16, 16)
  for overrides, match in [
    (dict(posemb="sincos"), r"posemb='sincos'; expected one of \('learn', 'sincos2d'\)"),
    (dict(stochastic_depth=1.0), r"stochastic_depth=1.0; expected a rate in \[0, 1\)"),
    (dict(posemb="sincos2d", hidden_size=30), r"posemb='sincos2d' needs hidden_size"),
  ]:
    model = models.get_model("testing", 2, **overrides)
    with pytest.raises(ValueError, match=match):
      model.init(jax.random.key(0), images, train=False)


# ---------------------------------------------------------------------------------------------
# Through the entry point.


def test_main_trains_with_both_and_its_workdir_comes_back_as_sincos2d(tmp_path):
  """`python -m vit_jax.main` on the demo config with `--config.model.posemb=sincos2d
  --config.model.stochastic_depth=0.1` (four steps; about 19 s on the 2-core development
  machine, most of it the child's start and compile); its Orbax workdir loads as a sincos2d
  model, and a fine-tune taking the architecture from it (`model_from_init`) stays sincos2d."""
  workdir = tmp_path / "pretrain"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "vit_jax.main",
      "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
      "--config.total_steps=4",
      "--config.batch_size=8",
      "--config.evals.fewshot_animal_mnist.every_steps=-1",
      "--config.evals.fewshot_mnist_5k.every_steps=-1",
      "--config.model.posemb=sincos2d",
      "--config.model.stochastic_depth=0.1",
      f"--workdir={workdir}",
    ],
    env=xla_env.child_env(1, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu"),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  loaded = checkpoint.load_model(workdir)
  assert loaded.model.posemb == "sincos2d" and loaded.model.stochastic_depth == 0.1
  assert "posembed_input" not in loaded.params["Transformer"]
  images = _images(2, 16, 24)  # a grid the run never saw: no table to resize
  assert np.isfinite(_apply(loaded.model, loaded.params, images)).all()
  stage = ml_collections.ConfigDict(
    dict(model=models.get_model_config("testing"), model_init=str(workdir))
  )
  assert model_init.with_init_architecture(stage).model.posemb == "sincos2d"

  # What reads a workdir reads a sincos2d one: predict at the saved size, the conversion to the
  # published layout (the table written, read by a learned model to the same logits), and the
  # analysis (its position-embedding figure from that table).
  from vit_jax import inference  # noqa: PLC0415
  from vit_jax.analysis import capture  # noqa: PLC0415
  from vit_jax.tools import convert  # noqa: PLC0415

  classifier = inference.Classifier(str(workdir))
  assert classifier.image_size == 16
  native = _images(2, 16, 16)
  written = convert.convert(str(workdir), str(tmp_path / "npz"), to="npz")
  as_learned = ml_collections.ConfigDict(loaded.model_config.to_dict())
  as_learned.posemb = "learn"
  learned = checkpoint.load_model(written["weights"], as_learned)
  assert learned.model.posemb == "learn"
  np.testing.assert_allclose(
    _apply(learned.model, learned.params, native),
    _apply(loaded.model, loaded.params, native),
    atol=1e-5,
  )
  subject = capture.load(str(workdir))
  assert subject.grid == subject.posemb_grid == (4, 4)
  table = subject.checkpoint_params["Transformer"]["posembed_input"]["pos_embedding"]
  np.testing.assert_allclose(table, vit.fixed_posemb((4, 4), 32, 1), atol=1e-6)
