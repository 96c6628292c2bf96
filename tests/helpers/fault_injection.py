"""`python -m vit_jax.main` with a fault injected at a chosen point: the interrupted runs of the tests.

`command(...)` is the entry point's command line (`python -c PROGRAM <flags>`); the fault is
chosen by environment variables (`env(...)` makes them), so that the processes of one
multi-process launch can be given different faults:

  FAULT_SIGNAL     the signal's name (default SIGTERM)
  FAULT_AT         the process sends it to itself when it fetches this training batch, counted
                   from the process's start (between two steps: the step before is done); 0 never
  FAULT_SECOND_AT  ...and again right after the save of this step has started (a second signal
                   while a checkpoint is being written)
  FAULT_DATA_DELAY seconds every training batch's fetch takes longer (a slow input pipeline)
  FAULT_EVAL_AT    ...when it fetches this evaluation batch (counted from the process's start)
  FAULT_EVAL_DELAY seconds each evaluation batch takes longer to fetch (a slow evaluation)
  FAULT_RESTORE_AT ...when the read of this restore attempt starts (counted from the start)
  FAULT_RESTORE_ERRORS  the first this many restore attempts fail reading their arrays with
                   OSError EIO (a storage error that is no evidence of a broken step); the
                   retries then wait 0.1 s instead of restore_faults.RETRY_DELAYS_S
  FAULT_RELEASE_DELAY  seconds every release of an input pipeline's iterator takes longer (on
                   its release thread: the wait of a tf.data iterator's destructor for its
                   autotuning thread's sleep, the sleep forced long)

Before sending a signal, the process prints `marker(signal, at)` (flushed; for the evaluation
and restore faults `[fault: <signal> at evaluation batch <n>]` / `... at restore <n>]`), so that
a test can tell the fault it injected from anything else that ended the process (a launcher's
timeout, a crash), and when.
"""

import os
import sys
import textwrap

PROGRAM = textwrap.dedent(
  """
  from vit_jax.runtime import process
  process.configure()  # as the entry point does, first thing
  import errno, os, signal, sys, time
  import orbax.checkpoint as ocp
  from vit_jax import evaluators, input_pipeline, main
  from vit_jax.runtime import cli
  from vit_jax.checkpoint.state import restore_faults, train_state
  name = os.environ.get("FAULT_SIGNAL", "SIGTERM")
  sig = getattr(signal, name)
  at, second = int(os.environ.get("FAULT_AT", 0)), int(os.environ.get("FAULT_SECOND_AT", 0))
  delay = float(os.environ.get("FAULT_DATA_DELAY", 0))
  eval_at = int(os.environ.get("FAULT_EVAL_AT", 0))
  eval_delay = float(os.environ.get("FAULT_EVAL_DELAY", 0))
  restore_at = int(os.environ.get("FAULT_RESTORE_AT", 0))
  restore_errors = int(os.environ.get("FAULT_RESTORE_ERRORS", 0))
  release_delay = float(os.environ.get("FAULT_RELEASE_DELAY", 0))
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
  eval_data, eval_count = evaluators.input_pipeline_data, [0]
  def slow_eval_data(*args, **kwargs):
    make = eval_data(*args, **kwargs)
    def make_slow(*a, **k):
      source = make(*a, **k)
      def slow():
        for batch in source():
          eval_count[0] += 1
          if eval_count[0] == eval_at:
            send(f"at evaluation batch {eval_at}")
          time.sleep(eval_delay)
          yield batch
      return slow
    return make_slow
  evaluators.input_pipeline_data = slow_eval_data
  read, reads = ocp.type_handlers.ArrayHandler.deserialize, [0]
  async def failing_read(self, infos, args=None):
    reads[0] += 1
    if reads[0] == restore_at:
      send(f"at restore {restore_at}")
    if reads[0] <= restore_errors:
      raise OSError(errno.EIO, "injected read error", str(infos[0].path))
    return await read(self, infos, args)
  ocp.type_handlers.ArrayHandler.deserialize = failing_read
  if restore_errors:
    restore_faults.RETRY_DELAYS_S = (0.1,) * len(restore_faults.RETRY_DELAYS_S)
  from vit_jax.input_pipeline import pipeline
  release = pipeline._release
  class SlowRelease:
    def __init__(self, items):
      self.items = items
    def close(self):
      self.items.close()
      time.sleep(release_delay)
  if release_delay:
    pipeline._release = lambda items: release(SlowRelease(items))
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
