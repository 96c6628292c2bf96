"""`python -m vit_jax.main` with a signal sent at a chosen point: the interrupted runs of the tests.

`command(...)` is the entry point's command line (`python -c PROGRAM <flags>`); the fault is
chosen by environment variables (`env(...)` makes them), so that the processes of one
multi-process launch can be given different faults:

  FAULT_SIGNAL     the signal's name (default SIGTERM)
  FAULT_AT         the process sends it to itself when it fetches this training batch, counted
                   from the process's start (between two steps: the step before is done); 0 never
  FAULT_SECOND_AT  ...and again right after the save of this step has started (a second signal
                   while a checkpoint is being written)
  FAULT_DATA_DELAY seconds every training batch's fetch takes longer (a slow input pipeline)

Before sending, the process prints `marker(signal, at)` (flushed), so that a test can tell the
fault it injected from anything else that ended the process (a launcher's timeout, a crash).
"""

import os
import sys
import textwrap

PROGRAM = textwrap.dedent(
  """
  from vit_jax.runtime import process
  process.configure()  # as the entry point does, first thing
  import os, signal, sys, time
  from vit_jax import input_pipeline, main
  from vit_jax.runtime import cli
  from vit_jax.checkpoint import train_state
  name = os.environ.get("FAULT_SIGNAL", "SIGTERM")
  sig = getattr(signal, name)
  at, second = int(os.environ.get("FAULT_AT", 0)), int(os.environ.get("FAULT_SECOND_AT", 0))
  delay = float(os.environ.get("FAULT_DATA_DELAY", 0))
  def send(where):
    print(f"[fault: {name} {where}]", flush=True)
    os.kill(os.getpid(), sig)
  fetch, count = input_pipeline.TrainIterator.__next__, [0]
  def signalling_next(self):
    count[0] += 1
    if count[0] == at:
      send(f"at batch {at}")
    time.sleep(delay)
    return fetch(self)
  input_pipeline.TrainIterator.__next__ = signalling_next
  save = train_state.Checkpointer.save
  def signalling_save(self, step, *args, **kwargs):
    out = save(self, step, *args, **kwargs)
    if step == second:
      send(f"while saving step {step}")
    return out
  train_state.Checkpointer.save = signalling_save
  sys.argv[0] = "vit_jax.main"
  cli.run(main.main, "vit_jax", main.define_flags)
  """
)


def command(*flags: str) -> list[str]:
  """The faulting entry point's command line with the entry point's `flags`."""
  return [sys.executable, "-c", PROGRAM, *map(str, flags)]


def env(**fault) -> dict[str, str]:
  """The variables of a fault: env(signal='SIGKILL', at=8) → {'FAULT_SIGNAL': 'SIGKILL', ...}."""
  return {f"FAULT_{key.upper()}": str(value) for key, value in fault.items()}


def marker(signal: str, at: int) -> str:
  """What a process prints before it sends itself `signal` at batch `at`."""
  return f"[fault: {signal} at batch {at}]"


def child_env(base: dict[str, str] | None = None, **fault) -> dict[str, str]:
  """`base` (default: this process's environment) with the variables of `fault`."""
  return dict(os.environ if base is None else base, **env(**fault))
