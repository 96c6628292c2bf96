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
docs/export.md. Bad input ends with one line naming the culprit, and nothing is written.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import types
from collections.abc import Sequence

from absl import app, flags

from vit_jax import inference
from vit_jax.export import formats
from vit_jax.runtime import cli


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The command's flags (see vit_jax.runtime.cli)."""
  f = types.SimpleNamespace(
    checkpoint=flags.DEFINE_string(
      "checkpoint", None, "Workdir, step directory or .npz (local or gs://).", flag_values=values
    ),
    format=flags.DEFINE_string(
      "format", None, f"One of {', '.join(formats.FORMATS)}.", flag_values=values
    ),
    quantize=flags.DEFINE_string(
      "quantize", "none", f"One of {', '.join(formats.QUANTIZATIONS)} (tflite).", flag_values=values
    ),
    out=flags.DEFINE_string("out", None, "A new (or empty) output directory.", flag_values=values),
    model=flags.DEFINE_string(
      "model", None, "A vit_jax.models preset for an .npz without config.json.", flag_values=values
    ),
    image_size=flags.DEFINE_integer(
      "image_size",
      0,
      "Input resolution; 0: the training's, or the checkpoint's.",
      flag_values=values,
    ),
    class_names=flags.DEFINE_string(
      "class_names", None, "Text file with one class name a line.", flag_values=values
    ),
    top_k=flags.DEFINE_integer(
      "top_k", 5, "How many top classes the SavedModel returns.", flag_values=values
    ),
    batch_size=flags.DEFINE_integer(
      "batch_size",
      1,
      "LiteRT: the batch size of the file; 0: any (resizable, much slower).",
      flag_values=values,
    ),
  )
  flags.mark_flags_as_required(["checkpoint", "format", "out"], flag_values=values)
  return f


def main(argv: Sequence[str], f: types.SimpleNamespace) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
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
