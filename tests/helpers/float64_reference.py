"""Float64 reference runs of the trainer, for tests that compare float32 runs between meshes.

Two float32 runs of the same config on different meshes (or process counts) sum in different
orders, and Adam's normalisation magnifies that rounding noise wherever a gradient is near zero,
by an amount that depends on the CPU's vector width (AVX2 and AVX-512 round differently). So
instead of comparing float32 runs with each other, the tests measure each run's deviation from
the same config trained in float64 (`run`), and require every run to be as close to it as the
one-device float32 run is (`assert_as_close_as`).

The float64 run is the trainer itself in a child process under JAX_ENABLE_X64, with the model's
dtype and param_dtype float64, and three things made equal to the float32 run's:
- initial parameters: the float32 initialisation, cast (float64 initialisers draw other bits);
- random draws (dropout masks, mixup's weight, MPP's corruption): float32 and int32, as in the
  float32 run (with x64 on, they would be 64-bit draws from other random bits);
- data: the same pipeline, images float32 until the model casts them.

Usable as `python -m tests.helpers.float64_reference <module:factory> <workdir>` from the
repository root: the factory (in a module importable from there or from tests/) returns the
float32 config.
"""

import importlib
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np

from tests.helpers import xla_env

REPO = pathlib.Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
  """
  import sys
  sys.path[:0] = [{repo!r}, {tests!r}]
  from tests.helpers import float64_reference
  float64_reference.main(sys.argv[1], sys.argv[2])
  """
)


def main(config_fn: str, workdir: str) -> None:
  """In a JAX_ENABLE_X64 process: trains `config_fn`'s config in float64 into `workdir`."""
  import jax.numpy as jnp

  from vit_jax.models import build
  from vit_jax.runtime import startup

  loop = startup.import_module("vit_jax.train.loop")  # as a command imports it
  from vit_jax.train import step as train_step

  assert jax.config.jax_enable_x64, "run under JAX_ENABLE_X64=1"
  # The trainer's configs name dtypes by string; float64 is no training dtype, only this one.
  build._DTYPES.setdefault("float64", jnp.float64)

  bernoulli = jax.random.bernoulli

  def float32_bernoulli(key, p=0.5, shape=None, *args, **kwargs):
    if isinstance(p, float):  # flax's Dropout passes the keep probability as a Python float
      p = np.float32(p)
    return bernoulli(key, p, shape, *args, **kwargs)

  jax.random.bernoulli = float32_bernoulli
  beta, uniform = jax.random.beta, jax.random.uniform

  def float32_beta(key, a, b, shape=None, dtype=None):  # mixup's weight
    return beta(key, a, b, shape, dtype or jnp.float32)

  def float32_uniform(key, shape=(), dtype=None, *args, **kwargs):  # MPP's corruption
    return uniform(key, shape, dtype or jnp.float32, *args, **kwargs)

  randint = jax.random.randint

  def int32_randint(key, shape, minval, maxval, dtype=None):  # MPP's replacement patches
    return randint(key, shape, minval, maxval, dtype or jnp.int32)

  jax.random.beta, jax.random.uniform = float32_beta, float32_uniform
  jax.random.randint = int32_randint

  build = train_step.build

  def float64_build(config, mesh, num_classes):
    config32 = config.copy_and_resolve_references()
    config32.model.dtype = config32.model.param_dtype = "float32"
    built32 = build(config32, mesh, num_classes)
    built = build(config, mesh, num_classes)

    def init_params(key):
      return jax.tree_util.tree_map(lambda x: x.astype(jnp.float64), built32.init_params(key))

    def init_state(key):
      params = init_params(key)
      state = dict(built.init_state(key), params=params, opt_state=built.tx.init(params))
      if "ema" in state:  # Polyak averaging starts at the initial parameters
        state["ema"] = params
      return state

    return built._replace(init_params=init_params, init_state=init_state)

  train_step.build = float64_build  # what the trainer's loop calls
  module, factory = config_fn.split(":")
  config = getattr(importlib.import_module(module), factory)()
  config.model.dtype = config.model.param_dtype = "float64"
  loop.run(config, workdir)


def run(config_fn: str, workdir: str | os.PathLike, devices: int = 1) -> None:
  """Trains `config_fn` ('module:factory' importable from the repository root or tests/) in float64 in a child process."""
  env = xla_env.child_env(devices, JAX_ENABLE_X64="1")
  code = _CHILD.format(repo=str(REPO), tests=str(REPO / "tests"))
  proc = subprocess.run(
    [sys.executable, "-c", code, config_fn, str(workdir)],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]


def max_deviation(params, reference) -> float:
  """max |params - reference| over all leaves (float64 arithmetic)."""
  leaves = jax.tree_util.tree_leaves(params)
  ref = jax.tree_util.tree_leaves(reference)
  assert len(leaves) == len(ref)
  return max(
    float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
    for a, b in zip(leaves, ref, strict=True)
  )


def rms_deviation(params, reference) -> float:
  """Root-mean-square of params - reference over every parameter (float64 arithmetic)."""
  leaves = jax.tree_util.tree_leaves(params)
  ref = jax.tree_util.tree_leaves(reference)
  assert len(leaves) == len(ref)
  squares = sum(
    float(np.sum(np.square(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
    for a, b in zip(leaves, ref, strict=True)
  )
  return float(np.sqrt(squares / sum(np.size(a) for a in ref)))


if __name__ == "__main__":
  sys.path[:0] = [str(REPO), str(REPO / "tests")]
  main(sys.argv[1], sys.argv[2])
