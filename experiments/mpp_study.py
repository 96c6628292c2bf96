r"""Scratch vs masked-patch-prediction vs supervised pretraining, at CPU scale (paper §4.6).

  python -m experiments.mpp_study                # the full profile (long on 2 CPU cores)
  python -m experiments.mpp_study --quick        # the same stages, tiny budgets (CI)

The paper: ViT-B/16 pretrained on JFT with masked patch prediction (MPP) reaches 79.9% on
ImageNet after fine-tuning, 2% more than from scratch and 4% less than supervised pretraining on
JFT. Here, on the offline data:
  1. pretrain the same small ViT on Fashion-MNIST twice, with the same steps and batch:
     self-supervised (configs/pretrain_mpp.py, 3-bit mean colour targets) and supervised
     (configs/pretrain.py, the labels);
  2. fine-tune each, and a randomly initialised copy, on Animal-MNIST and on MNIST-5k with the
     same fine-tuning budget (configs/finetune.py, the whole training split, top-1 on the test
     split);
  3. fit raw-pixel logistic regression and kNN-3 (scikit-learn) on the same splits.
Fashion-MNIST is grey, so MPP predicts 8 grey levels here, not 512 colours.

Writes to --out (default experiments/results/mpp_study/; with --quick, <workdir>/results/):
results.json, table.md (markdown) and plot.png (a bar plot). Stage workdirs live under --workdir
(default /tmp/vit_mpp_study) and are removed first, so a rerun measures from scratch. Every stage
runs in this process through vit_jax.train.run, on all local devices.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import dataclasses
import os
import shutil
import time
import types

from absl import flags

from experiments import common, fingerprint
from vit_jax.evaluators import baselines
from vit_jax.runtime import cli

WORKDIR = "/tmp/vit_mpp_study"
DOWNSTREAM = ("animal_mnist", "mnist_5k")
INITS = ("scratch", "mpp", "supervised")  # each but scratch is pretrained first
# Column heads of the table, and what each pretraining's accuracy (its last logging window) is.
INIT_NAMES = dict(scratch="scratch", mpp="MPP-pretrained", supervised="supervised-pretrained")
PRETRAIN_ACCURACY = dict(
  mpp="MPP corrupted-patch accuracy", supervised="supervised training accuracy"
)


# The fields of a ViT preset that make its architecture (Table 1).
ARCHITECTURE = ("name", "patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers")


@dataclasses.dataclass(frozen=True)
class Profile:
  """Sizes of one profile."""

  model: str  # a vit_jax.models preset
  image_size: int
  pretrain_steps: int
  pretrain_batch: int
  finetune_steps: int
  finetune_batch: int
  max_train_examples: int | None  # downstream training examples (None: the whole split)
  max_test_examples: int | None  # evaluate on `test[:N]`, a builtin slice (None: all of test)


# The demo's ViT and pretraining budget (experiments/demo.py): patch 4 on 32px, 64 wide, 4 layers.
FULL = Profile(
  model="demo",
  image_size=32,
  pretrain_steps=1000,
  pretrain_batch=128,
  finetune_steps=200,
  finetune_batch=128,
  max_train_examples=None,
  max_test_examples=None,
)
QUICK = Profile(
  model="testing",
  image_size=16,
  pretrain_steps=8,
  pretrain_batch=32,
  finetune_steps=6,
  finetune_batch=32,
  max_train_examples=1000,
  max_test_examples=200,
)


def _common(config, profile: Profile, steps: int, batch: int) -> None:
  from vit_jax import models

  preset = models.get_model_config(profile.model)  # its architecture; the rest is the stage's
  config.model.update({k: preset[k] for k in ARCHITECTURE})
  config.dataset.image_size = profile.image_size
  config.total_steps = steps
  config.batch_size = batch
  config.schedule.warmup_steps = max(1, steps // 10)
  config.log_every_steps = max(1, steps // 10)
  config.checkpoint.every_steps = steps
  config.checkpoint.keep = 1


def pretrain_config(kind: str, profile: Profile):
  """Fashion-MNIST pretraining, MPP or supervised, with the profile's budget."""
  from vit_jax.configs import pretrain, pretrain_mpp

  if kind == "mpp":
    config = pretrain_mpp.get_config("dataset=fashion_mnist")
  else:
    config = pretrain.get_config("dataset=fashion_mnist")
    config.model.representation_size = None  # the same architecture as the MPP backbone
  _common(config, profile, profile.pretrain_steps, profile.pretrain_batch)
  config.evals = {}
  return config


def scored_split(profile: Profile) -> str:
  """The split the fine-tuned models and the pixel baselines are scored on."""
  n = profile.max_test_examples
  return f"test[:{n}]" if n else "test"


def finetune_config(dataset: str, init: str, profile: Profile, workdir: str):
  """Fine-tuning on `dataset`'s whole training split, top-1 on its test split."""
  from vit_jax.configs import finetune

  config = finetune.get_config("dataset=animal_mnist,holdout=false")
  config.dataset.name = dataset
  if profile.max_train_examples:
    config.dataset.train_split = f"train[:{profile.max_train_examples}]"
  _common(config, profile, profile.finetune_steps, profile.finetune_batch)
  config.evals.val.every_steps = 0
  config.dataset.eval_split = scored_split(profile)
  if init == "scratch":
    config.init_from_scratch = True
  else:
    config.model_init = workdir
  return config


def _table(results: dict) -> str:
  """table.md: test top-1 of each init fine-tuned, and the pixel baselines, per dataset."""
  lines = [
    "| downstream (test top-1) | "
    + " | ".join(INIT_NAMES[i] for i in INITS)
    + " | logistic regression | kNN-3 |",
    "|---|" + "---|" * (len(INITS) + 2),
  ]
  for dataset in DOWNSTREAM:
    r = results["finetune"][dataset]
    b = results["baselines"][dataset]
    cells = [f"{100 * r[i]:.1f}%" for i in INITS] + [
      f"{100 * b['logreg']:.1f}%",
      f"{100 * b['knn3']:.1f}%",
    ]
    lines.append(f"| {dataset} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def _budgets(results: dict) -> str:
  """The line printed under the table: the budgets and the pretrainings' accuracies."""
  pretrained = ", ".join(
    f"{PRETRAIN_ACCURACY[kind]} {100 * p['accuracy']:.1f}%"
    for kind, p in results["pretrain"].items()
  )
  return (
    f"Pretraining on Fashion-MNIST, {results['profile']['pretrain_steps']} steps at batch "
    f"{results['profile']['pretrain_batch']}: {pretrained} (last logging window). Fine-tuning: "
    f"{results['profile']['finetune_steps']} steps at batch {results['profile']['finetune_batch']}."
  )


def _plot(results: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  labels = [*INITS, "logreg", "knn3"]
  fig, ax = plt.subplots(figsize=(7, 3.5))
  width = 0.8 / len(labels)
  for i, label in enumerate(labels):
    values = [
      results["finetune"][d][label] if label in INITS else results["baselines"][d][label]
      for d in DOWNSTREAM
    ]
    ax.bar(np.arange(len(DOWNSTREAM)) + i * width, 100 * np.asarray(values), width, label=label)
  ax.set_xticks(np.arange(len(DOWNSTREAM)) + 0.4 - width / 2, DOWNSTREAM)
  ax.set_ylabel("test top-1 (%)")
  ax.set_title("Fine-tuning after no / MPP / supervised pretraining on Fashion-MNIST")
  ax.legend(fontsize=8, ncol=len(labels), loc="lower center")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    quick=flags.DEFINE_bool("quick", False, "Tiny budgets (CI).", flag_values=values),
    workdir=flags.DEFINE_string("workdir", WORKDIR, "Workdirs of the runs.", flag_values=values),
    out=flags.DEFINE_string(
      "out", None, "The results' folder (default: see the module docstring).", flag_values=values
    ),
  )


def stage_configs(profile: Profile, workdir: str) -> dict:
  """Every training stage of `profile` by its workdir's name under `workdir`: its config."""
  stages, pretrained = {}, {}
  for kind in (i for i in INITS if i != "scratch"):  # the pretrainings the inits start from
    pretrained[kind] = os.path.join(workdir, f"pretrain_{kind}")
    stages[f"pretrain_{kind}"] = pretrain_config(kind, profile)
  for dataset in DOWNSTREAM:
    for init in INITS:
      config = finetune_config(dataset, init, profile, pretrained.get(init, ""))
      stages[f"finetune_{dataset}_{init}"] = config
  return stages


def run(profile: Profile, workdir: str) -> dict:
  """Every stage and baseline of `profile`, in workdirs under `workdir` (removed first, so that
  a rerun measures from scratch): the results' dict."""
  from absl import logging

  from vit_jax import train

  logging.set_verbosity(logging.WARNING)
  total_start = time.perf_counter()
  configs = stage_configs(profile, workdir)
  # What the stages read (experiments/fingerprint.py): the pretrainings' images, and each
  # downstream dataset's.
  inputs = {k: fingerprint.data(configs[f"pretrain_{k}"]) for k in INITS if k != "scratch"}
  for dataset in DOWNSTREAM:  # the same data whatever the init
    inputs[dataset] = fingerprint.data(configs[f"finetune_{dataset}_{INITS[0]}"])
  results: dict = dict(
    quick=profile is QUICK,
    profile=dataclasses.asdict(profile),
    pretrain={},
    finetune={d: {} for d in DOWNSTREAM},
    baselines={},
    inputs=inputs,
    seconds={},
  )
  for name, config in configs.items():
    stage_workdir = os.path.join(workdir, name)
    shutil.rmtree(stage_workdir, ignore_errors=True)
    start = time.perf_counter()
    metrics = train.run(config, stage_workdir)
    results["seconds"][name] = time.perf_counter() - start
    kind, _, rest = name.partition("_")
    if kind == "pretrain":
      results["pretrain"][rest] = dict(loss=metrics["loss"], accuracy=metrics["accuracy"])
      print(f"pretrain {rest}: {results['pretrain'][rest]}", flush=True)
    else:
      dataset, init = rest.rsplit("_", 1)
      results["finetune"][dataset][init] = metrics["val/accuracy"]
      print(f"finetune {dataset} from {init}: {metrics['val/accuracy']:.4f}", flush=True)
  for dataset in DOWNSTREAM:
    n = profile.max_train_examples
    results["baselines"][dataset] = baselines.pixel_baselines(
      dataset, f"train[:{n}]" if n else "train", test_split=scored_split(profile)
    )
  results["seconds"]["total"] = time.perf_counter() - total_start
  return results


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  args = cli.values(f)
  started = common.provenance()
  results = run(QUICK if args.quick else FULL, args.workdir)
  out = common.out_dir(args.out, "mpp_study", args.workdir, args.quick)
  if out == common.results_dir("mpp_study"):  # the committed results: with the fingerprint
    quick = run(QUICK, os.path.join(args.workdir, "fingerprint"))
    fingerprint.attach(results, quick, stage_configs(FULL, WORKDIR))
  common.write_results(os.path.join(out, "results.json"), results, started)
  table = _table(results)
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table)
  _plot(results, os.path.join(out, "plot.png"))
  print(table + "\n" + _budgets(results), flush=True)
  print(f"results in {out}", flush=True)
  return results


if __name__ == "__main__":
  cli.run(main, "experiments.mpp_study", define_flags)
