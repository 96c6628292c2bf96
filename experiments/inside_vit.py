r"""Inside the demo's ViT: the figures of docs/analysis.md (paper §4.5, Fig. 6–7).

  python -m experiments.inside_vit                           # the demo's /tmp/vit_demo/pretrain
  python -m experiments.inside_vit --workdir=/tmp/analysis_pt --num_images=500

Runs `vit_jax.analysis` (the same code as `python -m vit_jax.analysis`) on a pretraining
workdir with Fashion-MNIST test images exported as PNG files (the first `--num_images` of the
official test split, so the model never trained on them), then copies the four figures and
`analysis.json` into `--out` (default experiments/results/inside_vit/) and prints what was
measured.

No photographs: the demo's model reads 32x32 inputs, where a photograph is a few blobs; with
a checkpoint of 224px or more, pass photos to `python -m vit_jax.analysis` directly.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import os
import shutil
import tempfile
import time
import types

import numpy as np
from absl import flags
from PIL import Image

from experiments import common
from vit_jax.runtime import cli

FIGURES = ("filters_pca", "posemb_similarity", "attention_distance", "attention_rollout")


def export_fashion_mnist(folder: str, count: int) -> list[str]:
  """Writes the first `count` Fashion-MNIST test images as PNG files; returns their paths."""
  from vit_jax.input_pipeline import builtin

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


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    workdir=flags.DEFINE_string(
      "workdir", "/tmp/vit_demo/pretrain", "A pretrain workdir.", flag_values=values
    ),
    out=flags.DEFINE_string(
      "out", common.results_dir("inside_vit"), "The figures' folder.", flag_values=values
    ),
    num_images=flags.DEFINE_integer(
      "num_images", 1000, "Fashion-MNIST test images analysed.", flag_values=values
    ),
    batch_size=flags.DEFINE_integer(
      "batch_size", 64, "Images per forward pass.", flag_values=values
    ),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  args = cli.values(f)
  if not os.path.exists(args.workdir):
    raise SystemExit(
      f"no workdir {args.workdir}: run experiments/demo.py (or the pretrain command in "
      "configs/pretrain.py) first"
    )

  from vit_jax.analysis import report

  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    images = export_fashion_mnist(os.path.join(tmp, "images"), args.num_images)
    print(f"exported {len(images)} Fashion-MNIST test images to PNG", flush=True)
    result = report.analyze(
      args.workdir,
      [os.path.dirname(images[0])],
      os.path.join(tmp, "out"),
      batch_size=args.batch_size,
      num_components=28,
      max_rollout_images=0,
    )
    os.makedirs(args.out, exist_ok=True)
    for name in FIGURES:
      shutil.copy(os.path.join(tmp, "out", f"{name}.png"), args.out)
  result["figures"] = {name: f"{name}.png" for name in FIGURES}
  result["checkpoint"] = args.workdir
  result["command"] = " ".join(["python -m experiments.inside_vit", *cli.given(f)])
  common.write_results(os.path.join(args.out, "analysis.json"), result)

  distance = np.asarray(result["mean_attention_distance"])
  print(f"\n{result['model']} from {args.workdir}: {result['images']['count']} images")
  print(
    "mean attention distance (pixels), per layer: min / mean / max over heads "
    f"(uniform attention: {result['uniform_attention_distance']:.1f})"
  )
  for layer, row in enumerate(distance, 1):
    print(f"  layer {layer}: {row.min():5.1f} / {row.mean():5.1f} / {row.max():5.1f}")
  posemb = result["posemb"]
  print(
    f"position embeddings ({posemb['grid'][0]}x{posemb['grid'][1]}): correlation of similarity "
    f"with grid distance {posemb['distance_correlation']:.2f}; mean similarity same row "
    f"{posemb['same_row']:.2f}, same column {posemb['same_column']:.2f}, other {posemb['other']:.2f}"
  )
  print("by grid distance: " + ", ".join(f"{d}: {s:.2f}" for d, s in posemb["by_distance"].items()))
  explained = result["filters"].get("explained_variance_ratio")
  if explained:
    print(
      f"embedding filters: top 5 components explain {100 * sum(explained[:5]):.0f}% of variance"
    )
  print(f"figures and analysis.json in {args.out} ({time.perf_counter() - start:.0f}s)")
  return result


if __name__ == "__main__":
  cli.run(main, "experiments.inside_vit", define_flags)
