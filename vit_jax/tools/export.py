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
preprocessing and class names). What each format holds: vit_jax/tools/export_lib.py and
docs/export.md. Bad input ends with one line naming the culprit, and nothing is written.
"""

import sys
from collections.abc import Sequence

from absl import app, flags

from vit_jax.tools import export_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", None, "Workdir, step directory or .npz (local or gs://).")
flags.DEFINE_string("format", None, f"One of {', '.join(export_lib.FORMATS)}.")
flags.DEFINE_string("quantize", "none", f"One of {', '.join(export_lib.QUANTIZATIONS)} (tflite).")
flags.DEFINE_string("out", None, "A new (or empty) output directory.")
flags.DEFINE_string("model", None, "A vit_jax.models preset for an .npz without config.json.")
flags.DEFINE_integer("image_size", 0, "Input resolution; 0: the training's, or the checkpoint's.")
flags.DEFINE_string("class_names", None, "Text file with one class name a line.")
flags.DEFINE_integer("top_k", 5, "How many top classes the SavedModel returns.")
flags.DEFINE_integer(
  "batch_size", 1, "LiteRT: the batch size of the file; 0: any (resizable, much slower)."
)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  try:
    if FLAGS.format not in export_lib.FORMATS:  # before the (slow) load
      raise ValueError(
        f"unknown format {FLAGS.format!r}; expected one of {', '.join(export_lib.FORMATS)}"
      )
    names = None
    if FLAGS.class_names:
      with open(FLAGS.class_names) as f:
        names = [line.strip() for line in f if line.strip()]
    source = export_lib.load(
      FLAGS.checkpoint, model=FLAGS.model, image_size=FLAGS.image_size, class_names=names
    )
    meta = export_lib.export(
      source,
      FLAGS.format,
      FLAGS.out,
      quantize=FLAGS.quantize,
      top_k=FLAGS.top_k,
      batch_size=FLAGS.batch_size,
    )
  except (ValueError, OSError) as e:
    sys.exit(f"export: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
  if source.note:
    print(source.note)
  print(export_lib.summary(meta, FLAGS.out))


if __name__ == "__main__":
  flags.mark_flags_as_required(["checkpoint", "format", "out"])
  app.run(main)
