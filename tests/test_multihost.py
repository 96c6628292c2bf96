"""Two processes over 127.0.0.1 (4 CPU devices each) train like one process with 8 devices, and
a two-process run killed mid-run resumes on two processes to the same parameters, bitwise.

Each process runs the real entry point (`python -m vit_jax.main` with a coordinator address,
tests/local_cluster.py) and reads its own half of every batch; the global batch holds the same
examples as in the one-process run (in another row order), so with no dropout and no random
augmentation the final parameters agree up to summation order.
"""

import os
import pathlib
import sys
import textwrap

import float64_reference  # tests/
import jax
import local_cluster  # tests/
import numpy as np
import pytest

from configs import pretrain
from vit_jax import sharding, train
from vit_jax.checkpoint import train_state

REPO = pathlib.Path(__file__).resolve().parents[1]
PP_TRAIN = "decode|resize|value_range(-1, 1)"
MESH = dict(data=2, fsdp=2, model=2)
OVERRIDES = [f"--config.mesh.{k}={v}" for k, v in MESH.items()] + [
  f"--config.dataset.pp_train={PP_TRAIN}",
  "--config.evals.val.every_steps=0",  # evaluators (over both hosts) at the end only
  "--config.evals.fewshot_animal_mnist.every_steps=0",
  "--config.evals.fewshot_mnist_5k.every_steps=0",
]

# `python -m vit_jax.main` that SIGKILLs itself when fetching its `at`-th batch (argv[1]),
# between two steps; the rest of argv goes to main.
_KILLED_MAIN = textwrap.dedent(
  """
  import os, signal, sys
  from absl import app
  from vit_jax import input_pipeline, main
  at = int(sys.argv.pop(1))
  fetch, count = input_pipeline.TrainIterator.__next__, [0]
  def killing_next(self):
    count[0] += 1
    if count[0] == at:
      os.kill(os.getpid(), signal.SIGKILL)
    return fetch(self)
  input_pipeline.TrainIterator.__next__ = killing_next
  sys.argv[0] = 'vit_jax.main'
  app.run(main.main)
  """
)


def one_process_config():
  """The two-process run's config for one process (the float64 child builds it by name)."""
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  config.mesh.update(MESH)
  config.dataset.pp_train = PP_TRAIN
  config.evals = {}
  return config


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
  """The three two-process launches compile the same programs: cache them on disk."""
  path = str(tmp_path_factory.mktemp("jax_cache"))
  os.environ["VIT_JAX_TEST_CACHE"] = path
  yield path
  os.environ.pop("VIT_JAX_TEST_CACHE", None)


def _two_processes(workdir, extra=(), kill_at=None):
  """Runs the entry point on two processes into `workdir`; returns [(returncode, output)]."""
  env = dict(
    os.environ,
    XLA_FLAGS="--xla_force_host_platform_device_count=4",
    JAX_COMPILATION_CACHE_DIR=os.environ["VIT_JAX_TEST_CACHE"],
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  head = [sys.executable, "-m", "vit_jax.main"]
  if kill_at is not None:
    head = [sys.executable, "-c", _KILLED_MAIN, str(kill_at)]

  def command(port, i):
    return [
      *head,
      "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
      f"--workdir={workdir}",
      f"--coordinator_address=127.0.0.1:{port}",
      "--num_processes=2",
      f"--process_id={i}",
      *OVERRIDES,
      *extra,
    ]

  return local_cluster.launch(command, cwd=REPO, env=env)


def _assert_ok(results):
  for i, (code, out) in enumerate(results):
    assert code == 0, f"process {i}:\n{out[-4000:]}"


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
  """The uninterrupted two-process run's workdir."""
  workdir = tmp_path_factory.mktemp("two")
  results = _two_processes(workdir)
  _assert_ok(results)
  assert "process 1 of 2" in results[1][1]
  return workdir


def test_two_processes_match_one(two_process_run, tmp_path):
  """Two processes train as accurately as one: each run's largest deviation from the same
  training in float64 (tests/float64_reference.py) is within twice the one-process run's (plus
  a few float32 ulps). A fixed tolerance between the float32 runs would test how Adam magnifies
  their summation-order noise, which depends on the CPU (AVX2 or AVX-512)."""
  train.run(one_process_config(), str(tmp_path / "one"))
  float64_reference.run("test_multihost:one_process_config", tmp_path / "float64", devices=8)
  reference = train_state.restore_params(tmp_path / "float64")
  assert jax.tree_util.tree_leaves(reference)[0].dtype == np.float64
  deviation = {
    name: float64_reference.max_deviation(train_state.restore_params(path), reference)
    for name, path in (("one", tmp_path / "one"), ("two", two_process_run))
  }
  config = one_process_config()
  built = train.build(config, sharding.make_mesh(config.mesh), 10)
  initial = jax.device_get(jax.jit(built.init_params)(built.init_key))
  moved = float64_reference.max_deviation(reference, initial)
  print(f"deviation from float64 {deviation}, largest parameter change {moved:.3g}")
  # The float64 run is the same training: float32's error is a small fraction of its changes.
  assert deviation["one"] < 0.01 * moved
  largest = max(float(np.max(np.abs(x))) for x in jax.tree_util.tree_leaves(reference))
  floor = 4 * np.finfo(np.float32).eps * largest
  assert deviation["two"] <= 2 * deviation["one"] + floor, deviation
  # Only process 0 writes TensorBoard event files.
  assert len(list(two_process_run.glob("events.out.tfevents.*"))) == 1


def test_two_processes_killed_and_resumed_match_uninterrupted(two_process_run, tmp_path):
  """Both processes SIGKILLed between steps 4 and 5 (checkpoint of step 3 written, saves
  synchronous so that it is complete), then two fresh processes resume from step 3 to the end:
  the same parameters as the uninterrupted two-process run, bitwise."""
  workdir = tmp_path / "killed"
  sync = ["--config.checkpoint.asynchronous=false"]
  results = _two_processes(workdir, sync, kill_at=5)
  assert all(code != 0 for code, _ in results), [out[-2000:] for _, out in results]
  assert train_state.committed_steps(workdir) == [3]
  _assert_ok(_two_processes(workdir, sync))
  resumed = train_state.restore_params(workdir)
  reference = train_state.restore_params(two_process_run)
  for (path, x), (_, y) in zip(
    jax.tree_util.tree_leaves_with_path(resumed),
    jax.tree_util.tree_leaves_with_path(reference),
    strict=True,
  ):
    np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))
