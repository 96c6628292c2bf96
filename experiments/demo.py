r"""The README's demo: what pretraining buys when labels are few, on real offline data, on a CPU.

  python -m experiments.demo                 # its time on 2 cores: results.json's `seconds`
  python -m experiments.demo --quick         # the same stages, tiny budgets (CI)

The paper's point is transfer: a model pretrained on a large dataset needs few labelled
examples of a new task. The demo measures that in miniature, on the bundled datasets (the
`builtin` source: uint8 arrays in memory):

  1. pretrain the 'demo' ViT on Fashion-MNIST: `configs/pretrain.py:dataset=fashion_mnist`
     (6,000 steps of batch 128, validation top-1 and few-shot evaluation of the pre-logits);
  2. for each number of labelled Animal-MNIST training images (`Profile.labels`: about 10, 100 and all
     900 per class, the first N of a fixed shuffle), with a fine-tuning budget that grows with
     N (`Profile.budgets`):
       - fine-tune the pretrained model (`configs/finetune.py:dataset=animal_mnist,holdout=false`
         on `train[:N]`), once per seed of `Profile.seeds` (the seed sets the data order, dropout and
         stochastic depth; the N images are the same), to show what another seed moves,
       - train the same architecture from scratch with the same budget (seed 0),
       - linear-probe the pretrained model's frozen features (`configs/linear_probe.py`): its
         pre-logits, and every block's output averaged over the patches (`representation=blocks`),
       - fit the raw-pixel baselines on the same N images (vit_jax/evaluators/baselines.py: logistic
         regression and kNN-3 on pixels / 255),
     all scored on Animal-MNIST's test split;
  3. print the table, plot accuracy against N (`label_efficiency.png`) and write results.json.

Every stage runs as its printed `python -m vit_jax.main` command would (experiments/common.py:
run_stage, in this process). The stages' workdirs live under `--workdir` (default /tmp/vit_demo:
pretrain/, then finetune_<N>/, scratch_<N>/, probe_<N>/), removed first, so a rerun measures
from scratch. Outputs go to `--out` (default experiments/results/demo/; with --quick,
<workdir>/results/). Writing the committed copy (experiments/results/demo/), the run also runs
the --quick profile (under <workdir>/fingerprint/) and keeps its numbers in results.json as the
code's fingerprint (experiments/fingerprint.py), which tests/test_demo.py compares with what
today's code computes.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import dataclasses
import os
import time
import types

from absl import flags

from experiments import common, fingerprint
from vit_jax.evaluators import baselines
from vit_jax.runtime import cli

DOWNSTREAM = "animal_mnist"  # 9,000 training images in 10 classes, 1,000 test images
WORKDIR = "/tmp/vit_demo"  # --workdir's default


@dataclasses.dataclass(frozen=True)
class Budget:
  """Training budget of one fine-tuning run (pretrained and from scratch alike)."""

  steps: int
  batch_size: int


@dataclasses.dataclass(frozen=True)
class Profile:
  pretrain_steps: int | None  # None: configs/pretrain.py's own (the quick profile cuts it)
  pretrain_batch: int | None
  pretrain_examples: int | None  # pretrain on `train[:N]` (None: all 60,000)
  labels: tuple[int | None, ...]  # Animal-MNIST training images per run (None: all)
  budgets: tuple[Budget, ...]  # one per entry of `labels`
  test_examples: int | None  # score on `test[:N]` (None: the whole test split)
  seeds: tuple[int, ...]  # the fine-tuning runs' seeds (the first one's workdir has no suffix)


# Measured on 2 CPU cores: fine-tuning the demo's pretrained model on all of Animal-MNIST for 600
# steps of batch 128 reached 89.7% at lr 0.1 and 84.9% at 0.03, still rising; 1,000 steps (the
# finetune preset) is what the budget affords. Fewer labels take fewer steps: each run sees its
# N images 30-40 times.
FULL = Profile(
  pretrain_steps=None,
  pretrain_batch=None,
  pretrain_examples=None,
  labels=(100, 1000, None),
  budgets=(Budget(100, 32), Budget(300, 128), Budget(1000, 128)),
  test_examples=None,
  seeds=(0, 1, 2),
)
QUICK = Profile(
  pretrain_steps=30,
  pretrain_batch=32,
  pretrain_examples=2000,
  labels=(200,),  # one row: the code paths of every stage, each run once
  budgets=(Budget(10, 16),),  # one compiled step for both fine-tuning runs
  test_examples=200,
  seeds=(0,),  # a second seed is a flag (FULL's configs are checked by the tests)
)


def _label(n: int | None) -> str:
  return "all" if n is None else str(n)


def _split(split: str, n: int | None) -> str:
  return split if n is None else f"{split}[:{n}]"


def pretrain_flags(profile: Profile, quick: bool) -> list[str]:
  """`configs/pretrain.py:dataset=fashion_mnist` as it is, or cut to the quick profile."""
  flags = ["--config=configs/pretrain.py:dataset=fashion_mnist"]
  if quick:
    flags += [
      f"--config.dataset.train_split={_split('train', profile.pretrain_examples)}",
      f"--config.dataset.eval_split={_split('test', profile.test_examples)}",
      f"--config.total_steps={profile.pretrain_steps}",
      f"--config.batch_size={profile.pretrain_batch}",
      f"--config.schedule.warmup_steps={max(profile.pretrain_steps // 10, 1)}",
      f"--config.checkpoint.every_steps={profile.pretrain_steps}",
      "--config.eval_batch_size=100",
      "--config.evals.val.every_steps=0",
    ]
    for name in ("animal_mnist", "mnist_5k"):  # few-shot at the end, on a few hundred images
      flags += [
        f"--config.evals.fewshot_{name}.every_steps=0",
        f"--config.evals.fewshot_{name}.dataset.train_split=train[:500]",
        f"--config.evals.fewshot_{name}.dataset.eval_split={_split('test', profile.test_examples)}",
      ]
  return flags


def finetune_flags(profile: Profile, n: int | None, budget: Budget) -> list[str]:
  """Fine-tuning on `train[:n]` of Animal-MNIST with `budget`, scored on the test split once, at
  the end (add --config.model_init or --config.init_from_scratch=true)."""
  flags = [f"--config=configs/finetune.py:dataset={DOWNSTREAM},holdout=false"]
  if n is not None:
    flags.append(f"--config.dataset.train_split={_split('train', n)}")
  if profile.test_examples is not None:
    flags.append(f"--config.dataset.eval_split={_split('test', profile.test_examples)}")
  if budget != Budget(1000, 128):  # otherwise the preset's own
    flags += [
      f"--config.total_steps={budget.steps}",
      f"--config.batch_size={budget.batch_size}",
      f"--config.schedule.warmup_steps={max(budget.steps // 10, 1)}",
    ]
  flags += [
    f"--config.checkpoint.every_steps={budget.steps}",
    "--config.evals.val.every_steps=0",
    "--config.eval_batch_size=100" if profile.test_examples else "--config.eval_batch_size=250",
  ]
  return flags


def probe_flags(profile: Profile, n: int | None, pretrained: str, representation: str) -> list[str]:
  """The linear probe of `pretrained`'s frozen `representation` (pre_logits | blocks) on
  `train[:n]`, scored on the test split."""
  return [
    f"--config=configs/linear_probe.py:dataset={DOWNSTREAM},representation={representation}",
    f"--config.model_init={pretrained}",
    f"--config.dataset.train_split={_split('train', n)}",
    f"--config.dataset.eval_split={_split('test', profile.test_examples)}",
  ]


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    **common.define_stage_flags(values, WORKDIR, "tiny budgets (~1 minute, for CI)")
  )


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  args = cli.values(f)
  started = common.provenance()
  results = run(QUICK if args.quick else FULL, args.workdir, args.verbose)
  out = common.out_dir(args.out, "demo", args.workdir, args.quick)
  if out == common.results_dir("demo"):  # the committed results: with the code's fingerprint
    quick = run(QUICK, os.path.join(args.workdir, "fingerprint"), args.verbose)
    fingerprint.attach(results, quick, stage_flags(FULL, WORKDIR))
  _report(results, out)
  common.write_results(os.path.join(out, "results.json"), results, started)
  print(f"results.json, table.md and label_efficiency.png in {out}")
  return results


def stage_flags(profile: Profile, workdir: str) -> dict[str, list[str]]:
  """Every training stage of `profile` by its workdir's name under `workdir`: its flags."""
  pretrained = os.path.join(workdir, "pretrain")
  stages = {"pretrain": pretrain_flags(profile, profile is QUICK)}
  for n, budget in zip(profile.labels, profile.budgets, strict=True):
    label = _label(n)
    ft = finetune_flags(profile, n, budget)
    for seed in profile.seeds:
      seeded = [f"--config.seed={seed}"] if seed else []
      stages[_finetune(label, seed)] = [*ft, *seeded, f"--config.model_init={pretrained}"]
    stages[f"scratch_{label}"] = [*ft, "--config.init_from_scratch=true"]
    stages[f"probe_{label}"] = probe_flags(profile, n, pretrained, "pre_logits")
    stages[f"probe_blocks_{label}"] = probe_flags(profile, n, pretrained, "blocks")
  return stages


def _finetune(label: str, seed: int) -> str:
  """The workdir's name of a fine-tuning run."""
  return f"finetune_{label}" + (f"_seed{seed}" if seed else "")


def run(profile: Profile, workdir: str, verbose: bool = False) -> dict:
  """Every stage and baseline of `profile`, in workdirs under `workdir`: the results' dict."""
  os.makedirs(workdir, exist_ok=True)
  total_start = time.perf_counter()
  flags = stage_flags(profile, workdir)

  def stage(title, name):
    return common.run_stage(title, flags[name], os.path.join(workdir, name), verbose=verbose)

  # What the training stages read (experiments/fingerprint.py): seconds of input pipeline each.
  inputs = dict(pretrain=fingerprint.data(flags["pretrain"]))
  pretrain, pretrain_s = stage("1. pretrain the demo ViT on Fashion-MNIST", "pretrain")
  test = _split("test", profile.test_examples)
  start = time.perf_counter()
  # 100 L-BFGS iterations on Fashion-MNIST's 60k (~15 s; 1000 take minutes).
  pretrain_pixels = baselines.pixel_baselines(
    "fashion_mnist", _split("train", profile.pretrain_examples), test_split=test, max_iter=100
  )
  seconds = dict(pretrain=pretrain_s, baselines=time.perf_counter() - start)
  rows = {}
  for n, budget in zip(profile.labels, profile.budgets, strict=True):
    label = _label(n)
    title = f"{label} labelled Animal-MNIST images"
    inputs[f"finetune_{label}"] = fingerprint.data(finetune_flags(profile, n, budget))
    finetuned = {}
    for seed in profile.seeds:
      name = _finetune(label, seed)
      ft, seconds[name] = stage(f"2. fine-tune the pretrained model on {title}, seed {seed}", name)
      finetuned[f"seed{seed}"] = ft["val/accuracy"]
    scratch, seconds[f"scratch_{label}"] = stage(
      f"2. train the same model from scratch on {title}, same budget", f"scratch_{label}"
    )
    probe, seconds[f"probe_{label}"] = stage(
      f"2. linear probe of the pretrained pre-logits on {title}", f"probe_{label}"
    )
    blocks, seconds[f"probe_blocks_{label}"] = stage(
      f"2. linear probe of every pretrained block's pooled output on {title}",
      f"probe_blocks_{label}",
    )
    accuracies = list(finetuned.values())
    start = time.perf_counter()
    pixels = baselines.pixel_baselines(DOWNSTREAM, _split("train", n), test_split=test)
    seconds["baselines"] += time.perf_counter() - start
    rows[label] = dict(
      train_examples=pixels["train_examples"],
      test_examples=pixels["test_examples"],
      steps=budget.steps,
      batch_size=budget.batch_size,
      finetune=sum(accuracies) / len(accuracies),  # the mean over the seeds
      finetune_seeds=finetuned,
      finetune_spread=max(accuracies) - min(accuracies),
      scratch=scratch["val/accuracy"],
      probe=probe["linear_probe/logreg_accuracy"],
      probe_ridge=probe["linear_probe/ridge_accuracy"],
      probe_blocks=blocks["linear_probe/logreg_accuracy"],
      probe_blocks_ridge=blocks["linear_probe/ridge_accuracy"],
      pixels_logreg=pixels["logreg"],
      pixels_knn3=pixels["knn3"],
      finetune_test_examples=int(ft["val/num_examples"]),
      probe_train_examples=int(probe["linear_probe/num_train"]),
    )
  seconds["total"] = time.perf_counter() - total_start
  return dict(
    quick=profile is QUICK,
    pretrain=dict(pretrain, pixels=pretrain_pixels),
    labels=rows,
    inputs=inputs,
    seconds=seconds,
  )


def table(results: dict) -> str:
  """The markdown table of the results: one row per number of labelled images."""
  seeds = len(next(iter(results["labels"].values()))["finetune_seeds"])
  finetuned = (
    f"mean of {seeds} seeds (lowest-highest)" if seeds > 1 else "one seed (the same twice)"
  )
  lines = [
    f"| labelled images | fine-tuned (pretrained): {finetuned} "
    "| from scratch | linear probe (pretrained): every block's pooled output | the same: "
    "pre-logits | pixels logreg | pixels kNN-3 | steps × batch |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for row in results["labels"].values():
    accuracies = row["finetune_seeds"].values()
    lines.append(
      f"| {row['train_examples']:,} | {row['finetune']:.1%} ({min(accuracies):.1%}-"
      f"{max(accuracies):.1%}) | {row['scratch']:.1%} | {row['probe_blocks']:.1%} "
      f"| {row['probe']:.1%} | {row['pixels_logreg']:.1%} | {row['pixels_knn3']:.1%} "
      f"| {row['steps']} × {row['batch_size']} |"
    )
  return "\n".join(lines)


def _report(results: dict, out: str) -> None:
  """Prints the pretraining row, the table and what it shows; writes table.md and the plot."""
  pretrain, pixels = results["pretrain"], results["pretrain"]["pixels"]
  print(
    f"\n== Pretraining on Fashion-MNIST: val top-1 {pretrain['val/accuracy']:.1%} "
    f"(pixels logreg {pixels['logreg']:.1%}, kNN-3 {pixels['knn3']:.1%}), "
    f"{common.fmt_seconds(results['seconds']['pretrain'])}"
  )
  test = next(iter(results["labels"].values()))["test_examples"]
  print(f"\n== Animal-MNIST test top-1 ({test:,} images) against the labelled images trained on")
  text = table(results)
  print(text)
  for label, row in results["labels"].items():
    best = max(row["pixels_logreg"], row["pixels_knn3"])
    worst = min(row["finetune_seeds"].values())
    print(
      f"{label:>4} labels: pretraining bought {100 * (row['finetune'] - row['scratch']):+.1f} "
      f"points over scratch; fine-tuned ViT {100 * (row['finetune'] - best):+.1f} points vs the "
      f"best pixel baseline (its lowest seed {100 * (worst - best):+.1f}; seeds' spread "
      f"{100 * row['finetune_spread']:.1f})"
    )
  common.finish_report(results, text, out)
  _plot(results, os.path.join(out, "label_efficiency.png"))


def _plot(results: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = list(results["labels"].values())
  n = [row["train_examples"] for row in rows]
  fig, ax = plt.subplots(figsize=(7.0, 5.4))
  low = [100 * min(row["finetune_seeds"].values()) for row in rows]
  high = [100 * max(row["finetune_seeds"].values()) for row in rows]
  ax.fill_between(n, low, high, alpha=0.2, color="C0")
  for key, name, style in (
    ("finetune", "ViT fine-tuned, pretrained (seeds' mean, range)", "o-"),
    ("scratch", "ViT from scratch (same budget)", "s-"),
    ("probe_blocks", "linear probe, pretrained: every block", "^-"),
    ("probe", "linear probe, pretrained: pre-logits", "v:"),
    ("pixels_knn3", "pixels kNN-3", "x--"),
    ("pixels_logreg", "pixels logistic regression", "+--"),
  ):
    ax.plot(n, [100 * row[key] for row in rows], style, label=name)
  ax.set_xscale("log")
  ax.set_xlabel("labelled Animal-MNIST training images")
  ax.set_ylabel("test top-1 (%)")
  ax.set_title("What pretraining buys as labels grow (demo)")
  ax.grid(alpha=0.3)
  fig.legend(loc="lower center", ncol=2, fontsize=8, frameon=False)
  fig.tight_layout(rect=(0, 0.14, 1, 1))
  fig.savefig(path, dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  cli.run(main, "experiments.demo", define_flags)
