r"""Exports a trained checkpoint for serving: SavedModel, LiteRT/TFLite (fp32, float16, int8), ONNX.

  python -m vit_jax.tools.export --checkpoint=/tmp/vit_ft --format=saved_model --out=/tmp/vit_sm
  python -m vit_jax.tools.export --checkpoint=/tmp/vit_ft --format=tflite --quantize=int8 \
      --out=/tmp/vit_int8
  python -m vit_jax.tools.export --checkpoint=ViT-B_16.npz --model=B/16 --image_size=224 \
      --class_names=names.txt --format=onnx --out=/tmp/b16_onnx

`--checkpoint` is a workdir (its latest step), a step directory, an `.npz` or a `gs://` path of
either. Model, resolution, evaluation preprocessing and class names come from the workdir's
`config.json`, as for `vit_jax.predict`; `--model`, `--image_size` and `--class_names` for a bare
`.npz`. `--out` is a new directory: the artifact and `export.json` (its inputs, outputs,
preprocessing and class names). What each format holds: vit_jax/export/formats.py and
docs/export.md. A detect stage workdir exports as a SavedModel returning boxes, scores and
classes (docs/detection.md). Bad input ends with one line naming the culprit, and nothing is
written.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

from collections.abc import Sequence

from vit_jax import inference
from vit_jax.export import formats
from vit_jax.runtime import cli

define_flags = cli.define_flags(
  checkpoint=cli.CHECKPOINT,
  format=cli.Flag(str, f"One of {', '.join(formats.FORMATS)}.", required=True),
  quantize=cli.Flag("none", f"One of {', '.join(formats.QUANTIZATIONS)} (tflite)."),
  out=cli.Flag(str, "A new (or empty) output directory.", required=True),
  model=cli.MODEL,
  image_size=cli.IMAGE_SIZE,
  class_names=cli.CLASS_NAMES,
  top_k=cli.Flag(5, "How many top classes the SavedModel returns."),
  batch_size=cli.Flag(1, "LiteRT: the batch size of the file; 0: any (resizable, much slower)."),
)


def main(argv: Sequence[str], f) -> None:
  cli.no_arguments(argv)
  if f.format.value not in formats.FORMATS:  # before the (slow) load
    raise ValueError(
      f"unknown format {f.format.value!r}; expected one of {', '.join(formats.FORMATS)}"
    )
  names = inference.read_class_names(f.class_names.value) if f.class_names.value else None
  source = formats.load(
    f.checkpoint.value, model=f.model.value, image_size=f.image_size.value, class_names=names
  )
  meta = formats.export(
    source,
    f.format.value,
    f.out.value,
    quantize=f.quantize.value,
    top_k=f.top_k.value,
    batch_size=f.batch_size.value,
  )
  if source.note:
    print(source.note)
  print(formats.summary(meta, f.out.value))


if __name__ == "__main__":
  cli.run(main, "export", define_flags, errors=(ValueError, OSError))
