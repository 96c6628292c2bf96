"""A process of a multi-process run lost mid-run (SIGKILL): the others end within a bound, with
one line naming it, no partial step is committed, and the rerun resumes bitwise.

Two `python -m vit_jax.main` processes of one CPU device each (tests/local_cluster.py, gloo
collectives over 127.0.0.1) train tests/invariance_config.py's run on the mesh data=2, saving
every 5 steps asynchronously. Process 1 is SIGKILLed right after it started saving step 10 (its
part of the step possibly unwritten). Process 0 must end with
`vit_jax: error: process 1 of 2 is gone (...)` within 60 s of the kill (the lost-process timeout
is 30 s: vit_jax.runtime.liveness); only whole steps are committed; and the same command on both
processes then finishes with the parameters and Polyak average of the same training run
uninterrupted on one process of two devices, bitwise (each gradient all-reduce sums two values:
the same float32 number in either order).
"""

import pathlib

import fault_injection  # tests/
import invariance_config  # tests/
import jax
import local_cluster  # tests/
import numpy as np
import pytest
import xla_env  # tests/

from vit_jax import train
from vit_jax.checkpoint import train_state

REPO = pathlib.Path(__file__).resolve().parents[1]
FLAGS = ["--config.checkpoint.every_steps=5", "--config.checkpoint.asynchronous=true"]
BOUND_S = 60  # the survivors' time to exit after the loss, at the default lost-process timeout


def _launch(workdir, faults, ended=None):
  env = xla_env.child_env(1)

  def command(port, i):
    flags = [
      "--config=tests/invariance_config.py:supervised",
      f"--workdir={workdir}",
      f"--coordinator_address=127.0.0.1:{port}",
      "--num_processes=2",
      f"--process_id={i}",
      *FLAGS,
    ]
    variables = [f"{k}={v}" for k, v in fault_injection.env(**(faults[i] or {})).items()]
    return ["env", *variables, *fault_injection.command(*flags)]

  return local_cluster.launch(command, num_processes=2, cwd=REPO, env=env, ended=ended)


def _tails(results) -> str:
  return "\n".join(
    f"--- process {i} (exit {code}):\n{out[-3000:]}" for i, (code, out) in enumerate(results)
  )


@pytest.mark.slow
def test_a_lost_process_ends_the_others_and_the_rerun_resumes_exactly(tmp_path):
  config = invariance_config.get_config("supervised")
  config.checkpoint.update(every_steps=5, asynchronous=True)
  train.run(config, str(tmp_path / "one"), devices=jax.devices()[:2])

  workdir = tmp_path / "two"
  ended: list = []
  kill = dict(signal="SIGKILL", second_at=10)
  results = _launch(workdir, [None, kill], ended)
  (code, out), (_, killed) = results
  assert "[fault: SIGKILL while saving step 10]" in killed, _tails(results)
  lines = [line for line in out.splitlines() if line.startswith("vit_jax: ")]
  after = ended[0] - ended[1]
  print(f"process 0: exit {code} {after:.1f} s after process 1's: {lines[-1]}")
  assert code == 1, _tails(results)
  assert lines[-1].startswith("vit_jax: error: process 1 of 2 is gone (no sign of life for "), (
    _tails(results)
  )
  assert after <= BOUND_S, f"process 0 ended {after:.1f} s after process 1"
  # Only whole steps: step 10 if both processes wrote their parts before the kill, else step 5.
  committed = train_state.committed_steps(workdir)
  assert committed in ([5], [5, 10]), committed
  train_state.restore_params(workdir)  # the latest committed step reads

  results = _launch(workdir, [None, None])
  for i, (code, out) in enumerate(results):
    assert code == 0, f"process {i}:\n{out[-4000:]}"
  for ema in (False, True):
    got = train_state.restore_params(workdir, ema=ema)
    want = train_state.restore_params(tmp_path / "one", ema=ema)
    for (path, x), (_, y) in zip(
      jax.tree_util.tree_leaves_with_path(got),
      jax.tree_util.tree_leaves_with_path(want),
      strict=True,
    ):
      np.testing.assert_array_equal(x, y, err_msg=f"ema={ema} {jax.tree_util.keystr(path)}")
