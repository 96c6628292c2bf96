r"""Inside the demo's ViT: the figures of docs/analysis.md (paper §4.5, Fig. 6–7).

  python -m experiments.inside_vit             # pretrains the demo's ViT, then analyses it
  python -m experiments.inside_vit --pretrained=/tmp/vit_demo/pretrain --out=/tmp/figures
  python -m experiments.inside_vit --quick     # 30 steps, 64 images: the same code (tests)

Pretrains the demo's ViT as the demo's first stage does (experiments/demo.py: `configs/
pretrain.py:dataset=fashion_mnist`, in <workdir>/pretrain, removed first), or takes an
existing pretraining workdir (`--pretrained`, e.g. the demo's, which is the same stage; its
results then never replace the committed ones). Then runs `vit_jax.analysis` (the same code as
`python -m vit_jax.analysis`) on Fashion-MNIST test images exported as PNG files (the first
`--num_images` of the official test split, so the model never trained on them), copies the four
figures and `analysis.json` into `--out` (default experiments/results/inside_vit/; with --quick,
<workdir>/results/) and prints what was measured. The committed copy keeps the fingerprint of
the code that wrote it (experiments/fingerprint.py), which tests/test_analysis.py compares.

No photographs: the demo's model reads 32x32 inputs, where a photograph is a few blobs; with
a checkpoint of 224px or more, pass photos to `python -m vit_jax.analysis` directly.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import dataclasses
import os
import shutil
import tempfile
import time
import types
from typing import Any

import numpy as np
from absl import flags
from PIL import Image

from experiments import common, demo, fingerprint
from vit_jax.runtime import cli

FIGURES = ("filters_pca", "posemb_similarity", "attention_distance", "attention_rollout")


def export_fashion_mnist(folder: str, count: int) -> list[str]:
  """Writes the first `count` Fashion-MNIST test images as PNG files; returns their paths."""
  from vit_jax.input_pipeline.sources import builtin

  images, labels = builtin.get_split("fashion_mnist", "test")
  os.makedirs(folder, exist_ok=True)
  paths = []
  # Show one image of each class first in the rollout figure, then the rest in file order.
  order = [int(np.flatnonzero(labels == c)[0]) for c in range(10)]
  first = set(order)
  order += [i for i in range(len(labels)) if i not in first]
  for i in order[:count]:
    name = builtin.FASHION_MNIST_CLASSES[labels[i]].replace("/", "-").replace(" ", "-").lower()
    path = os.path.join(folder, f"{len(paths):05d}_{name}.png")
    Image.fromarray(images[i][..., 0]).save(path)
    paths.append(path)
  return paths


@dataclasses.dataclass(frozen=True)
class Profile:
  demo: Any  # the demo's profile (experiments/demo.py) whose pretraining stage is analysed
  num_images: int
  batch_size: int


FULL = Profile(demo.FULL, num_images=1000, batch_size=64)
QUICK = Profile(demo.QUICK, num_images=64, batch_size=32)
WORKDIR = "/tmp/vit_inside_vit"


def stage_flags(profile: Profile) -> dict[str, list[str]]:
  """The experiment's one training stage (the demo's pretraining), by its workdir's name."""
  return {"pretrain": demo.pretrain_flags(profile.demo, profile is QUICK)}


def summary(result: dict) -> dict:
  """The analysis' numbers that docs/analysis.md reads, as a flat dict: per layer the min, mean
  and max over heads of the mean attention distance, and the embedding filters' explained
  variance of the top 1 and 5 components."""
  distance = np.asarray(result["mean_attention_distance"])
  out = {
    f"layer{i}": dict(min=float(row.min()), mean=float(row.mean()), max=float(row.max()))
    for i, row in enumerate(distance, 1)
  }
  explained = result["filters"].get("explained_variance_ratio")
  if explained:
    out["filters"] = dict(top1=float(explained[0]), top5=float(sum(explained[:5])))
  return out


def run(
  profile: Profile, workdir: str, out: str, pretrained: str | None = None, verbose: bool = False
) -> dict:
  """Pretrains (unless `pretrained`) and analyses; the figures go to `out`. Returns the
  analysis' dict with the pretraining's metrics, `summary`, `inputs` and `seconds`."""
  from vit_jax.analysis import report

  start = time.perf_counter()
  seconds, inputs, pretrain = {}, {}, {}
  if pretrained is None:
    flags = stage_flags(profile)["pretrain"]
    # What the stage reads (experiments/fingerprint.py).
    inputs = dict(pretrain=fingerprint.data(flags))
    pretrained = os.path.join(workdir, "pretrain")
    metrics, seconds["pretrain"] = common.run_stage(
      "1. pretrain the demo ViT on Fashion-MNIST", flags, pretrained, verbose=verbose
    )
    pretrain = {k: v for k, v in metrics.items() if k in ("val/accuracy", "accuracy", "loss")}
  elif not os.path.exists(pretrained):
    raise SystemExit(
      f"--pretrained={pretrained}: no such workdir: run experiments/demo.py (or leave "
      "--pretrained out, and this experiment pretrains)"
    )
  analysis_start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    images = export_fashion_mnist(os.path.join(tmp, "images"), profile.num_images)
    print(f"2. analyse {pretrained} on {len(images)} Fashion-MNIST test images", flush=True)
    result = report.analyze(
      pretrained,
      [os.path.dirname(images[0])],
      os.path.join(tmp, "out"),
      batch_size=profile.batch_size,
      num_components=28,
      max_rollout_images=0,
    )
    os.makedirs(out, exist_ok=True)
    for name in FIGURES:
      shutil.copy(os.path.join(tmp, "out", f"{name}.png"), out)
  seconds["analysis"] = time.perf_counter() - analysis_start
  seconds["total"] = time.perf_counter() - start
  result["figures"] = {name: f"{name}.png" for name in FIGURES}
  result["checkpoint"] = pretrained
  return dict(
    result,
    quick=profile is QUICK,
    pretrain=pretrain,
    summary=summary(result),
    inputs=inputs,
    seconds=seconds,
  )


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    **common.define_stage_flags(values, WORKDIR, "30 steps, 64 images (tests)"),
    pretrained=flags.DEFINE_string(
      "pretrained", None, "Analyse this pretraining workdir instead.", flag_values=values
    ),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  args = cli.values(f)
  out = common.out_dir(args.out, "inside_vit", args.workdir, args.quick)
  committed = out == common.results_dir("inside_vit")
  if committed and args.pretrained:
    raise SystemExit(
      f"--pretrained={args.pretrained} would replace the committed results with another "
      "model's: give --out too"
    )
  started = common.provenance()
  profile = QUICK if args.quick else FULL
  result = run(profile, args.workdir, out, args.pretrained, args.verbose)
  result["command"] = " ".join(["python -m experiments.inside_vit", *cli.given(f)])
  if committed:  # with the code's fingerprint
    quick_dir = os.path.join(args.workdir, "fingerprint")
    quick = run(QUICK, quick_dir, os.path.join(quick_dir, "results"), verbose=args.verbose)
    fingerprint.attach(result, quick, stage_flags(FULL))
  common.write_results(os.path.join(out, "analysis.json"), result, started)

  print(f"\n{result['model']} from {result['checkpoint']}: {result['images']['count']} images")
  if result["pretrain"]:
    print(f"pretraining: Fashion-MNIST test top-1 {result['pretrain']['val/accuracy']:.1%}")
  print(
    "mean attention distance (pixels), per layer: min / mean / max over heads "
    f"(uniform attention: {result['uniform_attention_distance']:.1f})"
  )
  for layer, row in result["summary"].items():
    if layer.startswith("layer"):
      print(f"  {layer}: {row['min']:5.1f} / {row['mean']:5.1f} / {row['max']:5.1f}")
  posemb = result["posemb"]
  print(
    f"position embeddings ({posemb['grid'][0]}x{posemb['grid'][1]}): correlation of similarity "
    f"with grid distance {posemb['distance_correlation']:.2f}; mean similarity same row "
    f"{posemb['same_row']:.2f}, same column {posemb['same_column']:.2f}, other {posemb['other']:.2f}"
  )
  print("by grid distance: " + ", ".join(f"{d}: {s:.2f}" for d, s in posemb["by_distance"].items()))
  if "filters" in result["summary"]:
    top5 = result["summary"]["filters"]["top5"]
    print(f"embedding filters: top 5 components explain {100 * top5:.0f}% of variance")
  print(f"figures and analysis.json in {out} ({common.fmt_seconds(result['seconds']['total'])})")
  return result


if __name__ == "__main__":
  cli.run(main, "experiments.inside_vit", define_flags)
