r"""Entry point of every stage: `python -m vit_jax.main --config=... --workdir=...`.

The config (configs/*.py, installed as vit_jax.configs; selected and parameterised with one
string, see configs/common.py; a file of the user's own: vit_jax.config_files) names its stage:
'pretrain' and 'finetune' run vit_jax.train, 'linear_probe' runs vit_jax.linear_probe. Fields are
overridden with `--config.field=value`; configs are locked, so a misspelt field is an error
naming the nearest field.

The terminal shows progress, metrics, warnings and errors; everything else (library chatter,
native messages) goes to the log file named on the first line (vit_jax.console), and a failed run
ends with one line saying what went wrong. `--verbose` shows everything on the terminal instead.

Multi-host: on a multi-host TPU VM slice `jax.distributed.initialize()` runs automatically
(`--distributed=auto`); elsewhere (CPU or GPU clusters) pass `--coordinator_address=host:port
--num_processes=N --process_id=i` on every process. Every process runs the same command.

Examples:
  python -m vit_jax.main --config=configs/pretrain.py:dataset=fashion_mnist --workdir=/tmp/pt
  python -m vit_jax.main --config=configs/finetune.py:dataset=cifar10,model=B/16 \
      --config.model_init=gs://vit_models/imagenet21k/ViT-B_16.npz --workdir=gs://bucket/ft
"""

import os
import sys
import threading
import time

import jax
from absl import app, flags, logging

from vit_jax import config_files, distributed

_CONFIG = config_files.define_flag()
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and logs go here.")
_DISTRIBUTED = flags.DEFINE_enum(
  "distributed",
  "auto",
  ["auto", "on", "off"],
  "jax.distributed.initialize: 'on' always (cluster auto-detection on TPU, SLURM, ...), 'off' "
  "never, 'auto' when --coordinator_address is given or on a multi-host TPU VM slice.",
)
_COORDINATOR = flags.DEFINE_string(
  "coordinator_address", None, "host:port of process 0 (CPU/GPU clusters)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Index of this process.")
_VERBOSE = flags.DEFINE_bool(
  "verbose", False, "Every log line on the terminal (default: to the log file in the workdir)."
)

flags.mark_flags_as_required(["config", "workdir"])

STAGES = ("pretrain", "finetune", "linear_probe")


def run(config, workdir: str):
  """Runs the stage `config.stage` holding the workdir's lock; returns its final metrics."""
  from vit_jax import workdir as workdir_lib

  if config.stage not in STAGES:
    raise ValueError(f"config.stage={config.stage!r}; expected one of {STAGES}")
  with workdir_lib.lock(workdir):
    if config.stage == "linear_probe":
      from vit_jax import linear_probe

      return linear_probe.run(config, workdir)
    from vit_jax import train

    return train.run(config, workdir)


def _run_and_record(config, workdir: str) -> dict:
  """`run`, then the final metrics into the workdir (what scripts chaining stages read)."""
  from vit_jax import workdir as workdir_lib

  metrics = run(config, workdir)
  if jax.process_index() == 0 and isinstance(metrics, dict) and metrics:
    workdir_lib.save_final_metrics(workdir, metrics)
  return metrics


def _flag_value(argv: list[str], name: str) -> str | None:
  """The value of `--name=value` or `--name value` in `argv`, before flags are parsed."""
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _flag_error(error: BaseException) -> tuple[BaseException, str]:
  """The exception to name and its one line, for a bad --config (or another flag)."""
  chain = []
  while error is not None and len(chain) < 10:
    chain.append(error)
    error = error.__cause__ or error.__context__
  # The outermost message without a traceback in it: absl's "flag --x=v: ..." where that is
  # one line, the config file's own exception where absl wraps a traceback around it.
  clean = [e for e in chain if "Traceback" not in str(e) and str(e).strip()]
  named = clean[0] if clean else chain[0]
  return named, str(named).strip().splitlines()[0]


def _setup_console(workdir: str | None, process: int) -> str:
  """The log file (vit_jax.console) in the workdir, or in the temporary directory when the
  workdir cannot be written; raises (after setting up the latter) for an unwritable workdir."""
  from vit_jax import console

  try:
    return console.setup(workdir, process)
  except OSError as e:
    log = console.setup(None, process)
    console.fail(e, log, message=f"cannot write to --workdir={workdir}: {e.strerror or e}")
    sys.exit(1)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, ending a bad --config or flag with one line (the traceback in the log)."""
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # noqa: BLE001 - flags.Error, or the config file's own exception
    from vit_jax import console

    workdir = _flag_value(argv, "workdir")
    log = _setup_console(workdir, int(_flag_value(argv, "process_id") or 0)) if workdir else None
    named, line = _flag_error(e)
    console.fail(e, log, message=line, kind=type(named).__name__)
    sys.exit(1)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from vit_jax import console, stopping

  process = _PROCESS_ID.value or 0
  log = None if _VERBOSE.value else _setup_console(_WORKDIR.value, process)
  try:
    distributed.initialize(
      _DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value
    )
    config = _CONFIG.value
    logging.info("config:\n%s", config, extra={"terminal": False})
    logging.info(
      "%s: model %s on %s, %s steps, workdir %s",
      config.stage,
      config.model.get("name") if config.get("model") else "from model_init",
      config.dataset.name,
      config.get("total_steps", "-"),
      _WORKDIR.value,
    )
    _run_and_record(config, _WORKDIR.value)
  except stopping.Stopped as e:
    logging.warning("%s", e, extra={"terminal": False})
    console.end(f"vit_jax: {e}")
    sys.exit(e.exit_status)
  except Exception as e:  # noqa: BLE001 - every failure ends with one line, details in the log
    console.fail(e, log)
    _exit_even_if_threads_hang(1)
    sys.exit(1)


# How long a failed run's interpreter may wait for library threads before it is ended anyway.
EXIT_GRACE_S = 30.0


def _exit_even_if_threads_hang(status: int, grace_s: float = EXIT_GRACE_S) -> None:
  """Ends the process with `status` `grace_s` seconds from now unless it has ended by then.

  After a failure, a library's worker thread may wait for work that never comes: once GCS had
  refused a checkpoint write (403), one of Orbax's save threads kept the process alive after its
  last line (the interpreter joins such threads at exit), so a scheduler never saw it fail. A
  daemon thread keeps running while the interpreter waits for them, and ends it."""

  def end():
    time.sleep(grace_s)
    os._exit(status)

  threading.Thread(target=end, name="exit_watchdog", daemon=True).start()


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
