r"""AugReg in miniature: what later recipes and distillation buy a ViT when the data is small.

  python -m experiments.small_data             # the full profile (results.json's `seconds`)
  python -m experiments.small_data --quick     # the same code paths, tiny budgets (tests)
  python -m experiments.small_data --seeds=3   # every run with several seeds (experiments/small_data_gpu.sh)

The ViT paper's first limitation: a ViT "generalises badly on small datasets without massive
pretraining or strong regularisation". AugReg (Steiner et al. 2021) measured that augmentation
and regularisation are worth about ten times more data; "better plain ViT baselines" (Beyer et
al. 2022) and DeiT's distillation from a convolutional teacher (Touvron et al. 2021) are the
later answers. Here, on Fashion-MNIST, for each fraction of its 60,000 training images
(`Profile.fractions`: the first 1% and 10% of `train`, the builtin datasets' nested slices; all of
it is the demo's pretraining):

  1. the raw-pixel baselines (vit_jax/evaluators/baselines.py: logistic regression and kNN-3 on pixels
     / 255) on the same images;
  2. `ARMS`, each one `python -m vit_jax.main` stage of configs/pretrain.py:dataset=fashion_mnist,
     all with the same image budget (steps × batch, `Profile`):
       bit        BiT-R26x1 (the paper's recipe): the convolutional reference and the teacher
       paper      the demo ViT, the paper's recipe (class token, learned position embeddings)
       plain2022  the demo ViT, recipe=plain2022 (GAP, sin-cos position embeddings,
                  RandAugment(2, 10), Mixup 0.2; configs/recipes.py)
       distill    plain2022 with DeiT's hard-label distillation from `bit` of the same
                  fraction, both terms on the one head (the GAP model has no token to add a
                  distillation token beside: vit_jax/objectives/distill.py)
     scored on Fashion-MNIST's test split; the training accuracy of the last logged steps
     (on the augmented, mixed batches) beside it tells under- from over-fitting;
  3. each pretrained model fine-tuned on 1,000 labelled Animal-MNIST images (the demo's middle
     row: 300 steps of batch 128), scored on Animal-MNIST's test split, beside the pixel
     baselines on the same 1,000 images.

Outputs in --out (default experiments/results/small_data/; with --quick, <workdir>/results/):
results.json, table.md and small_data.png (docs/experiments/small_data.md shows them). The
stages' workdirs live under --workdir (default /tmp/vit_small_data: <N>/<arm>_seed<s>/ and
<N>/<arm>_seed<s>_transfer/), each removed first, so a rerun measures from scratch; with
--resume a stage that finished there before (its metrics.json) is not run again. Writing the
committed copy, the run also runs the --quick profile (under <workdir>/fingerprint/) and keeps its
numbers in results.json as the code's fingerprint (experiments/fingerprint.py), which
tests/test_small_data.py compares with what today's code computes.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import dataclasses
import os
import statistics
import time
import types
from typing import Any

from absl import flags

from experiments import common, fingerprint
from vit_jax.evaluators import baselines
from vit_jax.runtime import cli

UPSTREAM, DOWNSTREAM = "fashion_mnist", "animal_mnist"
TRANSFER_LABELS = 1000
WORKDIR = "/tmp/vit_small_data"  # --workdir's default

# arm -> the flags that make it, on top of configs/pretrain.py:dataset=fashion_mnist. `distill`
# also takes its teacher: the `bit` run of the same fraction and seed.
ARMS: dict[str, list[str]] = {
  "bit": ["--config=configs/pretrain.py:dataset=fashion_mnist,model=R26x1,recipe=paper"],
  "paper": ["--config=configs/pretrain.py:dataset=fashion_mnist,recipe=paper"],
  "plain2022": ["--config=configs/pretrain.py:dataset=fashion_mnist,recipe=plain2022"],
  "distill": ["--config=configs/pretrain.py:dataset=fashion_mnist,recipe=plain2022"],
}


@dataclasses.dataclass(frozen=True)
class Profile:
  fractions: tuple[int, ...]  # training images of Fashion-MNIST per run (the first N)
  steps: int  # every arm's budget: steps × batch images
  batch: int
  test_examples: int | None  # score on `test[:N]` (None: all 10,000)
  transfer_steps: int
  transfer_labels: int


# 1,500 steps of 128 images (192,000 images: 32 epochs of 6,000, 320 of 600) per arm. All of
# Fashion-MNIST (60,000) is the demo's pretraining (experiments/demo.py, the paper's recipe);
# a third fraction here would add about 25 minutes on 2 cores.
FULL = Profile(
  fractions=(600, 6_000),
  steps=1_500,
  batch=128,
  test_examples=None,
  transfer_steps=300,
  transfer_labels=TRANSFER_LABELS,
)
QUICK = Profile(
  fractions=(200,),
  steps=8,
  batch=16,
  test_examples=200,
  transfer_steps=4,
  transfer_labels=100,
)


def _split(split: str, n: int | None) -> str:
  return split if n is None else f"{split}[:{n}]"


def pretrain_flags(arm: str, n: int, seed: int, profile: Profile, teacher: str) -> list[str]:
  """The arm's stage on the first `n` training images, `profile`'s budget, scored at the end."""
  flags = [
    *ARMS[arm],
    f"--config.seed={seed}",
    f"--config.dataset.train_split={_split('train', n)}",
    f"--config.dataset.eval_split={_split('test', profile.test_examples)}",
    f"--config.total_steps={profile.steps}",
    f"--config.batch_size={profile.batch}",
    f"--config.schedule.warmup_steps={max(profile.steps // 20, 1)}",
    f"--config.checkpoint.every_steps={profile.steps}",
    f"--config.log_every_steps={max(profile.steps // 20, 1)}",
    "--config.evals.val.every_steps=0",  # after the last step only
    "--config.evals.fewshot_animal_mnist.every_steps=0",
    "--config.evals.fewshot_mnist_5k.every_steps=0",
  ]
  if profile.test_examples:
    flags.append("--config.eval_batch_size=100")
  if arm == "distill":
    flags.append(f"--config.distill.teacher={teacher}")
  return flags


def transfer_flags(arm: str, pretrained: str, profile: Profile) -> list[str]:
  """Fine-tuning `pretrained` on the first `transfer_labels` Animal-MNIST images (the
  architecture from the checkpoint), scored on the test split at the end."""
  model = "R26x1" if arm == "bit" else "demo"
  return [
    f"--config=configs/finetune.py:dataset={DOWNSTREAM},holdout=false,model={model}",
    f"--config.model_init={pretrained}",
    "--config.model_from_init=true",
    f"--config.dataset.train_split={_split('train', profile.transfer_labels)}",
    f"--config.dataset.eval_split={_split('test', profile.test_examples)}",
    f"--config.total_steps={profile.transfer_steps}",
    f"--config.batch_size={min(profile.batch, 128)}",
    f"--config.schedule.warmup_steps={max(profile.transfer_steps // 10, 1)}",
    f"--config.checkpoint.every_steps={profile.transfer_steps}",
    "--config.evals.val.every_steps=0",
    "--config.eval_batch_size=100",
  ]


def stage_flags(profile: Profile, workdir: str, seeds: int = 1) -> dict[str, list[str]]:
  """Every training stage of `profile` by its workdir under `workdir` (`<N>/<arm>_seed<s>` and
  its `_transfer`): its flags."""
  stages = {}
  for n in profile.fractions:
    for arm in ARMS:
      for seed in range(seeds):
        where = os.path.join(workdir, str(n), f"{arm}_seed{seed}")
        teacher = os.path.join(workdir, str(n), f"bit_seed{seed}")
        stages[f"{n}/{arm}_seed{seed}"] = pretrain_flags(arm, n, seed, profile, teacher)
        stages[f"{n}/{arm}_seed{seed}_transfer"] = transfer_flags(arm, where, profile)
  return stages


def run(
  profile: Profile, workdir: str, seeds: int = 1, verbose: bool = False, resume: bool = False
) -> dict[str, Any]:
  """Every baseline, arm and transfer of `profile`: the results' dict."""
  test = _split("test", profile.test_examples)
  seconds: dict[str, float] = {}
  rows: dict[str, Any] = {}
  flags = stage_flags(profile, workdir, seeds)
  # What the arms' training stages read (experiments/fingerprint.py), on the first fraction.
  inputs = {arm: fingerprint.data(flags[f"{profile.fractions[0]}/{arm}_seed0"]) for arm in ARMS}
  start = time.perf_counter()
  transfer_pixels = baselines.pixel_baselines(
    DOWNSTREAM, _split("train", profile.transfer_labels), test_split=test
  )
  seconds["baselines"] = time.perf_counter() - start
  for n in profile.fractions:
    start = time.perf_counter()
    pixels = baselines.pixel_baselines(UPSTREAM, _split("train", n), test_split=test, max_iter=100)
    seconds["baselines"] += time.perf_counter() - start
    row: dict[str, Any] = dict(train_examples=pixels["train_examples"], pixels=pixels, arms={})
    for arm in ARMS:
      runs = []
      for seed in range(seeds):
        name = f"{n}/{arm}_seed{seed}"
        metrics, s = common.run_stage(
          f"{arm} on {n:,} Fashion-MNIST images, seed {seed}",
          flags[name],
          os.path.join(workdir, name),
          resume=resume,
          verbose=verbose,
        )
        seconds[f"{n}/{arm}/{seed}"] = s
        ft, s = common.run_stage(
          f"{arm} ({n:,} images, seed {seed}) fine-tuned on {profile.transfer_labels:,} "
          "Animal-MNIST labels",
          flags[f"{name}_transfer"],
          os.path.join(workdir, f"{name}_transfer"),
          resume=resume,
          verbose=verbose,
        )
        seconds[f"{n}/{arm}/{seed}/transfer"] = s
        runs.append(
          dict(
            val=metrics["val/accuracy"],
            train=metrics["accuracy"],
            transfer=ft["val/accuracy"],
            images_per_sec=metrics.get("images_per_sec"),
          )
        )
      row["arms"][arm] = dict(
        runs=runs,
        **{key: statistics.fmean(r[key] for r in runs) for key in ("val", "train", "transfer")},
      )
    rows[str(n)] = row
  # The stages' and baselines' own seconds: with --resume, stages that finished in an earlier
  # process count with the time they took there.
  seconds["total"] = sum(seconds.values())
  return dict(
    quick=profile is QUICK,
    budget=dict(steps=profile.steps, batch=profile.batch, images=profile.steps * profile.batch),
    seeds=seeds,
    fractions=rows,
    transfer=dict(
      labels=profile.transfer_labels, steps=profile.transfer_steps, pixels=transfer_pixels
    ),
    inputs=inputs,
    seconds=seconds,
  )


def table(results: dict[str, Any]) -> str:
  """One row per arm and pixel baseline, two columns per fraction: Fashion-MNIST test top-1
  (training accuracy of the last logged steps), and the model fine-tuned on Animal-MNIST."""
  rows = results["fractions"]
  head = "| | " + " | ".join(
    f"{r['train_examples']:,} images: test (train) | {r['train_examples']:,} → Animal-MNIST"
    for r in rows.values()
  )
  lines = [head + " |", "|---" * (1 + 2 * len(rows)) + "|"]
  for arm in ARMS:
    cells = []
    for r in rows.values():
      a = r["arms"][arm]
      cells += [f"{a['val']:.1%} ({a['train']:.0%})", f"{a['transfer']:.1%}"]
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  transfer = results["transfer"]["pixels"]
  for key, name in (("logreg", "pixels, logistic regression"), ("knn3", "pixels, kNN-3")):
    cells = []
    for r in rows.values():
      cells += [f"{r['pixels'][key]:.1%}", f"{transfer[key]:.1%}"]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _report(results: dict[str, Any], out: str) -> None:
  text = table(results)
  budget = results["budget"]
  print(
    f"\n== Fashion-MNIST test top-1 after {budget['steps']:,} steps of {budget['batch']} "
    f"({budget['images']:,} images) per arm; (training accuracy); → Animal-MNIST fine-tuned"
  )
  print(text)
  pixels = results["transfer"]["pixels"]
  print(
    f"Animal-MNIST with {results['transfer']['labels']:,} labels, raw pixels: logistic "
    f"regression {pixels['logreg']:.1%}, kNN-3 {pixels['knn3']:.1%}."
  )
  common.finish_report(results, text, out)
  _plot(results, os.path.join(out, "small_data.png"))


def _plot(results: dict[str, Any], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = list(results["fractions"].values())
  n = [row["train_examples"] for row in rows]
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
  ax = axes[0]
  for arm, style in zip(ARMS, ("s-", "o-", "^-", "v-"), strict=True):
    ax.plot(n, [100 * row["arms"][arm]["val"] for row in rows], style, label=arm)
  ax.plot(n, [100 * row["pixels"]["logreg"] for row in rows], "+--", label="pixels logreg")
  ax.plot(n, [100 * row["pixels"]["knn3"] for row in rows], "x--", label="pixels kNN-3")
  ax.set_xscale("log")
  ax.set_xlabel("Fashion-MNIST training images")
  ax.set_ylabel("Fashion-MNIST test top-1 (%)")
  ax.set_title("Trained on N images, equal image budget")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  ax = axes[1]
  for arm, style in zip(ARMS, ("s-", "o-", "^-", "v-"), strict=True):
    ax.plot(n, [100 * row["arms"][arm]["transfer"] for row in rows], style, label=arm)
  pixels = results["transfer"]["pixels"]
  best = 100 * max(pixels["logreg"], pixels["knn3"])
  ax.axhline(best, color="grey", ls="--", label="best pixel baseline")
  ax.set_xscale("log")
  ax.set_xlabel("Fashion-MNIST pretraining images")
  ax.set_ylabel(f"Animal-MNIST test top-1 (%), {results['transfer']['labels']:,} labels")
  ax.set_title("Transfer: fine-tuned")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    **common.define_stage_flags(values, WORKDIR, "tiny budgets (for CI)"),
    seeds=flags.DEFINE_integer("seeds", 1, "Runs per arm and fraction.", flag_values=values),
    resume=flags.DEFINE_bool(
      "resume", False, "Keep the stages that finished in --workdir before.", flag_values=values
    ),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> dict[str, Any]:
  args = cli.values(f)
  if args.seeds < 1:
    raise ValueError(f"--seeds={args.seeds}; expected 1 or more")
  started = common.provenance()
  results = run(QUICK if args.quick else FULL, args.workdir, args.seeds, args.verbose, args.resume)
  out = common.out_dir(args.out, "small_data", args.workdir, args.quick)
  if out == common.results_dir("small_data"):  # the committed results: with the fingerprint
    quick = run(QUICK, os.path.join(args.workdir, "fingerprint"), verbose=args.verbose)
    fingerprint.attach(results, quick, stage_flags(FULL, WORKDIR, args.seeds))
  _report(results, out)
  common.write_results(os.path.join(out, "results.json"), results, started)
  print(f"results.json, table.md and small_data.png in {out}")
  return results


if __name__ == "__main__":
  cli.run(main, "experiments.small_data", define_flags)
