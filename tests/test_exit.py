"""A command's process ends within seconds of its last line, with nothing lost (vit_jax.runtime.cli).

Freeing a tf.data iterator can wait out its autotuning thread's sleep, a period that doubles as
the iterator lives, up to a minute; whether it does depends on timing. Here every release of an
input pipeline's iterator is made to take a minute longer (FAULT_RELEASE_DELAY,
tests/helpers/fault_injection.py), the sleep forced long: a command that waited for any release
would end a minute after its last line. Through the entry point: a training run's exit status,
checkpoints, final metrics, TensorBoard events and log file; through `cli.run`: the exit statuses
of a command that returns, fails in one line, raises, or exits with its own status.
"""

import json
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest
import tensorflow as tf

from tests.helpers import REPO, fault_injection, xla_env
from vit_jax.checkpoint.state import train_state
from vit_jax.runtime import workdir as workdir_lib

RELEASE_DELAY_S = 60
# The most a process may take from its last line to its exit: seconds on a 2-core machine under
# load, far less than the release's minute.
MAX_GAP_S = 5
TOTAL = 20
ARGS = [
  "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
  f"--config.total_steps={TOTAL}",
  "--config.checkpoint.every_steps=10",
  "--config.log_every_steps=10",
  "--config.evals.val.every_steps=0",  # the classification evaluator at the end only
  "--config.evals.fewshot_animal_mnist.every_steps=-1",
  "--config.evals.fewshot_mnist_5k.every_steps=-1",
]


def _timed(command: list[str], env: dict[str, str]) -> tuple[int, list[str], float]:
  """Runs `command`: its status, its non-empty output lines (stdout and stderr together), and
  the seconds from its last line to its exit."""
  proc = subprocess.Popen(
    command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  lines, last = [], time.monotonic()
  for line in proc.stdout:
    if line.strip():
      lines.append(line.rstrip("\n"))
      last = time.monotonic()
  code = proc.wait(timeout=600)
  gap = time.monotonic() - last
  print(f"exit {code}, {gap:.1f} s after its last line: {lines[-1] if lines else ''}")
  return code, lines, gap


def _scalars(workdir: pathlib.Path) -> dict[str, set[int]]:
  """The steps of each TensorBoard scalar in the workdir's event files."""
  steps: dict[str, set[int]] = {}
  for path in workdir.glob("events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        steps.setdefault(value.tag, set()).add(event.step)
  return steps


@pytest.mark.long
def test_a_training_run_exits_within_seconds_of_its_last_line_with_everything_saved(tmp_path):
  workdir = tmp_path / "run"
  env = fault_injection.child_env(
    xla_env.child_env(1, TF_CPP_MIN_LOG_LEVEL="2"), release_delay=RELEASE_DELAY_S
  )
  code, lines, gap = _timed(fault_injection.command(*ARGS, f"--workdir={workdir}"), env)
  assert code == 0, lines[-30:]
  assert lines[-1].split()[0] == "total", lines[-30:]  # the goodput account's last row
  assert gap < MAX_GAP_S, f"exited {gap:.1f} s after its last line"
  assert train_state.committed_steps(workdir) == [10, TOTAL]
  metrics = json.loads((workdir / workdir_lib.FINAL_METRICS_FILE).read_text())
  assert metrics["step"] == TOTAL and "val/accuracy" in metrics
  scalars = _scalars(workdir)
  # The final evaluation's and the goodput account's, written last, before the writer closed.
  assert TOTAL in scalars["val/accuracy"] and TOTAL in scalars["goodput/share"], scalars
  (log,) = (workdir / "logs").glob("*.log")
  assert log.read_text().rstrip().splitlines()[-1] == lines[-1].rstrip()


# A command of its own (vit_jax.runtime.cli's conventions): it hands an iterator whose release
# takes RELEASE_DELAY_S to the input pipeline, prints its last line, then ends as told: returns,
# raises one of its errors (a one-line failure) or another exception (a traceback), or exits.
COMMAND = textwrap.dedent(
  f"""
  import sys, time
  from vit_jax.input_pipeline import pipeline
  from vit_jax.runtime import cli

  def items():
    try:
      yield 0
    finally:
      time.sleep({RELEASE_DELAY_S})

  def main(argv, flags):
    it = items()
    next(it)
    pipeline._release(it)
    print("last line", flush=True)
    if argv[1] == "fail":
      raise ValueError("what went wrong")
    if argv[1] == "crash":
      raise RuntimeError("not one of its errors")
    if argv[1] == "exit":
      sys.exit(3)

  cli.run(main, "probe", lambda values=None: None, errors=(ValueError,))
  """
)


@pytest.mark.parametrize(
  "how,status,last",
  [
    ("return", 0, "last line"),
    ("fail", 1, "probe: error: ValueError: what went wrong"),
    ("crash", 1, "RuntimeError: not one of its errors"),  # the traceback's last line
    ("exit", 3, "last line"),
  ],
)
def test_a_command_exits_with_its_status_without_waiting_for_a_release(how, status, last):
  env = xla_env.child_env(1, TF_CPP_MIN_LOG_LEVEL="2")
  code, lines, gap = _timed([sys.executable, "-c", COMMAND, how], env)
  assert code == status, lines[-30:]
  assert lines[-1] == last, lines[-30:]
  assert gap < MAX_GAP_S, f"exited {gap:.1f} s after its last line"
