"""Faults of a multi-process run, through the entry point: two `python -m vit_jax.main`
processes of one CPU device each (tests/helpers/local_cluster.py, gloo collectives over 127.0.0.1) on the
mesh data=2. Each run ends with the parameters (and Polyak average) of the same training
uninterrupted on one process of two devices, bitwise: every gradient all-reduce sums two values,
the same float32 number in either order.

- A lost process: tests/helpers/invariance_config.py's run saving every 5 steps asynchronously, process 1
  SIGKILLed right after it started saving step 10 (its part possibly unwritten). Process 0 must
  end with `vit_jax: error: process 1 of 2 is gone (...)` within 60 s of the kill (the
  lost-process timeout is 30 s: vit_jax.runtime.liveness); only whole steps are committed; the
  same command on both processes then finishes.
- A crash of process 0, which runs the coordination service: SIGKILLed at batch 13 (step 10's
  save under way). Process 1 must end with `vit_jax: error: process 0 of 2 is gone (its
  coordination service at 127.0.0.1:<port> refuses connections)...` and status 1 within 60 s
  (JAX's client would abort it at once, without a word on the terminal:
  vit_jax.runtime.liveness); the same command on both processes then resumes from the last
  committed step and finishes.
- SIGTERM to process 1 only, inside an evaluation: both processes abandon it at the same batch,
  save the same step and exit 143 with the same line; the rerun, whose first restore read fails
  on process 1 only (EIO), is retried on both (neither waits forever in the other's barrier) and
  finishes.
"""

import json

import jax
import pytest

from tests.helpers import REPO, fault_injection, invariance_config, local_cluster, trees, xla_env
from vit_jax import train
from vit_jax.checkpoint.state import train_state
from vit_jax.configs import pretrain

FLAGS = ["--config.checkpoint.every_steps=5", "--config.checkpoint.asynchronous=true"]
BOUND_S = 60  # the survivors' time to exit after the loss, at the default lost-process timeout


def _launch(
  workdir,
  faults,
  ended=None,
  flags=("--config=tests/helpers/invariance_config.py:supervised", *FLAGS),
):
  env = xla_env.child_env(1)

  def command(port, i):
    flags_i = [
      *flags,
      f"--workdir={workdir}",
      f"--coordinator_address=127.0.0.1:{port}",
      "--num_processes=2",
      f"--process_id={i}",
    ]
    variables = [f"{k}={v}" for k, v in fault_injection.env(**(faults[i] or {})).items()]
    return ["env", *variables, *fault_injection.command(*flags_i)]

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
    trees.assert_same_params(workdir, tmp_path / "one", ema=ema)


@pytest.mark.long
def test_a_crash_of_process_0_ends_the_others_with_a_line_and_the_rerun_resumes(tmp_path):
  workdir = tmp_path / "run"
  ended: list = []
  results = _launch(workdir, [dict(signal="SIGKILL", at=13), None], ended)
  (killed_code, killed), (code, out) = results
  assert fault_injection.marker("SIGKILL", 13) in killed and killed_code == -9, _tails(results)
  lines = [line for line in out.splitlines() if line.startswith("vit_jax: ")]
  after = ended[1] - ended[0]
  print(f"process 1: exit {code} {after:.1f} s after process 0's: {lines[-1] if lines else ''}")
  assert code == 1, _tails(results)
  assert lines[-1].startswith(
    "vit_jax: error: process 0 of 2 is gone (its coordination service at 127.0.0.1:"
  ), _tails(results)
  assert lines[-1].endswith("the same command on every process continues from it"), lines[-1]
  assert after <= BOUND_S, f"process 1 ended {after:.1f} s after process 0"
  committed = train_state.committed_steps(workdir)  # step 10 only if its save was done
  assert committed in ([5], [5, 10]), committed

  results = _launch(workdir, [None, None])
  for i, (code, out) in enumerate(results):
    assert code == 0, f"process {i}:\n{out[-4000:]}"
  rerun = json.loads((workdir / "goodput.json").read_text())["attempts"][-1]
  assert (rerun["start_step"], rerun["source"]) == (committed[-1], "persistent"), rerun
  assert (rerun["end"]["outcome"], rerun["end"]["step"]) == ("finished", 20), rerun["end"]


# The Fashion-MNIST demo run, with an evaluation at step 15 of 400 examples in batches of 8.
_EVALUATED = dict(total_steps=20, every_steps=10, val_every=15, val_examples=400, eval_batch=8)


def _evaluated_flags():
  e = _EVALUATED
  return [
    "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
    f"--config.total_steps={e['total_steps']}",
    f"--config.checkpoint.every_steps={e['every_steps']}",
    f"--config.evals.val.every_steps={e['val_every']}",
    f"--config.evals.val.max_examples={e['val_examples']}",
    f"--config.eval_batch_size={e['eval_batch']}",
    "--config.evals.fewshot_animal_mnist.every_steps=-1",
    "--config.evals.fewshot_mnist_5k.every_steps=-1",
  ]


@pytest.mark.slow
def test_sigterm_in_an_evaluation_and_a_restore_error_on_one_process(tmp_path):
  e = _EVALUATED
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  config.total_steps = e["total_steps"]
  config.checkpoint.every_steps = e["every_steps"]
  config.evals.val.update(every_steps=e["val_every"], max_examples=e["val_examples"])
  config.eval_batch_size = e["eval_batch"]
  config.evals.fewshot_animal_mnist.every_steps = -1
  config.evals.fewshot_mnist_5k.every_steps = -1
  train.run(config, str(tmp_path / "one"), devices=jax.devices()[:2])

  workdir = tmp_path / "two"
  slow, signal = dict(eval_delay=0.5), dict(eval_at=3, eval_delay=0.5)
  results = _launch(workdir, [slow, signal], flags=_evaluated_flags())
  assert "[fault: SIGTERM at evaluation batch 3]" in results[1][1], _tails(results)
  lines = []
  for code, out in results:
    stopped = [line for line in out.splitlines() if line.startswith("vit_jax: stopped by")]
    assert code == 143 and stopped, _tails(results)
    lines.append(stopped[-1])
  assert lines[0] == lines[1], lines
  assert lines[0].startswith("vit_jax: stopped by SIGTERM at step 15 of 20; saved to "), lines[0]
  assert train_state.committed_steps(workdir) == [10, 15]

  results = _launch(workdir, [None, dict(restore_errors=1)], flags=_evaluated_flags())
  for i, (code, out) in enumerate(results):
    assert code == 0, f"process {i}:\n{out[-4000:]}"
    assert "restoring checkpoint step 15 from" in out and "retrying in" in out, out[-3000:]
  assert "another process could not restore" in results[0][1], results[0][1][-3000:]
  assert "injected read error" in results[1][1], results[1][1][-3000:]
  assert not (workdir / train_state.BROKEN_DIR).exists()
  trees.assert_same_params(workdir, tmp_path / "one")
