r"""The paper's transfer suite (Table 2) in one command: grid, choice on minival, final run, table.

  python -m vit_jax.tools.transfer --checkpoint=gs://vit_models/imagenet21k/ViT-L_16.npz \
      --model=L/16 --suite=table2 --paper=L/16-i21k --workdir=gs://$BUCKET/table2_l16

For every dataset of the suite (configs/finetune.py presets): one fine-tuning run per learning
rate of the preset's grid (`finetune.LR_GRID`) on the training split minus its minival part, in
`<workdir>/<dataset>/lr<rate>`; the rate with the best minival top-1; the final run with it on
the whole training split in `<workdir>/<dataset>/final`; then `<workdir>/results.json` and
`<workdir>/table.md`. Suites, costs, options and the table's columns: docs/transfer.md.

The runs execute in this process, exactly as the printed `python -m vit_jax.main` command would;
a run whose workdir holds `final_metrics.json` is finished and is skipped on a rerun, an
interrupted one resumes from its last checkpoint. Multi-host: the same command on every worker,
with a workdir shared by all hosts (gs://), since every host reads the same
`final_metrics.json` to decide what is finished.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import json
import os
from collections.abc import Sequence
from typing import Any

from etils import epath

from vit_jax.runtime import cli
from vit_jax.runtime import workdir as workdir_lib

RESULTS_FILE, TABLE_FILE = "results.json", "table.md"

# Paper Table 2 (fine-tuned top-1, %). VTAB-1k's per-task numbers (Table 9) are not recorded
# here: only the 19-task mean.
PAPER = {
  "H/14-jft": dict(
    imagenet2012=88.55, real=90.72, cifar10=99.50, cifar100=94.55, oxford_iiit_pet=97.56,
    oxford_flowers102=99.68, vtab=77.63,
  ),
  "L/16-jft": dict(
    imagenet2012=87.76, real=90.54, cifar10=99.42, cifar100=93.90, oxford_iiit_pet=97.32,
    oxford_flowers102=99.74, vtab=76.28,
  ),
  "L/16-i21k": dict(
    imagenet2012=85.30, real=88.62, cifar10=99.15, cifar100=93.25, oxford_iiit_pet=94.67,
    oxford_flowers102=99.61, vtab=72.72,
  ),
}  # fmt: skip


def finetune_module():
  """The finetune stage config (imported when first needed: its VTAB tasks import TensorFlow)."""
  from vit_jax.configs import finetune

  return finetune


def suite_datasets(suite: str) -> list[str]:
  """The finetune datasets of a suite name or comma list; unknown names raise ValueError."""
  from vit_jax.input_pipeline.sources import vtab

  vtab_names = [f"vtab/{name}" for name in vtab.TASKS]
  suites = dict(
    table2=["imagenet2012", "cifar10", "cifar100", "oxford_iiit_pet", "oxford_flowers102"]
    + vtab_names,
    vtab=vtab_names,
    offline=list(finetune_module().BUILTIN),
  )
  names = suites.get(suite) or [s.strip() for s in suite.split(",") if s.strip()]
  known = finetune_module().LR_GRID
  for name in names:
    if name not in known:
      raise ValueError(
        f"--suite: unknown dataset {name!r}; suites {sorted(suites)} or of {sorted(known)}"
      )
  return names


def _set(config, field: str, text: str) -> None:
  """config.<field> = text converted to the field's type (as ml_collections' config flags)."""
  *parents, leaf = field.split(".")
  node = config
  for name in [*parents, leaf]:
    if not hasattr(node, "keys") or name not in node:
      raise ValueError(f"--config_override {field}={text}: the config has no field {field!r}")
    if name != leaf:
      node = node[name]
  old = node[leaf]
  if isinstance(old, bool):
    if text.lower() not in ("1", "0", "true", "false"):
      raise ValueError(f"--config_override {field}={text}: {field} is a bool (true or false)")
    value = text.lower() in ("1", "true")
  elif isinstance(old, int | float) and not isinstance(old, bool):
    value = type(old)(text)
  else:
    value = text
  node[leaf] = value


class Run:
  """One `vit_jax.main` fine-tuning run: its config string, overrides, workdir and config."""

  def __init__(self, dataset: str, lr: float, holdout: bool, options: dict[str, Any]):
    arg = f"dataset={dataset},lr={lr:g},holdout={str(holdout).lower()}"
    if options["model"]:
      arg += f",model={options['model']}"
    if options["runlocal"]:
      arg += ",runlocal"
    self.arg = arg
    self.overrides = [f"model_init={options['checkpoint']}", *options["overrides"]]
    slug = dataset.replace("/", "_")
    self.workdir = os.path.join(options["workdir"], slug, f"lr{lr:g}" if holdout else "final")
    self.config = finetune_module().get_config(arg)
    for item in self.overrides:
      field, _, text = item.partition("=")
      _set(self.config, field, text)

  def command(self) -> str:
    flags_ = [f"--config=configs/finetune.py:{self.arg}"]
    flags_ += [f"--config.{o}" for o in self.overrides] + [f"--workdir={self.workdir}"]
    return "python -m vit_jax.main " + " \\\n      ".join(flags_)

  def cost(self) -> tuple[int, int]:
    """(training steps, training images) of the run (evaluations not counted)."""
    steps = int(self.config.total_steps)
    return steps, steps * int(self.config.batch_size)

  def result(self) -> dict[str, float] | None:
    """The finished run's final metrics, or None if it has not finished."""
    return workdir_lib.read_final_metrics(self.workdir)

  def execute(self) -> dict[str, float]:
    """Runs (or resumes) the run in this process; returns its final metrics."""
    from vit_jax import stages

    metrics = stages.run_and_record(self.config, self.workdir)
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def _run(run: Run, title: str) -> dict[str, float]:
  done = run.result()
  if done is not None:
    print(f"-- {title}: finished earlier ({run.workdir})", flush=True)
    return done
  steps, images = run.cost()
  print(f"\n== {title}: {steps:,} steps, {images:,} training images\n  {run.command()}", flush=True)
  return run.execute()


def transfer_dataset(dataset: str, grid: Sequence[float], options: dict[str, Any]) -> dict:
  """Grid on minival, the best rate, the final run on the whole training split; its results."""
  minival = {}
  for i, lr in enumerate(grid):
    metrics = _run(Run(dataset, lr, True, options), f"{dataset} grid {i + 1}/{len(grid)} lr={lr:g}")
    minival[lr] = metrics["minival/accuracy"]
  best = max(grid, key=lambda lr: (minival[lr], -lr))
  final = _run(Run(dataset, best, False, options), f"{dataset} final lr={best:g}")
  out = dict(lr=best, minival=minival[best], test=final["val/accuracy"], grid=minival)
  if "real/accuracy" in final:
    out["real"] = final["real/accuracy"]
  return out


def run_suite(
  suite: str,
  checkpoint: str,
  workdir: str,
  model: str = "",
  grid: Sequence[float] | None = None,
  runlocal: bool = False,
  overrides: Sequence[str] = (),
  paper: str | None = None,
) -> dict[str, Any]:
  """Runs the suite (see the module docstring); returns and writes its results.

  Returns:
    {'datasets': {dataset: {lr, minival, test, grid, [real], [logreg, knn3]}}, 'vtab': group
    means (fractions), 'paper': the Table 2 row or None, 'runs': number of runs}.
  """
  import jax

  from vit_jax.input_pipeline.sources import vtab

  names = suite_datasets(suite)
  options = dict(
    checkpoint=checkpoint, workdir=workdir, model=model, runlocal=runlocal, overrides=overrides
  )
  grids = {n: tuple(grid) if grid else finetune_module().LR_GRID[n] for n in names}
  plan = [Run(n, lr, True, options) for n in names for lr in grids[n]]
  plan += [Run(n, grids[n][0], False, options) for n in names]
  images = sum(r.cost()[1] for r in plan)
  print(
    f"suite {suite}: {len(names)} datasets, {len(plan)} runs (grid + final per dataset), "
    f"{images:,} training images in all",
    flush=True,
  )
  results = {}
  for name in names:
    results[name] = transfer_dataset(name, grids[name], options)
    if name in finetune_module().BUILTIN:  # raw-pixel logistic regression and kNN-3
      from vit_jax.evaluators import baselines

      results[name].update(baselines.pixel_baselines(name, "train", test_split="test"))
  tasks = {n.split("/", 1)[1]: r["test"] for n, r in results.items() if n.startswith("vtab/")}
  out = dict(
    suite=suite,
    checkpoint=checkpoint,
    model=model,
    datasets=results,
    vtab=vtab.group_means(tasks),
    paper=PAPER.get(paper),
    runs=len(plan),
  )
  if jax.process_index() == 0:
    root = epath.Path(workdir)
    workdir_lib.write_json(root / RESULTS_FILE, json.dumps(out, indent=2))
    (root / TABLE_FILE).write_text(table(out))
  print("\n" + table(out), flush=True)
  return out


def _pct(x: float | None) -> str:
  return "" if x is None else f"{100 * x:.2f}"


def _paper(paper: dict[str, float], key: str) -> str:
  return f"{paper[key]:.2f}" if key in paper else ""


def table(results: dict[str, Any]) -> str:
  """The markdown table of `run_suite`'s results."""
  paper = results.get("paper") or {}
  offline = any("logreg" in r for r in results["datasets"].values())
  head = "| dataset | lr | minival top-1 | test top-1 | paper |"
  rule = "|---|---|---|---|---|"
  if offline:
    head += " logreg (pixels) | kNN-3 (pixels) |"
    rule += "---|---|"
  lines = [
    f"Transfer of `{results['checkpoint']}` ({results['model'] or 'preset default'}), "
    f"suite {results['suite']}; top-1 in %.",
    "",
    head,
    rule,
  ]
  for name, r in results["datasets"].items():
    row = f"| {name} | {r['lr']:g} | {_pct(r['minival'])} | {_pct(r['test'])} | "
    row += f"{_paper(paper, name)} |"
    if offline:
      row += f" {_pct(r.get('logreg'))} | {_pct(r.get('knn3'))} |"
    lines.append(row)
    if "real" in r:
      lines.append(f"| {name} ReaL | {r['lr']:g} | | {_pct(r['real'])} | {_paper(paper, 'real')} |")
  for group, value in results["vtab"].items():
    label = "VTAB-1k mean (19 tasks)" if group == "mean" else f"VTAB-1k {group}"
    lines.append(
      f"| {label} | | | {_pct(value)} | {_paper(paper, 'vtab') if group == 'mean' else ''} |"
    )
  return "\n".join(lines) + "\n"


define_flags = cli.define_flags(
  checkpoint=cli.Flag(str, "Pretrained weights: .npz or a workdir.", required=True),
  model=cli.Flag("", "Model preset (vit_jax.models), e.g. L/16."),
  suite=cli.Flag("table2", "table2 | vtab | offline | a comma list."),
  workdir=cli.Flag(str, "Root of the runs' workdirs (local or gs://).", required=True),
  paper=cli.Flag(None, "Table 2 row shown beside results.", choices=sorted(PAPER)),
  grid=cli.Flag(list, "Learning rates replacing every dataset's grid."),
  runlocal=cli.Flag(False, "Shrink every run to seconds (testing)."),
  overrides=cli.Flag(
    [],
    "field=value set in every run's config, as --config.field=value.",
    multi=True,
    name="config_override",
  ),
  distributed=cli.DistributedFlags.define,
)


def main(argv, f):
  cli.no_arguments(argv)
  grid = f.grid.value

  def suite():
    from vit_jax.runtime import startup

    # TensorFlow and the rest, imported without the garbage collector (vit_jax.runtime.startup).
    startup.import_module("vit_jax.train.loop")
    run_suite(
      f.suite.value,
      f.checkpoint.value,
      f.workdir.value,
      model=f.model.value,
      grid=[float(x) for x in grid] if grid else None,
      runlocal=f.runlocal.value,
      overrides=f.overrides.value,
      paper=f.paper.value,
    )

  # Library chatter goes to <workdir>/logs; progress, commands and results stay on the terminal;
  # rerunning the same command after a stop continues the suite.
  cli.run_stages(suite, f.workdir.value, f.distributed)


if __name__ == "__main__":
  cli.run(main, "vit_jax", define_flags)
