"""model.grad_reduce_dtype: the dtype in which a bf16 model's gradients leave the backward pass and
are summed across devices (vit_jax.models.ops.dense and broadcast_param).

The float32 path is held to float64 sums of the same bf16 products; the default path to plain
autodiff, bit for bit; the bytes on the wire to the TPU compiler's multi-slice step (libtpu);
experiments/grad_reduce.py's --quick profile to the committed results' fingerprint.
"""

import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import fingerprint, grad_reduce
from tests.helpers import experiment_run, trees
from tests.helpers.libtpu_process import libtpu_test
from vit_jax import models
from vit_jax.models import ops


def _normal(shape, seed, dtype=jnp.bfloat16):
  return jax.random.normal(jax.random.PRNGKey(seed), shape).astype(dtype)


def test_gradient_dtype_widens_only():
  assert ops.gradient_dtype(jnp.bfloat16, "float32") == jnp.float32
  assert ops.gradient_dtype(jnp.bfloat16, "bfloat16") == jnp.bfloat16
  assert ops.gradient_dtype(jnp.float32, "bfloat16") == jnp.float32
  assert ops.gradient_dtype(jnp.float16, "bfloat16") == jnp.float16
  assert ops.gradient_dtype(jnp.bfloat16, None) == jnp.bfloat16


def _dense_grads(reduce_dtype, x, kernel, bias, d_y, flatten=True):
  y, vjp = jax.vjp(lambda x, k, b: ops.dense(x, k, b, reduce_dtype, flatten), x, kernel, bias)
  return (y, *vjp(d_y))


@pytest.mark.parametrize("flatten", [True, False])
def test_dense_sums_the_weight_gradient_in_float32(flatten):
  x, d_y = _normal((4, 256, 48), 0), _normal((4, 256, 40), 1)  # [batch, tokens, in / out]
  kernel, bias = _normal((48, 40), 2, jnp.float32), _normal((40,), 3, jnp.float32)
  y16, dx16, dk16, db16 = _dense_grads("bfloat16", x, kernel, bias, d_y, flatten)
  y32, dx32, dk32, db32 = _dense_grads("float32", x, kernel, bias, d_y, flatten)
  # The forward pass and the input's gradient do not change; the parameters' gradients arrive
  # in their own dtype either way.
  np.testing.assert_array_equal(y32, y16)
  np.testing.assert_array_equal(dx32, dx16)
  assert dk16.dtype == dk32.dtype == db16.dtype == db32.dtype == jnp.float32
  rows, d_rows = np.float64(x).reshape(-1, 48), np.float64(d_y).reshape(-1, 40)
  for exact, wide, narrow in [
    (rows.T @ d_rows, dk32, dk16),
    (d_rows.sum(0), db32, db16),
  ]:
    scale = np.abs(exact).max()
    wide_err = np.abs(np.float64(wide) - exact).max() / scale
    narrow_err = np.abs(np.float64(narrow) - exact).max() / scale
    # float32 sums of 1,024 products: float32 rounding; bf16 results: bf16 rounding (2^-9).
    assert wide_err < 1e-5, wide_err
    assert narrow_err > 1e-4 and narrow_err > 30 * wide_err, (narrow_err, wide_err)


@pytest.mark.parametrize("flatten", [True, False])
def test_dense_default_is_plain_autodiff_bit_for_bit(flatten):
  x, d_y = _normal((2, 32, 48), 0), _normal((2, 32, 40), 1)
  kernel, bias = _normal((48, 40), 2, jnp.float32), _normal((40,), 3, jnp.float32)
  got = _dense_grads("bfloat16", x, kernel, bias, d_y, flatten)

  def plain(x, k, b):  # the layers' code before the option
    k, b = k.astype(x.dtype), b.astype(x.dtype)
    return ops.matmul_2d(x, k, b) if flatten else x @ k + b

  y, vjp = jax.vjp(plain, x, kernel, bias)
  for a, b in zip(got, (y, *vjp(d_y)), strict=True):
    np.testing.assert_array_equal(a, b)


def test_broadcast_param_sums_its_gradient_in_float32():
  param = _normal((1, 17, 24), 0, jnp.float32)  # a position embedding
  d_y = _normal((512, 17, 24), 1)

  def grad(reduce_dtype):
    out, vjp = jax.vjp(
      lambda p: ops.broadcast_param(p, d_y.shape, jnp.bfloat16, reduce_dtype), param
    )
    assert out.dtype == jnp.bfloat16 and out.shape == d_y.shape
    return vjp(d_y)[0]

  exact = np.float64(d_y).sum(0, keepdims=True)
  wide, narrow = grad("float32"), grad("bfloat16")
  assert wide.shape == narrow.shape == param.shape and wide.dtype == jnp.float32
  scale = np.abs(exact).max()
  assert np.abs(np.float64(wide) - exact).max() / scale < 1e-5
  assert np.abs(np.float64(narrow) - exact).max() / scale > 1e-4


def test_model_with_float32_reduction_computes_the_same_function():
  """The whole bf16 ViT: the same parameters, loss and forward pass; every gradient in float32,
  within bf16 rounding of the default path's."""
  images = _normal((8, 16, 16, 3), 0, jnp.float32)

  def run(reduce_dtype):
    model = models.get_model(
      "testing", 10, dtype="bfloat16", grad_reduce_dtype=reduce_dtype, representation_size=32
    )
    params = model.init(jax.random.PRNGKey(0), images, train=False)["params"]

    def loss(p):
      return jnp.sum(jnp.square(model.apply({"params": p}, images, train=False)[0]))

    return params, *jax.jit(jax.value_and_grad(loss))(params)

  p16, l16, g16 = run("bfloat16")
  p32, l32, g32 = run("float32")
  trees.assert_equal(p16, p32)
  assert l16 == l32
  for a, b in zip(jax.tree.leaves(g32), jax.tree.leaves(g16), strict=True):
    assert a.dtype == b.dtype == jnp.float32
    np.testing.assert_allclose(a, b, rtol=0.02, atol=0.02 * float(np.abs(b).max()) + 1e-6)


def test_an_unknown_reduction_dtype_is_one_line():
  with pytest.raises(ValueError, match=r"^model grad_reduce_dtype='float8'; expected one of"):
    models.get_model("testing", 10, grad_reduce_dtype="float8")


@pytest.mark.slow  # two multi-slice compiles, about 20 CPU seconds
@libtpu_test
def test_the_bytes_between_slices_follow_the_reduction_dtype():
  """The trainer's bf16 step on 2 slices of a v5e:2x2 (the TPU compiler): the gradients cross
  the slices in bf16 by default, in float32 (twice the bytes) with grad_reduce_dtype=float32."""
  from vit_jax.configs import pretrain
  from vit_jax.tools import plan as planner

  shares = {}
  for reduce_dtype in ("bfloat16", "float32"):
    config = pretrain.get_config("dataset=jft,model=testing,epochs=7,lr=1e-3")
    config.dataset.image_size, config.batch_size = 32, 64
    config.model.grad_reduce_dtype = reduce_dtype
    stats = planner.plan(config, "v5e:2x2", slices=2).stats
    shares[reduce_dtype] = {t: b / stats.dcn_bytes for t, b in stats.dcn_dtypes.items()}
    shares[reduce_dtype]["bytes"] = stats.dcn_bytes
  assert shares["bfloat16"].get("bf16", 0) > 0.9, shares
  assert shares["float32"].get("f32", 0) > 0.99, shares
  assert shares["float32"]["bytes"] > 1.8 * shares["bfloat16"]["bytes"], shares


COMMITTED = pathlib.Path(__file__).resolve().parent.parent / "experiments/results/grad_reduce"
COMMAND = "python -m experiments.grad_reduce"


@pytest.mark.slow  # five 8-step runs over eight simulated devices
def test_quick_experiment_matches_the_committed_fingerprint(tmp_path):
  """experiments/grad_reduce.py --quick as a user runs it (on the eight devices the command
  gives itself): one row per run, and its numbers are the committed results' fingerprint
  (experiments/fingerprint.py)."""
  experiment_run.run("grad_reduce", "--quick", f"--workdir={tmp_path}")
  results = json.loads((tmp_path / "results" / "results.json").read_text())
  assert list(results["runs"]) == [f"run{i}" for i in range(len(grad_reduce.RUNS))]
  assert (tmp_path / "results" / "table.md").read_text().strip() == grad_reduce.table(results)
  for run in results["runs"].values():
    assert run["metrics"]["step"] == 8 and math.isfinite(run["metrics"]["loss"])
  committed = json.loads((COMMITTED / "results.json").read_text())
  fingerprint.check(committed, results, COMMAND)


def test_the_committed_results_were_made_with_todays_full_configs():
  committed = json.loads((COMMITTED / "results.json").read_text())
  fingerprint.check_configs(committed, fingerprint.configs(grad_reduce.stage_flags(False)), COMMAND)
