"""What several experiments share; the one module they import besides vit_jax.

  define_stage_flags                the flags of a stage-running experiment
  run_stage, fmt_seconds            `python -m vit_jax.main` stages, run in this process
  train_step_fn                     a softmax cross-entropy step with one optax update
  results_dir, out_dir, write_json  where an experiment's outputs go: experiments/results/<name>/
  write_results, provenance         results.json stamped with the commit, date and machine
  finish_report                     the --quick caveat, total wall time and table.md

The demo's ViT is the model preset 'demo' (vit_jax.models), the bundled datasets' default.
Every experiment that chains stages (demo, scale_study, folder_transfer, segmentation,
detection) runs them through `run_stage`: the command is printed so that a reader can rerun any
stage by hand, the progress lines (metrics, ETA, errors) are shown as they come, and the stage's
final metrics are returned. Every accuracy of the experiments stands next to the raw-pixel
baselines (vit_jax.evaluators.baselines), fitted on exactly the examples the model was trained on
and scored on the same test split.
"""

import json
import os
import shutil
import time
from typing import Any

from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


def define_stage_flags(values: flags.FlagValues, workdir: str, quick_help: str) -> dict[str, Any]:
  """The flags every stage-running experiment takes, defined in `values` (the holders, by name):
  --workdir (default `workdir`), --out, --quick (its tiny profile) and --verbose (every log line
  of the stages)."""
  return dict(
    workdir=flags.DEFINE_string("workdir", workdir, "Workdirs of the stages.", flag_values=values),
    out=flags.DEFINE_string(
      "out", None, "Results' folder (default: see the module docstring).", flag_values=values
    ),
    quick=flags.DEFINE_bool("quick", False, quick_help, flag_values=values),
    verbose=flags.DEFINE_bool(
      "verbose", False, "Show every log line of the stages.", flag_values=values
    ),
  )


def finish_report(results: dict, text: str, out: str) -> None:
  """The end of an experiment's report: the --quick caveat and the total wall time printed, the
  markdown table `text` written to `out`/table.md."""
  if results["quick"]:
    print("(--quick: budgets far too small for these numbers to mean anything.)")
  print(f"Total wall time {fmt_seconds(results['seconds']['total'])}.")
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(text + "\n")


def write_json(path: str, value: Any, **kwargs) -> None:
  """`value` as indented JSON in `path`, its folder created if need be."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(value, f, indent=2, **kwargs)


def write_results(path: str, results: dict, started: dict | None = None, **kwargs) -> None:
  """An experiment's results.json: `results` with its `provenance` (what produced them), which
  is added to `results` too, so that what the experiment returns is what the file holds.
  `started`: the provenance taken as the experiment started (the commit its code is from and
  the load it started beside, not the tree's or the machine's of when it ended); default now."""
  results["provenance"] = started or provenance()
  write_json(path, results, **kwargs)


def provenance() -> dict[str, Any]:
  """The commit (with '+dirty' for uncommitted changes outside experiments/results/), the UTC date and the machine (CPU model
  and matmul features, cores, accelerator, and its 1, 5 and 15-minute load averages: other work
  sharing the machine) of this run, now: what a docs figure is checked against."""
  import datetime
  import subprocess
  import sys

  from vit_jax.cost import devices

  def git(*args):
    try:
      done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
      return done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
      return None

  commit = git("rev-parse", "HEAD")
  # Results written by earlier experiments of the same checkout are no change of the code.
  status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!experiments/results")
  if commit and status:
    commit += "+dirty"
  accelerator = "none"
  jax = sys.modules.get("jax")  # only where the experiment already started JAX
  if jax is not None and jax.default_backend() != "cpu":
    accelerator = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
  return dict(
    commit=commit or "unknown (not a git checkout)",
    date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    machine=dict(
      cpu=devices.cpu_description(devices.read_cpuinfo()),
      cores=len(os.sched_getaffinity(0)),
      accelerator=accelerator,
      load=[round(x, 2) for x in os.getloadavg()],
    ),
  )


# ---------------------------------------------------------------------------------------------
# `python -m vit_jax.main` stages.

DONE = "metrics.json"  # written into a stage's workdir when it finished


def run_stage(
  title: str, args: list[str], workdir: str, *, resume: bool = False, verbose: bool = False
) -> tuple[dict[str, float], float]:
  """Runs the stage `python -m vit_jax.main ARGS --workdir=WORKDIR` in this process; returns
  (its last metrics, seconds).

  The command is printed, so that a reader can rerun the stage by hand; it runs as the command
  does (the same config parsing and one-line errors for a misspelt field, the same
  `vit_jax.stages.run`, its progress lines on the terminal and everything else in the stage's log
  file), without starting another Python (the imports of JAX and TensorFlow, seconds each).

  Args:
    title: printed above the command.
    args: the stage's flags (--config=... and overrides).
    workdir: the stage's workdir.
    resume: a stage that finished before (its workdir holds metrics.json) is not run again: its
      saved metrics and wall time are returned; an interrupted one continues from its last
      checkpoint. Otherwise the workdir is removed first, so the stage measures from scratch.
    verbose: every log line of the stage on the terminal, not only progress, results and errors.

  Raises:
    SystemExit: the stage failed; its one line (and the log's path) is on the terminal.
  """
  from absl import logging as absl_logging

  from vit_jax import stages
  from vit_jax.runtime import config_files, console, startup
  from vit_jax.runtime import workdir as workdir_lib

  done = os.path.join(workdir, DONE)
  if resume and os.path.exists(done):
    print(f"-- {title}: finished earlier ({workdir})", flush=True)
    with open(done) as f:
      metrics = json.load(f)
    return metrics, metrics["wall_seconds"]
  if not resume:
    shutil.rmtree(workdir, ignore_errors=True)
  print(
    f"\n== {title}\n  python -m vit_jax.main "
    + " \\\n      ".join([*args, f"--workdir={workdir}"]),
    flush=True,
  )
  start = time.perf_counter()
  log = None
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.INFO)  # as absl's app.run of the command sets it
  try:
    if not verbose:
      log = console.setup(workdir)
    config = config_files.from_flags(args)
    startup.import_module(stages.module_name(config.stage))  # as the command imports it
    metrics = stages.run(config, workdir)
  except Exception as e:  # noqa: BLE001 - the stage's one line, as the command ends
    console.fail(e, log)
    raise SystemExit(f"stage '{title}' failed") from e
  finally:
    console.teardown()
    absl_logging.set_verbosity(verbosity)
  seconds = time.perf_counter() - start
  workdir_lib.save_final_metrics(workdir, metrics)  # as the command does, in JSON's types
  with open(os.path.join(workdir, workdir_lib.FINAL_METRICS_FILE)) as f:
    metrics = dict(json.load(f), wall_seconds=seconds)
  write_json(done, metrics, sort_keys=True)
  return metrics, seconds


def fmt_seconds(seconds: float) -> str:
  """'12m05s' (or '42s')."""
  return f"{int(seconds // 60)}m{int(seconds % 60):02d}s" if seconds >= 60 else f"{seconds:.0f}s"


# ---------------------------------------------------------------------------------------------
# A train step.


def logits_of(output):
  """The logits of a model's answer: `(logits, out)`, or the logits alone from a vit_jax tree
  before that contract (a benchmark's baseline revision)."""
  return output[0] if isinstance(output, tuple) else output


def train_step_fn(module, tx):
  """(params, opt_state, images, labels) -> (params, opt_state, loss): softmax cross-entropy,
  gradients, one update of the optax transformation `tx`."""
  import jax
  import optax

  def train_step(params, opt_state, images, labels):
    def loss_fn(params):
      logits = logits_of(module.apply({"params": params}, images, train=True))
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return train_step
