"""What several experiments share; the one module they import besides vit_jax.

  DEMO_MODEL, demo_model_config     the demo's ViT (demo, folder_transfer, scale_study,
                                    mpp_study, bench_trainer, benchmark_model, ablate_step)
  DemoBudget, DEMO_FULL, DEMO_QUICK the demo's training budgets (demo, folder_transfer)
  run_stage, fmt_seconds            `python -m vit_jax.main` stages, each in its own process
  train_step_fn                     a softmax cross-entropy step with one optax update
  results_dir, out_dir, write_json  where an experiment's outputs go: experiments/results/<name>/

Every experiment that chains stages (demo, scale_study, folder_transfer) runs them through
`run_stage`: the command is printed so that a reader can rerun any stage by hand, the progress
lines (metrics, ETA, errors) are shown as they come, and the last value of every metric the stage
logged is returned. Every accuracy of the experiments stands next to the raw-pixel baselines
(vit_jax.baselines), fitted on exactly the examples the model was trained on and
scored on the same test split.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------------------------
# The demo's model and budgets.

# The 'testing' preset (patch 4 on 32px: 64 tokens + class token) made wider and deeper so that
# pretraining has something to learn; overridden on every training stage alike.
DEMO_MODEL = dict(hidden_size=64, mlp_dim=256, num_heads=4, num_layers=4)


def demo_model_config():
  """The demo's model ConfigDict: the `testing` preset with DEMO_MODEL (32px images)."""
  from vit_jax import models

  config = models.get_model_config("testing")
  config.update(DEMO_MODEL)
  return config


@dataclasses.dataclass(frozen=True)
class DemoBudget:
  """Sizes of one demo profile."""

  pretrain_steps: int
  finetune_steps: int
  batch_size: int
  eval_every: int
  max_train_examples: int | None  # train on `train[:N]` (N of a fixed shuffle; None: all)
  max_test_examples: int | None  # evaluate on `test[:N]` (None: the whole test split)


# Measured on 2 CPU cores (batch 128, ~2.1 steps/s): fine-tuning the 1000-step pretrained model
# on Animal-MNIST for 600 steps reached 84.9% at lr 0.03 and 89.7% at lr 0.1, still rising;
# 1000 steps at lr 0.1 (the finetune preset) is what this budget affords.
DEMO_FULL = DemoBudget(
  pretrain_steps=1000,
  finetune_steps=1000,
  batch_size=128,
  eval_every=500,
  max_train_examples=None,
  max_test_examples=None,
)
DEMO_QUICK = DemoBudget(
  pretrain_steps=30,
  finetune_steps=20,
  batch_size=32,
  eval_every=0,
  max_train_examples=2000,
  max_test_examples=500,
)

# ---------------------------------------------------------------------------------------------
# Outputs.


def results_dir(experiment: str) -> str:
  """experiments/results/<experiment>/ of this checkout: an experiment's default output folder
  (results.json, tables, figures; workdirs with checkpoints live elsewhere)."""
  return os.path.join(REPO, "experiments", "results", experiment)


def out_dir(out: str | None, experiment: str, workdir: str, quick: bool = False) -> str:
  """An experiment's output folder: `out` (its --out) if given, else results_dir(experiment);
  with --quick, <workdir>/results instead, so that a run of tiny budgets never replaces the
  results kept in the repository."""
  if out:
    return out
  return os.path.join(workdir, "results") if quick else results_dir(experiment)


def write_json(path: str, value: Any, **kwargs) -> None:
  """`value` as indented JSON in `path`, its folder created if need be."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(value, f, indent=2, **kwargs)


# ---------------------------------------------------------------------------------------------
# `python -m vit_jax.main` stages.

DONE = "metrics.json"  # written into a stage's workdir when it finished


def _shown(line: str) -> bool:
  """The lines of a stage's terminal worth repeating: progress, evaluations, warnings, errors."""
  return " | " in line or any(s in line for s in ("WARNING", "ERROR", "error", "Traceback"))


def run_stage(
  title: str, args: list[str], workdir: str, *, resume: bool = False, verbose: bool = False
) -> tuple[dict[str, float], float]:
  """Runs `python -m vit_jax.main ARGS --workdir=WORKDIR`; returns (last metrics, seconds).

  Args:
    title: printed above the command.
    args: the stage's flags (--config=... and overrides).
    workdir: the stage's workdir.
    resume: a stage that finished before (its workdir holds metrics.json) is not run again: its
      saved metrics and wall time are returned; an interrupted one continues from its last
      checkpoint. Otherwise the workdir is removed first, so the stage measures from scratch.
    verbose: show every terminal line of the stage, not just progress, results and errors.

  Raises:
    SystemExit: the stage failed; its log's last lines are printed to stderr.
  """
  done = os.path.join(workdir, DONE)
  if resume and os.path.exists(done):
    print(f"-- {title}: finished earlier ({workdir})", flush=True)
    with open(done) as f:
      metrics = json.load(f)
    return metrics, metrics["wall_seconds"]
  if not resume:
    shutil.rmtree(workdir, ignore_errors=True)
  cmd = [sys.executable, "-m", "vit_jax.main", *args, f"--workdir={workdir}"]
  print(f"\n== {title}\n  python -m vit_jax.main " + " \\\n      ".join(cmd[3:]), flush=True)
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  start = time.perf_counter()
  tail: list[str] = []
  with subprocess.Popen(
    cmd + ["--alsologtostderr"],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    bufsize=1,
  ) as proc:
    for line in proc.stdout:
      line = line.rstrip()
      tail = (tail + [line])[-40:]
      if verbose or _shown(line):
        print(f"  {time.perf_counter() - start:6.0f}s  {line[:150]}", flush=True)
  seconds = time.perf_counter() - start
  if proc.returncode:
    print("\n".join(tail), file=sys.stderr)
    raise SystemExit(f"stage '{title}' failed (exit {proc.returncode}); log tail above")
  from vit_jax import workdir as workdir_lib  # the stage's last metrics (vit_jax.main)

  with open(os.path.join(workdir, workdir_lib.FINAL_METRICS_FILE)) as f:
    metrics = json.load(f)
  metrics["wall_seconds"] = seconds
  with open(done, "w") as f:
    json.dump(metrics, f, indent=2, sort_keys=True)
  return metrics, seconds


def fmt_seconds(seconds: float) -> str:
  """'12m05s' (or '42s')."""
  return f"{int(seconds // 60)}m{int(seconds % 60):02d}s" if seconds >= 60 else f"{seconds:.0f}s"


# ---------------------------------------------------------------------------------------------
# A train step.


def train_step_fn(module, tx):
  """(params, opt_state, images, labels) -> (params, opt_state, loss): softmax cross-entropy,
  gradients, one update of the optax transformation `tx`."""
  import jax
  import optax

  def train_step(params, opt_state, images, labels):
    def loss_fn(params):
      logits = module.apply({"params": params}, images, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return train_step
