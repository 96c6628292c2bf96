r"""Entry point of every stage: `python -m vit_jax.main --config=... --workdir=...`.

The config (configs/*.py, selected and parameterised with one string, see configs/common.py)
names its stage: 'pretrain' and 'finetune' run vit_jax.train, 'linear_probe' runs
vit_jax.linear_probe. Fields are overridden with `--config.field=value`; configs are locked, so a
misspelt field is an error.

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

import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from vit_jax import distributed

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Stage config: configs/<stage>.py:<key=value,...>.", lock_config=True
)
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
  """Runs the stage `config.stage`; returns its final metrics."""
  if config.stage not in STAGES:
    raise ValueError(f"config.stage={config.stage!r}; expected one of {STAGES}")
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from vit_jax import console

  process = _PROCESS_ID.value or 0
  log = None if _VERBOSE.value else console.setup(_WORKDIR.value, process)
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
  except Exception as e:  # noqa: BLE001 - every failure ends with one line, details in the log
    console.fail(e, log)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
