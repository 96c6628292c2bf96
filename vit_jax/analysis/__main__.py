r"""The command line of vit_jax.analysis: figures and numbers of what a ViT checkpoint learned.

  python -m vit_jax.analysis --checkpoint=/tmp/vit_demo/pretrain --images=photos/ --out=/tmp/inside
  python -m vit_jax.analysis --checkpoint=ViT-B_16.npz --model=B/16 --images=a.jpg,b.png \
      --out=/tmp/inside_b16

The checkpoint is a workdir (its latest step), a step directory or an `.npz`; `--model` names
the preset of an `.npz` without `config.json` (required for the R50 hybrids; plain ViTs are read
from the parameter shapes). Writes to `--out` the PNG figures, `analysis.json` (the numbers) and
`analysis.npz` (the arrays); see vit_jax/analysis/report.py. Images are preprocessed as for
evaluation (vit_jax.predict), in batches; unreadable ones are skipped and named in one line.
Large models: `--fsdp=N` / `--model_parallel=N` shard the parameters over local devices.
"""

import sys
from collections.abc import Sequence

from absl import app, flags, logging

from vit_jax import predict
from vit_jax.analysis import report

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Workdir, step directory or .npz.")
_MODEL = flags.DEFINE_string(
  "model", None, "A vit_jax.models preset (e.g. B/16) for an .npz without config.json."
)
_IMAGES = flags.DEFINE_list("images", [], "Image files and folders (comma-separated).")
_OUT = flags.DEFINE_string("out", None, "Folder for the figures and analysis.json.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 0, "Input side; 0: the checkpoint's own.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Images per forward pass.")
_RESIDUAL = flags.DEFINE_float(
  "residual_weight", 0.5, "Attention rollout: A' = (1 - w) A + w I per layer."
)
_COMPONENTS = flags.DEFINE_integer("num_components", 28, "Filter principal components shown.")
_MAX_ROLLOUT = flags.DEFINE_integer(
  "max_rollout_images", 64, "Per-image rollout figures written (the first images)."
)
_FSDP = flags.DEFINE_integer("fsdp", 1, "Mesh 'fsdp' axis: devices sharding the parameters.")
_MODEL_PARALLEL = flags.DEFINE_integer("model_parallel", 1, "Mesh 'model' axis size.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; images go in --images=a.png,b/")
  try:
    result = report.analyze(
      _CHECKPOINT.value,
      _IMAGES.value,
      _OUT.value,
      model=_MODEL.value,
      image_size=_IMAGE_SIZE.value,
      batch_size=_BATCH_SIZE.value,
      residual_weight=_RESIDUAL.value,
      num_components=_COMPONENTS.value,
      max_rollout_images=_MAX_ROLLOUT.value,
      fsdp=_FSDP.value,
      model_parallel=_MODEL_PARALLEL.value,
    )
  except (FileNotFoundError, ValueError, KeyError) as e:
    logging.error("%s", e)
    sys.exit(f"vit_jax.analysis: {e}")
  images = result["images"]
  print(f"{result['model']}: {images['count']} images analysed, {images['skipped_count']} skipped")
  if images["skipped"]:
    skipped = [(s["path"], s["error"]) for s in images["skipped"]]
    print(predict.skipped_line(skipped, images["count"] + len(skipped)))
  if "mean_attention_distance_per_layer" in result:
    per_layer = ", ".join(f"{d:.1f}" for d in result["mean_attention_distance_per_layer"])
    print(f"mean attention distance per layer (pixels): {per_layer}")
  corr = result["posemb"]["distance_correlation"]
  if corr is not None:
    print(f"position embeddings: correlation of similarity with grid distance {corr:.2f}")
  for name, path in result["figures"].items():
    print(f"{name}: {path}")
  print(f"numbers: {_OUT.value}/analysis.json")


if __name__ == "__main__":
  flags.mark_flags_as_required(["checkpoint", "out"])
  app.run(main)
