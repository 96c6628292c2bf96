r"""The command line of vit_jax.analysis: figures and numbers of what a ViT checkpoint learned.

  python -m vit_jax.analysis --checkpoint=/tmp/vit_demo/pretrain --images=photos/ --out=/tmp/inside
  python -m vit_jax.analysis --checkpoint=ViT-B_16.npz --model=B/16 --images=a.jpg,b.png \
      --out=/tmp/inside_b16

The checkpoint is a workdir (its latest step), a step directory or an `.npz`; `--model` names
the preset of an `.npz` without `config.json` (required for the R50 hybrids; plain ViTs are read
from the parameter shapes). Writes to `--out` the PNG figures, `analysis.json` (the numbers) and
`analysis.npz` (the arrays); see vit_jax/analysis/report.py. Images are preprocessed as for
evaluation (vit_jax.inference), in batches; unreadable ones are skipped and named in one line.
Large models: `--fsdp=N` / `--model_parallel=N` shard the parameters over local devices.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import types
from collections.abc import Sequence

from absl import app, flags

from vit_jax import inference
from vit_jax.analysis import report
from vit_jax.runtime import cli


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The command's flags (see vit_jax.runtime.cli)."""
  f = types.SimpleNamespace(
    checkpoint=flags.DEFINE_string(
      "checkpoint", None, "Workdir, step directory or .npz.", flag_values=values
    ),
    model=flags.DEFINE_string(
      "model",
      None,
      "A vit_jax.models preset (e.g. B/16) for an .npz without config.json.",
      flag_values=values,
    ),
    images=flags.DEFINE_list(
      "images", [], "Image files and folders (comma-separated).", flag_values=values
    ),
    out=flags.DEFINE_string(
      "out", None, "Folder for the figures and analysis.json.", flag_values=values
    ),
    image_size=flags.DEFINE_integer(
      "image_size", 0, "Input side; 0: the checkpoint's own.", flag_values=values
    ),
    batch_size=flags.DEFINE_integer(
      "batch_size", 32, "Images per forward pass.", flag_values=values
    ),
    residual_weight=flags.DEFINE_float(
      "residual_weight",
      0.5,
      "Attention rollout: A' = (1 - w) A + w I per layer.",
      flag_values=values,
    ),
    num_components=flags.DEFINE_integer(
      "num_components", 28, "Filter principal components shown.", flag_values=values
    ),
    max_rollout_images=flags.DEFINE_integer(
      "max_rollout_images",
      64,
      "Per-image rollout figures written (the first images).",
      flag_values=values,
    ),
    fsdp=flags.DEFINE_integer(
      "fsdp", 1, "Mesh 'fsdp' axis: devices sharding the parameters.", flag_values=values
    ),
    model_parallel=flags.DEFINE_integer(
      "model_parallel", 1, "Mesh 'model' axis size.", flag_values=values
    ),
  )
  flags.mark_flags_as_required(["checkpoint", "out"], flag_values=values)
  return f


def main(argv: Sequence[str], f: types.SimpleNamespace) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; images go in --images=a.png,b/")
  result = report.analyze(
    f.checkpoint.value,
    f.images.value,
    f.out.value,
    model=f.model.value,
    image_size=f.image_size.value,
    batch_size=f.batch_size.value,
    residual_weight=f.residual_weight.value,
    num_components=f.num_components.value,
    max_rollout_images=f.max_rollout_images.value,
    fsdp=f.fsdp.value,
    model_parallel=f.model_parallel.value,
  )
  images = result["images"]
  print(f"{result['model']}: {images['count']} images analysed, {images['skipped_count']} skipped")
  if images["skipped"]:
    skipped = [(s["path"], s["error"]) for s in images["skipped"]]
    print(inference.skipped_line(skipped, images["count"] + len(skipped)))
  if "mean_attention_distance_per_layer" in result:
    per_layer = ", ".join(f"{d:.1f}" for d in result["mean_attention_distance_per_layer"])
    print(f"mean attention distance per layer (pixels): {per_layer}")
  corr = result["posemb"]["distance_correlation"]
  if corr is not None:
    print(f"position embeddings: correlation of similarity with grid distance {corr:.2f}")
  for name, path in result["figures"].items():
    print(f"{name}: {path}")
  print(f"numbers: {f.out.value}/analysis.json")


if __name__ == "__main__":
  cli.run(main, "vit_jax.analysis", define_flags, errors=(FileNotFoundError, ValueError, KeyError))
