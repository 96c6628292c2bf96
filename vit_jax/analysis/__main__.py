r"""The command line of vit_jax.analysis: figures and numbers of what a ViT checkpoint learned.

  python -m vit_jax.analysis --checkpoint=/tmp/vit_demo/pretrain --images=photos/ --out=/tmp/inside
  python -m vit_jax.analysis --checkpoint=ViT-B_16.npz --model=B/16 --images=a.jpg,b.png \
      --out=/tmp/inside_b16

Writes to `--out` the PNG figures, `analysis.json` and `analysis.npz` (vit_jax/analysis/report.py;
docs/analysis.md). `--model` names the preset of an `.npz` without `config.json` (required for the
R50 hybrids); `--fsdp=N` / `--model_parallel=N` shard a large model's parameters over local devices.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

from collections.abc import Sequence

from vit_jax import inference
from vit_jax.analysis import report
from vit_jax.runtime import cli

define_flags = cli.define_flags(
  checkpoint=cli.CHECKPOINT,
  model=cli.MODEL,
  images=cli.Flag([], "Image files and folders (comma-separated)."),
  out=cli.Flag(str, "Folder for the figures and analysis.json.", required=True),
  image_size=cli.IMAGE_SIZE,
  batch_size=cli.BATCH_SIZE,
  residual_weight=cli.Flag(0.5, "Attention rollout: A' = (1 - w) A + w I per layer."),
  num_components=cli.Flag(28, "Filter principal components shown."),
  max_rollout_images=cli.Flag(64, "Per-image rollout figures written (the first images)."),
  fsdp=cli.Flag(1, "Mesh 'fsdp' axis: devices sharding the parameters."),
  model_parallel=cli.Flag(1, "Mesh 'model' axis size."),
)


def main(argv: Sequence[str], f) -> None:
  cli.no_arguments(argv, "; images go in --images=a.png,b/")
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
