r"""The README's demo: what pretraining buys, on real offline data, on a laptop's CPU.

  python -m experiments.demo                 # ~30 minutes on 2 CPU cores
  python -m experiments.demo --quick         # ~2 minutes: the same stages, tiny budgets (CI)

Stages, each a `python -m vit_jax.main` run in its own process with the commands printed, on the
bundled datasets (the `builtin` source: uint8 arrays in memory, so nothing is decoded per step):
  1. pretrain a small ViT on Fashion-MNIST (configs/pretrain.py), with periodic validation top-1
     and few-shot linear evaluation of the pre-logits on the two downstream sets;
  2. fine-tune it on Animal-MNIST (configs/finetune.py, `model_init` = the pretrain workdir);
  3. linear-probe its frozen pre-logits on MNIST-5k (configs/linear_probe.py);
  4. fine-tune the same architecture on Animal-MNIST from scratch, with the same budget;
  5. raw-pixel baselines on the same splits (vit_jax/baselines.py: logistic regression and
     kNN-3 on pixels / 255),
then print one table: each stage's dataset, accuracy, its baselines and wall time, and the gain
that pretraining bought on Animal-MNIST.

The stages' workdirs live under `--workdir` (default /tmp/vit_demo): pretrain/, finetune/,
probe/ and scratch/, removed first, so a rerun measures from scratch. results.json goes to
`--out` (default experiments/results/demo/; with --quick, <workdir>/results/).
"""

import argparse
import json
import os
import time

from experiments import common
from vit_jax import baselines


def split_flags(budget: common.DemoBudget) -> list[str]:
  """The stage's own dataset, cut to the profile's sizes (builtin slices of a fixed shuffle)."""
  flags = []
  if budget.max_train_examples:
    flags.append(f"--config.dataset.train_split=train[:{budget.max_train_examples}]")
  if budget.max_test_examples:
    flags.append(f"--config.dataset.eval_split=test[:{budget.max_test_examples}]")
  return flags


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default="/tmp/vit_demo")
  parser.add_argument("--out", help="results.json's folder (default: see the module docstring)")
  parser.add_argument("--quick", action="store_true", help="tiny budgets (~2 minutes, for CI)")
  parser.add_argument("--verbose", action="store_true", help="show every log line of the stages")
  args = parser.parse_args(argv)
  budget = common.DEMO_QUICK if args.quick else common.DEMO_FULL
  os.makedirs(args.workdir, exist_ok=True)
  work = {k: os.path.join(args.workdir, k) for k in ("pretrain", "finetune", "probe", "scratch")}
  total_start = time.perf_counter()

  model = [f"--config.model.{k}={v}" for k, v in common.DEMO_MODEL.items()]
  train_common = model + [f"--config.batch_size={budget.batch_size}", "--config.log_every_steps=50"]
  if args.quick:
    train_common += ["--config.log_every_steps=10", "--config.eval_batch_size=250"]
  every = budget.eval_every

  pretrain, pretrain_s = common.run_stage(
    "1. pretrain on Fashion-MNIST",
    # Softmax: one label per image here (the paper's sigmoid suits multi-label ImageNet-21k/JFT,
    # and with its -10 head bias it needs far more than this budget to get going).
    ["--config=configs/pretrain.py:dataset=fashion_mnist,loss=softmax"]
    + split_flags(budget)
    + train_common
    + [
      # The pretrain config sizes the pre-logits from the preset's width, before our override.
      f"--config.model.representation_size={common.DEMO_MODEL['hidden_size']}",
      f"--config.total_steps={budget.pretrain_steps}",
      f"--config.schedule.warmup_steps={max(budget.pretrain_steps // 20, 1)}",
      f"--config.evals.val.every_steps={every}",
      f"--config.evals.fewshot_animal_mnist.every_steps={every}",
      f"--config.evals.fewshot_mnist_5k.every_steps={every}",
      f"--config.checkpoint.every_steps={budget.pretrain_steps}",
    ],
    work["pretrain"],
    verbose=args.verbose,
  )
  finetune_args = (
    ["--config=configs/finetune.py:dataset=animal_mnist,holdout=false"]
    + split_flags(budget)
    + train_common
    + [
      f"--config.total_steps={budget.finetune_steps}",
      f"--config.schedule.warmup_steps={max(budget.finetune_steps // 10, 1)}",
      f"--config.evals.val.every_steps={every}",
      f"--config.checkpoint.every_steps={budget.finetune_steps}",
    ]
  )
  finetune, finetune_s = common.run_stage(
    "2. fine-tune the pretrained model on Animal-MNIST",
    finetune_args + [f"--config.model_init={work['pretrain']}"],
    work["finetune"],
    verbose=args.verbose,
  )
  # `runlocal` on the probe keeps the backbone (its architecture and resolution come from the
  # pretrain workdir's config.json) and one l2 value; --quick probes 256 examples of each split.
  probe_splits = ("train[:256]", "test[:256]") if args.quick else ("train", "test")
  _, probe_s = common.run_stage(
    "3. linear probe of the pretrained pre-logits on MNIST-5k",
    [
      "--config=configs/linear_probe.py:dataset=mnist_5k" + (",runlocal" if args.quick else ""),
      f"--config.model_init={work['pretrain']}",
      "--config.batch_size=250",
      f"--config.dataset.train_split={probe_splits[0]}",
      f"--config.dataset.eval_split={probe_splits[1]}",
    ],
    work["probe"],
    verbose=args.verbose,
  )
  with open(os.path.join(work["probe"], "linear_probe.json")) as f:
    probe = json.load(f)
  scratch, scratch_s = common.run_stage(
    "4. fine-tune the same model on Animal-MNIST from scratch (same budget)",
    finetune_args + ["--config.init_from_scratch=true"],
    work["scratch"],
    verbose=args.verbose,
  )

  print("\n== 5. raw-pixel baselines on the same splits (vit_jax/baselines.py)")
  start = time.perf_counter()
  # The splits the stages read (split_flags; the probe's probe_splits).
  train, test = "train", "test"
  if budget.max_train_examples:
    train = f"train[:{budget.max_train_examples}]"
  if budget.max_test_examples:
    test = f"test[:{budget.max_test_examples}]"
  base = {
    # 100 L-BFGS iterations on Fashion-MNIST's 60k (~15 s; 1000 take minutes).
    "fashion_mnist": baselines.pixel_baselines(
      "fashion_mnist", train, test_split=test, max_iter=100
    ),
    "animal_mnist": baselines.pixel_baselines("animal_mnist", train, test_split=test),
    "mnist_5k": baselines.pixel_baselines("mnist_5k", probe_splits[0], test_split=probe_splits[1]),
  }
  base_s = time.perf_counter() - start
  total_s = time.perf_counter() - total_start

  def pixels(name):
    return f"{base[name]['logreg']:.1%} / {base[name]['knn3']:.1%}"

  ft_acc, scratch_acc = finetune["val/accuracy"], scratch["val/accuracy"]
  rows = [
    (
      "1. pretrain",
      "fashion_mnist",
      budget.pretrain_steps,
      f"val {pretrain['val/accuracy']:.1%}",
      pixels("fashion_mnist"),
      pretrain_s,
    ),
    (
      "   10-shot of pre-logits",
      "animal_mnist",
      "",
      f"{pretrain.get('fewshot_animal_mnist/10shot', 0):.1%}",
      "",
      None,
    ),
    (
      "   10-shot of pre-logits",
      "mnist_5k",
      "",
      f"{pretrain.get('fewshot_mnist_5k/10shot', 0):.1%}",
      "",
      None,
    ),
    (
      "2. fine-tune (pretrained)",
      "animal_mnist",
      budget.finetune_steps,
      f"{ft_acc:.1%}",
      pixels("animal_mnist"),
      finetune_s,
    ),
    (
      "3. linear probe",
      "mnist_5k",
      "",
      f"logreg {probe['linear_probe/logreg_accuracy']:.1%}, "
      f"ridge {probe['linear_probe/ridge_accuracy']:.1%}",
      pixels("mnist_5k"),
      probe_s,
    ),
    (
      "4. fine-tune (scratch)",
      "animal_mnist",
      budget.finetune_steps,
      f"{scratch_acc:.1%}",
      pixels("animal_mnist"),
      scratch_s,
    ),
    ("5. pixel baselines", "all three", "", "", "", base_s),
  ]
  print("\n== Results (top-1 on each dataset's test split; pixels = raw-pixel baselines)")
  print(
    f"{'stage':<26} {'dataset':<14} {'steps':>6}  {'ViT':<26} "
    f"{'pixels logreg / kNN-3':<22} {'wall':>7}"
  )
  for stage, dataset, steps, acc, pix, seconds in rows:
    wall = common.fmt_seconds(seconds) if seconds is not None else ""
    print(f"{stage:<26} {dataset:<14} {steps!s:>6}  {acc:<26} {pix:<22} {wall:>7}")
  gain = 100 * (ft_acc - scratch_acc)
  print(
    f"\nPretraining on Fashion-MNIST bought {gain:+.1f} points of Animal-MNIST top-1 "
    f"({ft_acc:.1%} vs {scratch_acc:.1%} from scratch, both {budget.finetune_steps} steps)."
  )
  best = max(base["animal_mnist"]["logreg"], base["animal_mnist"]["knn3"])
  verdict = "above" if ft_acc > best else "below"
  print(
    f"The fine-tuned ViT is {verdict} the best raw-pixel baseline on Animal-MNIST "
    f"({100 * (ft_acc - best):+.1f} points)."
  )
  if args.quick:
    print("(--quick: budgets far too small for these numbers to mean anything.)")
  print(f"Total wall time {common.fmt_seconds(total_s)}.")
  results = dict(
    quick=args.quick,
    pretrain=pretrain,
    finetune=finetune,
    scratch=scratch,
    probe=probe,
    baselines=base,
    seconds=dict(
      pretrain=pretrain_s,
      finetune=finetune_s,
      probe=probe_s,
      scratch=scratch_s,
      baselines=base_s,
      total=total_s,
    ),
    gain_points=gain,
  )
  out = common.out_dir(args.out, "demo", args.workdir, args.quick)
  common.write_json(os.path.join(out, "results.json"), results)
  print(f"results.json in {out}")
  return results


if __name__ == "__main__":
  main()
