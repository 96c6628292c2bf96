"""The stages a config names, and running one: what `python -m vit_jax.main` runs, as a library.

`run(config, workdir)` runs `config.stage` ('pretrain', 'finetune', 'segment' and 'detect':
vit_jax.train.loop;
'linear_probe': vit_jax.linear_probe) holding the workdir's lock (vit_jax.runtime.workdir.lock);
`run_and_record` also writes its final metrics into the workdir (what scripts chaining stages
read). For programs that run stages themselves (vit_jax.tools.transfer, experiments/).

This file must not import TensorFlow (the stages import what they need when they run).
"""

import importlib
from typing import Any

import jax

STAGES = ("pretrain", "finetune", "segment", "detect", "linear_probe")


def module_name(stage: str) -> str:
  """The module whose `run(config, workdir)` runs `stage`."""
  if stage not in STAGES:
    raise ValueError(f"config.stage={stage!r}; expected one of {STAGES}")
  return "vit_jax.linear_probe" if stage == "linear_probe" else "vit_jax.train.loop"


def run(config, workdir: str) -> dict[str, Any]:
  """Runs the stage `config.stage` holding the workdir's lock; returns its final metrics."""
  from vit_jax.runtime import workdir as workdir_lib

  name = module_name(config.stage)
  with workdir_lib.lock(workdir):
    return importlib.import_module(name).run(config, workdir)


def run_and_record(config, workdir: str) -> dict[str, Any]:
  """`run`, then the final metrics into the workdir (process 0)."""
  from vit_jax.runtime import workdir as workdir_lib

  metrics = run(config, workdir)
  if jax.process_index() == 0 and isinstance(metrics, dict) and metrics:
    workdir_lib.save_final_metrics(workdir, metrics)
  return metrics
