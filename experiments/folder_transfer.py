r"""Your own image folder as a downstream set: the demo's fine-tuning recipe against raw pixels.

  python -m experiments.folder_transfer      # the bundled handwritten digits, written as a folder
  python -m experiments.folder_transfer --builtin=mnist_5k --no_scratch   # another bundled set
  python -m experiments.folder_transfer --folder=/data/mine --pretrained=/tmp/vit_demo/pretrain
  python -m experiments.folder_transfer --quick --pretrained=...   # tiny budgets (tests)

A folder `<folder>/{train,test}/<class>/*.{png,jpg,jpeg}` (the `folder` source of
vit_jax.input_pipeline) is fine-tuned on exactly as the demo fine-tunes on Animal-MNIST
(configs/finetune.py:dataset=animal_mnist: SGD with momentum, lr 0.1, 1,000 steps of 128, 32px):
  1. from the demo's pretrained ViT (`--pretrained`, default the pretrain stage of
     experiments/demo.py: run the demo first), then
  2. the same from scratch, with the same budget (unless --no_scratch);
  3. raw-pixel baselines (vit_jax/evaluators/baselines.py: logistic regression and kNN-3 on the folder's
     pixels / 255, as stored; resized to the model's resolution only when the images differ in
     size) on the same train and test split,
and one table is printed. Without `--folder`, a bundled dataset (`--builtin`, default `digits`:
scikit-learn's 1,797 8×8 handwritten digits, its fixed stratified split: 1,618 train / 179 test)
is written as PNGs to `<workdir>/<name>` first.

The recipe's horizontal flips are left out (`--pp_train`): digits and letters are not mirror
symmetric; pass the demo's `decode|resize|flip_lr|value_range(-1, 1)` for natural images.
The runs' workdirs live under `--workdir` (default /tmp/vit_folder_transfer); results.json goes to
`--out` (default experiments/results/folder_transfer/; with --quick, <workdir>/results/).
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import dataclasses
import json
import os
import shutil
import time
import types

import numpy as np
from absl import flags

from experiments import common
from vit_jax.evaluators import baselines
from vit_jax.runtime import cli
from vit_jax.tools import make_folder

NO_FLIP = "decode|resize|value_range(-1, 1)"


@dataclasses.dataclass(frozen=True)
class Budget:
  """One fine-tuning run's budget (pretrained and from scratch alike)."""

  steps: int
  batch_size: int


# The demo's fine-tuning on all of Animal-MNIST (the finetune preset), and a CI-sized one.
FULL = Budget(steps=1000, batch_size=128)
QUICK = Budget(steps=20, batch_size=32)


def _bundled_folder(name: str, root: str) -> str:
  """`root` holding builtin dataset `name` as a folder (vit_jax.tools.make_folder), written
  unless an earlier run wrote both splits."""
  if not all(os.path.isdir(os.path.join(root, split)) for split in ("train", "test")):
    shutil.rmtree(root, ignore_errors=True)  # a run stopped while writing it
    make_folder.write_classification(name, root)
  return root


def read_folder(root: str, split: str, image_size: int) -> tuple[np.ndarray, np.ndarray]:
  """The images (uint8, RGB) and labels of `root/<split>/<class>/*`, classes in sorted order (as
  the `folder` source numbers them); resized to `image_size` only if their sizes differ. An
  unreadable file is skipped with one warning line (vit_jax.inference.read_images)."""
  from PIL import Image

  from vit_jax import inference
  from vit_jax.input_pipeline.sources import indexed

  extensions = indexed.IMAGE_EXTENSIONS  # what the `folder` source reads
  classes = indexed.folder_class_names(root)
  label_of = {}
  split_dir = os.path.join(root, split)
  for label, name in enumerate(classes):
    class_dir = os.path.join(split_dir, name)
    if not os.path.isdir(class_dir):
      continue
    for filename in sorted(os.listdir(class_dir)):
      if os.path.splitext(filename)[1].lower() in extensions:
        label_of[os.path.join(class_dir, filename)] = label
  if not label_of:
    raise SystemExit(f"no images under {split_dir}/<class>/ ({', '.join(extensions)})")
  try:  # an unreadable file is skipped with one warning, as the trainer skips it
    paths, images = inference.read_images(list(label_of))
  except ValueError as e:
    raise SystemExit(f"{split_dir}: {e}") from e
  images = [image.convert("RGB") for image in images]
  labels = [label_of[path] for path in paths]
  if len({image.size for image in images}) > 1:
    images = [image.resize((image_size, image_size), Image.BILINEAR) for image in images]
  return np.stack([np.asarray(image) for image in images]), np.asarray(labels)


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    folder=flags.DEFINE_string(
      "folder", None, "<folder>/{train,test}/<class>/*; default: --builtin's.", flag_values=values
    ),
    builtin=flags.DEFINE_string(
      "builtin",
      "digits",
      "Without --folder: the bundled dataset written as one.",
      flag_values=values,
    ),
    pretrained=flags.DEFINE_string(
      "pretrained", "/tmp/vit_demo/pretrain", "The pretrain workdir.", flag_values=values
    ),
    workdir=flags.DEFINE_string(
      "workdir", "/tmp/vit_folder_transfer", "Workdirs of the stages.", flag_values=values
    ),
    out=flags.DEFINE_string(
      "out", None, "results.json's folder (default: see the module docstring).", flag_values=values
    ),
    pp_train=flags.DEFINE_string(
      "pp_train", NO_FLIP, "Training preprocessing.", flag_values=values
    ),
    no_scratch=flags.DEFINE_bool(
      "no_scratch", False, "Skip the from-scratch run.", flag_values=values
    ),
    quick=flags.DEFINE_bool(
      "quick", False, "Tiny budgets (~1 minute, for CI).", flag_values=values
    ),
    verbose=flags.DEFINE_bool(
      "verbose", False, "Show every log line of the stages.", flag_values=values
    ),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  args = cli.values(f)
  if not os.path.isfile(os.path.join(args.pretrained, "config.json")):
    raise SystemExit(
      f"--pretrained={args.pretrained} is not a pretrain workdir (no config.json); run "
      "experiments/demo.py first, or pass the workdir of a configs/pretrain.py run"
    )
  with open(os.path.join(args.pretrained, "config.json")) as f:
    pretrained = json.load(f)
  # The pretrained model's architecture (the finetune preset's is the demo's).
  architecture = [
    f"--config.model.{key}={value}"
    for key, value in pretrained["model"].items()
    if key in ("name", "patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers")
  ]
  budget = QUICK if args.quick else FULL
  os.makedirs(args.workdir, exist_ok=True)
  folder = args.folder or _bundled_folder(args.builtin, os.path.join(args.workdir, args.builtin))
  total_start = time.perf_counter()

  # The demo's fine-tuning stage (experiments/demo.py), on the folder.
  finetune = (
    ["--config=configs/finetune.py:dataset=animal_mnist,holdout=false"]
    + architecture
    + [
      "--config.dataset.source=folder",
      f"--config.dataset.data_dir={folder}",
      f"--config.dataset.name={os.path.basename(os.path.normpath(folder))}",
      "--config.dataset.train_split=train",
      "--config.dataset.eval_split=test",
      f"--config.dataset.pp_train={args.pp_train}",
      f"--config.batch_size={budget.batch_size}",
      f"--config.total_steps={budget.steps}",
      f"--config.schedule.warmup_steps={max(budget.steps // 10, 1)}",
      "--config.evals.val.every_steps=0",  # the test split, after the last step
      f"--config.checkpoint.every_steps={budget.steps}",
      f"--config.log_every_steps={10 if args.quick else 100}",
    ]
  )
  runs = {}
  kinds = [("pretrained", [f"--config.model_init={args.pretrained}"])]
  if not args.no_scratch:
    kinds.append(("scratch", ["--config.init_from_scratch=true"]))
  for kind, extra in kinds:
    metrics, seconds = common.run_stage(
      f"fine-tune on {folder} ({kind})",
      finetune + extra,
      os.path.join(args.workdir, kind),
      verbose=args.verbose,
    )
    runs[kind] = dict(test_accuracy=metrics["val/accuracy"], seconds=seconds, step=metrics["step"])

  print("\n== raw-pixel baselines on the same split (vit_jax/evaluators/baselines.py)")
  start = time.perf_counter()
  image_size = pretrained["dataset"]["image_size"]
  base = baselines.pixel_scores(
    *read_folder(folder, "train", image_size), *read_folder(folder, "test", image_size)
  )
  base_seconds = time.perf_counter() - start

  best = max(base["logreg"], base["knn3"])
  print(f"\n== Results on {folder}/test ({base['test_examples']} images)")
  print(f"{'':<22} {'steps':>6} {'top-1':>7} {'wall':>7}")
  for kind, run in runs.items():
    print(
      f"{'ViT ' + kind:<22} {budget.steps:>6} {run['test_accuracy']:>7.1%} "
      f"{common.fmt_seconds(run['seconds']):>7}"
    )
  print(
    f"{'pixels logreg':<22} {'':>6} {base['logreg']:>7.1%} {common.fmt_seconds(base_seconds):>7}"
  )
  print(f"{'pixels kNN-3':<22} {'':>6} {base['knn3']:>7.1%}")
  pretrained = runs["pretrained"]["test_accuracy"]
  gap = 100 * (pretrained - best)
  print(
    f"\nThe pretrained ViT is {'above' if gap > 0 else 'not above'} the best raw-pixel baseline "
    f"({gap:+.1f} points)."
  )
  if "scratch" in runs:
    gain = 100 * (pretrained - runs["scratch"]["test_accuracy"])
    print(f"Pretraining bought {gain:+.1f} points over the same budget from scratch.")
  if args.quick:
    print("(--quick: budgets far too small for these numbers to mean anything.)")
  results = dict(
    folder=folder,
    pretrained=args.pretrained,
    quick=args.quick,
    steps=budget.steps,
    runs=runs,
    baselines=base,
    seconds=time.perf_counter() - total_start,
  )
  out = common.out_dir(args.out, "folder_transfer", args.workdir, args.quick)
  common.write_results(os.path.join(out, "results.json"), results)
  print(f"results.json in {out}")
  return results


if __name__ == "__main__":
  cli.run(main, "experiments.folder_transfer", define_flags)
