r"""Semantic segmentation from ViT patch tokens, the paper's open question (§5), in miniature.

  python -m experiments.segmentation            # 7 minutes of wall time on 2 cores
  python -m experiments.segmentation --quick    # seconds: the same stages, tiny budgets (CI)

The task is `animal_mnist_seg` (vit_jax/input_pipeline/sources/segmentation_synthetic.py):
48x48 canvases holding 1 to 3 Animal-MNIST silhouettes over a noisy background, every object
pixel labelled with its animal (11 classes with the background, soft edges ignored). The experiment:

  1. pretrains the demo ViT on Fashion-MNIST classification, the demo's pretraining recipe
     (`configs/pretrain.py:dataset=fashion_mnist`) at a shorter budget (`Profile`);
  2. trains `configs/segment.py` with each head (`linear`: SETR-naive, `progressive`: several
     blocks' maps fused and upsampled by convolutions) on
       - the ViT initialised from that pretraining (position embeddings resized 8x8 → 12x12),
       - the same ViT from scratch,
       - a BiT ResNet (R26x1, the baseline family of the paper) from scratch,
     all with the same budget (steps × batch, Adam, cosine);
  3. scores everything on the test split (1,000 canvases) with mean IoU and pixel accuracy,
     beside two non-learned baselines on exactly those pixels: every pixel background, and a
     grey-level threshold (fitted on the training canvases) that calls bright pixels the most
     frequent animal;
  4. prints the table, writes table.md, segmentation.png and results.json.

Stages run as their printed `python -m vit_jax.main` commands would (experiments/common.py:
run_stage, in this process). Workdirs under `--workdir` (default /tmp/vit_segmentation: pretrain/,
then <encoder>_<head>/) are removed first. Outputs go to `--out` (default
experiments/results/segmentation/; with --quick, <workdir>/results/).
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import dataclasses
import os
import time
import types

import numpy as np
from absl import flags

from experiments import common, fingerprint
from vit_jax.runtime import cli

WORKDIR = "/tmp/vit_segmentation"
DATASET = "animal_mnist_seg"
HEADS = ("linear", "progressive")
# name → (title, model preset, initialised from the pretraining)
ENCODERS = {
  "vit_pretrained": ("ViT (demo), pretrained on Fashion-MNIST", "vit", True),
  "vit_scratch": ("ViT (demo), from scratch", "vit", False),
  "bit_scratch": ("BiT-R26x1, from scratch", "bit", False),
}


@dataclasses.dataclass(frozen=True)
class Profile:
  pretrain_flags: tuple[str, ...]  # beside configs/pretrain.py:dataset=fashion_mnist
  vit: str  # model preset of the ViT (the pretraining's)
  bit: str
  bit_flags: tuple[str, ...]  # beside the BiT preset (quick: one unit per block)
  image_size: int
  steps: int
  batch_size: int
  eval_batch_size: int
  train_split: str
  val_split: str
  test_split: str
  runs: tuple[tuple[str, str], ...]  # (encoder, head) pairs trained


ALL_RUNS = tuple((encoder, head) for encoder in ENCODERS for head in HEADS)


# Sized on 2 cores shared with other jobs (load average about 10), where at 48px the demo ViT
# with the progressive head trained at about 75 images/s and BiT-R26x1 at about 13 (XLA:CPU's
# convolutions): 300 steps of 16 canvases (4,800, 1.2 epochs of the 4,000) for every run, and
# 300 steps of 128 at 32px of pretraining. The run at 3e5c302 (docs/segmentation.md) took 6m23s
# of stage time: pretraining 50 s, a ViT run 23 to 41 s, a BiT run 72 to 122 s.
FULL = Profile(
  pretrain_flags=(
    "--config.total_steps=300",
    "--config.schedule.warmup_steps=30",
    "--config.checkpoint.every_steps=300",
    "--config.evals.val.every_steps=0",
    "--config.evals.fewshot_animal_mnist.every_steps=-1",
    "--config.evals.fewshot_mnist_5k.every_steps=-1",
  ),
  vit="demo",
  bit="R26x1",
  bit_flags=(),
  image_size=48,
  steps=300,
  batch_size=16,
  eval_batch_size=100,
  train_split="train",
  val_split="val",
  test_split="test",
  runs=ALL_RUNS,
)
QUICK = Profile(
  pretrain_flags=(
    "--config.total_steps=4",
    "--config.batch_size=8",
    "--config.eval_batch_size=16",
    "--config.dataset.train_split=train[:256]",
    "--config.dataset.eval_split=test[:32]",
    "--config.dataset.image_size=16",
    "--config.schedule.warmup_steps=1",
    "--config.checkpoint.every_steps=4",
    "--config.evals.val.every_steps=0",
    "--config.evals.fewshot_animal_mnist.every_steps=-1",
    "--config.evals.fewshot_mnist_5k.every_steps=-1",
  ),
  vit="testing",
  bit="R26x1",
  # R26x1's strides and widths with one bottleneck unit per block instead of two: the same code
  # path, its step compiled in about half the time.
  bit_flags=("--config.model.block_units=(1,1,1,1)",),
  image_size=16,
  steps=4,
  batch_size=8,
  eval_batch_size=16,
  train_split="train[:64]",
  val_split="val[:16]",
  test_split="test[:32]",
  # Every code path (a pretrained and a fresh ViT, both heads, the BiT encoder) in three runs:
  # each stage compiles its own step, which is most of --quick's time.
  runs=(("vit_pretrained", "progressive"), ("vit_scratch", "linear"), ("bit_scratch", "linear")),
)


def pretrain_flags(profile: Profile, quick: bool) -> list[str]:
  """The demo's pretraining (`configs/pretrain.py:dataset=fashion_mnist`) at the profile's budget."""
  arg = "dataset=fashion_mnist,runlocal" if quick else "dataset=fashion_mnist"
  flags = [f"--config=configs/pretrain.py:{arg}"]
  return flags + list(profile.pretrain_flags)


def segment_flags(profile: Profile, encoder: str, head: str, pretrained: str) -> list[str]:
  """`configs/segment.py` for one encoder and head, at the profile's budget."""
  _, family, from_pretraining = ENCODERS[encoder]
  model = profile.vit if family == "vit" else profile.bit
  flags = [f"--config=configs/segment.py:dataset={DATASET},model={model},head={head}"]
  flags.append(
    f"--config.model_init={pretrained}" if from_pretraining else "--config.init_from_scratch=true"
  )
  if family == "bit":
    flags += profile.bit_flags
  return flags + [
    f"--config.dataset.image_size={profile.image_size}",
    f"--config.dataset.train_split={profile.train_split}",
    f"--config.dataset.eval_split={profile.val_split}",
    f"--config.evals.test.split={profile.test_split}",
    f"--config.total_steps={profile.steps}",
    f"--config.batch_size={profile.batch_size}",
    f"--config.eval_batch_size={profile.eval_batch_size}",
    f"--config.schedule.warmup_steps={max(profile.steps // 10, 1)}",
    f"--config.checkpoint.every_steps={profile.steps}",
    f"--config.log_every_steps={max(profile.steps // 8, 1)}",
    "--config.evals.val.every_steps=-1",  # the test split is what is reported
  ]


# ---------------------------------------------------------------------------------------------
# Non-learned baselines, on the pixels the models are scored on.


def _pixels(profile: Profile, split: str) -> tuple[np.ndarray, np.ndarray]:
  """Grey levels [N, S, S] in [-1, 1] and labels [N, S, S] of a split as the models see it."""
  from vit_jax import input_pipeline

  config = input_pipeline.dataset_config(
    source="seg_builtin",
    name=DATASET,
    image_size=profile.image_size,
    train_split=profile.train_split,
    eval_split=split,
    pp_eval="",
  )
  batches = list(input_pipeline.make_eval_iterator(config, global_batch_size=100))
  mask = np.concatenate([b["mask"] for b in batches]) > 0
  grey = np.concatenate([b["image"][..., 0] for b in batches])[mask]
  return grey, np.concatenate([b["label"] for b in batches])[mask]


def pixel_baselines(profile: Profile, num_classes: int, class_names: list[str]) -> dict:
  """mIoU and pixel accuracy on the test split of (a) every pixel background and (b) a grey
  threshold: pixels at least `t` are the training split's most frequent animal, `t` the grid
  value of best training pixel accuracy."""
  from vit_jax.evaluators import segmentation as seg_eval

  train_grey, train_labels = _pixels(profile, profile.train_split)
  test_grey, test_labels = _pixels(profile, profile.test_split)
  counted = train_labels < num_classes
  animals = np.bincount(train_labels[counted & (train_labels > 0)], minlength=num_classes)
  majority = int(np.argmax(animals))
  grid = np.linspace(-0.9, 0.5, 29)
  scores = [
    np.mean(np.where(train_grey[counted] >= t, majority, 0) == train_labels[counted]) for t in grid
  ]
  threshold = float(grid[int(np.argmax(scores))])

  def score(predictions):
    matrix = seg_eval.confusion(predictions, test_labels, np.ones(test_labels.shape), num_classes)
    return seg_eval.metrics_from_confusion(np.asarray(matrix), class_names)

  background = score(np.zeros_like(test_labels))
  thresholded = score(np.where(test_grey >= threshold, majority, 0))
  return dict(
    background=background,
    threshold=thresholded,
    threshold_value=threshold,
    threshold_class=class_names[majority],
  )


# ---------------------------------------------------------------------------------------------
# The run.


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    **common.define_stage_flags(values, WORKDIR, "tiny budgets (seconds, for CI)")
  )


def stage_flags(profile: Profile, workdir: str) -> dict[str, list[str]]:
  """Every training stage of `profile` by its workdir's name under `workdir`: its flags."""
  pretrained = os.path.join(workdir, "pretrain")
  stages = {"pretrain": pretrain_flags(profile, profile is QUICK)}
  for encoder, head in profile.runs:
    stages[f"{encoder}_{head}"] = segment_flags(profile, encoder, head, pretrained)
  return stages


def run(profile: Profile, workdir: str, verbose: bool = False) -> dict:
  """Every stage and baseline of `profile`, in workdirs under `workdir`: the results' dict."""
  os.makedirs(workdir, exist_ok=True)
  total_start = time.perf_counter()
  flags = stage_flags(profile, workdir)

  def stage(title, name):
    return common.run_stage(title, flags[name], os.path.join(workdir, name), verbose=verbose)

  # What the training stages read (experiments/fingerprint.py): the pretraining's images, and
  # the canvases every segmentation run reads.
  first = "_".join(profile.runs[0])
  inputs = dict(
    pretrain=fingerprint.data(flags["pretrain"]), segment=fingerprint.data(flags[first])
  )
  pretrain, seconds_pretrain = stage("1. pretrain the demo ViT on Fashion-MNIST", "pretrain")
  seconds = dict(pretrain=seconds_pretrain)
  runs = {}
  for encoder, head in profile.runs:
    name = f"{encoder}_{head}"
    metrics, seconds[name] = stage(f"2. segment with the {head} head: {ENCODERS[encoder][0]}", name)
    runs[name] = {k[len("test/") :]: v for k, v in metrics.items() if k.startswith("test/")}
    runs[name].update(loss=metrics.get("loss"), train_pixel_accuracy=metrics.get("accuracy"))
  from vit_jax.input_pipeline.sources import segmentation_synthetic

  class_names = segmentation_synthetic.synthetic_class_names(DATASET)
  start = time.perf_counter()
  baselines = pixel_baselines(profile, len(class_names), class_names)
  seconds["baselines"] = time.perf_counter() - start
  seconds["total"] = time.perf_counter() - total_start
  return dict(
    quick=profile is QUICK,
    profile=dataclasses.asdict(profile),
    pretrain={k: v for k, v in pretrain.items() if not k.startswith("fewshot")},
    runs=runs,
    baselines=baselines,
    inputs=inputs,
    seconds=seconds,
  )


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  args = cli.values(f)
  started = common.provenance()
  results = run(QUICK if args.quick else FULL, args.workdir, args.verbose)
  out = common.out_dir(args.out, "segmentation", args.workdir, args.quick)
  if out == common.results_dir("segmentation"):  # the committed results: with the fingerprint
    quick = run(QUICK, os.path.join(args.workdir, "fingerprint"), args.verbose)
    fingerprint.attach(results, quick, stage_flags(FULL, WORKDIR))
  _report(results, out)
  common.write_results(os.path.join(out, "results.json"), results, started)
  print(f"results.json, table.md and segmentation.png in {out}")
  return results


def table(results: dict) -> str:
  """Markdown: one row per encoder (and baseline), mIoU and pixel accuracy per head."""
  lines = [
    "| encoder | linear head: mIoU | pixel acc. | progressive head: mIoU | pixel acc. |",
    "|---|---|---|---|---|",
  ]
  for encoder, (title, _, _) in ENCODERS.items():
    cells = []
    for head in HEADS:
      run = results["runs"].get(f"{encoder}_{head}")
      cells += [f"{run['miou']:.3f}", f"{run['pixel_accuracy']:.1%}"] if run else ["—", "—"]
    lines.append(f"| {title} | " + " | ".join(cells) + " |")
  b = results["baselines"]
  for key, title in (
    ("background", "every pixel background"),
    ("threshold", f"grey threshold → {b['threshold_class']}"),
  ):
    m = b[key]
    lines.append(f"| {title} (no learning) | {m['miou']:.3f} | {m['pixel_accuracy']:.1%} | | |")
  return "\n".join(lines)


def _report(results: dict, out: str) -> None:
  text = table(results)
  pretrain = results["pretrain"]
  print(
    f"\n== Pretraining on Fashion-MNIST: val top-1 {pretrain.get('val/accuracy', float('nan')):.1%}"
    f", {common.fmt_seconds(results['seconds']['pretrain'])}"
  )
  test = results["profile"]["test_split"]
  print(f"\n== {DATASET} {test}: mean IoU (11 classes) and pixel accuracy")
  print(text)
  runs = results["runs"]
  for head in HEADS:
    pre, scratch = runs.get(f"vit_pretrained_{head}"), runs.get(f"vit_scratch_{head}")
    if pre and scratch:
      gain = pre["miou"] - scratch["miou"]
      print(f"{head} head: pretraining bought {gain:+.3f} mIoU over scratch")
  common.finish_report(results, text, out)
  _plot(results, os.path.join(out, "segmentation.png"))


def _plot(results: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  x = np.arange(len(ENCODERS))
  for i, head in enumerate(HEADS):
    values = [results["runs"].get(f"{e}_{head}", {}).get("miou", 0.0) for e in ENCODERS]
    ax.bar(x + (i - 0.5) * 0.38, values, 0.38, label=f"{head} head")
  for key, style in (("background", ":"), ("threshold", "--")):
    ax.axhline(results["baselines"][key]["miou"], color="gray", linestyle=style, label=key)
  ax.set_xticks(x, [title.replace(", ", "\n") for title, _, _ in ENCODERS.values()], fontsize=8)
  ax.set_ylabel("test mean IoU (11 classes)")
  ax.set_title("Segmenting Animal-MNIST canvases (demo budget, 2 CPU cores)")
  ax.legend(fontsize=8)
  ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  cli.run(main, "experiments.segmentation", define_flags)
