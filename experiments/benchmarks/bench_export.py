r"""File sizes and CPU latency of one checkpoint in every export format, side by side.

  python -m experiments.benchmarks.bench_export --checkpoint=/tmp/vit_demo/finetune
  python -m experiments.benchmarks.bench_export --model=B/16 --image_size=224   # random weights

For JAX (jit), the SavedModel (its `preprocessed` signature), LiteRT fp32 / float16 / int8 and
onnxruntime: the artifact's size and the median wall time of a forward pass at batch 1 and 32
on the same preprocessed images (after warm-up), all in one process, with the CPU named; LiteRT
files are made for each batch size (a resizable one is much slower). Every
runtime uses all of the machine's cores (its default). Prints a markdown table and writes
results.json to `--out` (default experiments/results/bench_export/). Timings are only worth
reporting from a quiet machine: the table says so.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import json
import os
import platform
import statistics
import tempfile
import time
import types

import numpy as np
from absl import flags

from vit_jax.runtime import cli


def cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores visible)"
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def _median_ms(fn, repeats: int) -> float:
  fn()  # warm-up (compilation, allocation)
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1000 * statistics.median(times)


def _size(path: str) -> int:
  if os.path.isfile(path):
    return os.path.getsize(path)
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _litert_runner(litert, path: str):
  """A function of images running the LiteRT file, resizing its input when the batch changes."""
  interpreter = litert.Interpreter(model_path=path, num_threads=os.cpu_count())
  index = interpreter.get_input_details()[0]["index"]
  current = {"shape": None}

  def run(x):
    if current["shape"] != x.shape:
      interpreter.resize_tensor_input(index, x.shape)
      interpreter.allocate_tensors()
      current["shape"] = x.shape
    interpreter.set_tensor(index, x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])

  return run


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    checkpoint=flags.DEFINE_string(
      "checkpoint", None, "A workdir or .npz; none: random weights of --model.", flag_values=values
    ),
    model=flags.DEFINE_string(
      "model", None, "A preset (random weights without --checkpoint).", flag_values=values
    ),
    image_size=flags.DEFINE_integer(
      "image_size", 0, "Input side; 0: the checkpoint's own.", flag_values=values
    ),
    batch_sizes=flags.DEFINE_string(
      "batch_sizes", "1,32", "Batch sizes timed, comma-separated.", flag_values=values
    ),
    repeats=flags.DEFINE_integer("repeats", 20, "Timed calls per batch size.", flag_values=values),
    out=flags.DEFINE_string("out", None, "The results' folder.", flag_values=values),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  args = cli.values(f)

  import ai_edge_litert.interpreter as litert
  import onnxruntime as ort
  import tensorflow as tf

  from experiments import common
  from vit_jax import checkpoint, models
  from vit_jax.export import formats as export_lib

  work = tempfile.mkdtemp(prefix="bench_export-")
  ckpt = args.checkpoint
  if ckpt is None:
    import jax

    name, size = args.model or "testing", args.image_size or 32
    model = models.get_model(name, 1000)
    shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), np.zeros((1, size, size, 3), np.float32), train=False)
    )["params"]
    rng = np.random.default_rng(0)

    def draw(path, leaf):  # LayerNorm / GroupNorm scales near 1, the rest N(0, 0.02²)
      scale = any(k in jax.tree_util.keystr(path) for k in ("scale", "gamma"))
      return ((1.0 if scale else 0.0) + rng.normal(0, 0.02, leaf.shape)).astype(np.float32)

    params = jax.tree_util.tree_map_with_path(draw, shapes)
    ckpt = os.path.join(work, "random.npz")
    checkpoint.save(params, ckpt)
  source = export_lib.load(ckpt, model=args.model, image_size=args.image_size)
  s = source.image_size
  print(f"checkpoint {ckpt}: {s}px, {source.num_classes} classes; CPU: {cpu_name()}")

  batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
  # artifacts[label][batch size]: a LiteRT file is made for one batch size (a resizable one is
  # 15-60x slower, docs/export.md); the other formats take any batch.
  artifacts = {}
  for label, fmt, quantize in [
    ("SavedModel", "saved_model", "none"),
    ("LiteRT fp32", "tflite", "none"),
    ("LiteRT float16", "tflite", "float16"),
    ("LiteRT int8 (dynamic range)", "tflite", "int8"),
    ("ONNX (onnxruntime)", "onnx", "none"),
  ]:
    artifacts[label] = {}
    for n in batch_sizes if fmt == "tflite" else [0]:
      out = os.path.join(work, f"{label.split()[0].lower()}_{quantize}_{n}")
      export_lib.export(source, fmt, out, quantize=quantize, batch_size=n)
      path = os.path.join(out, export_lib.FILES[fmt]) if fmt in export_lib.FILES else out
      artifacts[label].update({n: path} if n else dict.fromkeys(batch_sizes, path))

  images = {
    n: np.random.default_rng(n).uniform(-1, 1, (n, s, s, 3)).astype(np.float32) for n in batch_sizes
  }
  runners = {}  # label -> batch size -> function of the images
  jax_fn = export_lib.apply_fn(source)
  runners["JAX (jit)"] = {n: jax_fn for n in batch_sizes}
  signature = tf.saved_model.load(artifacts["SavedModel"][batch_sizes[0]]).signatures[
    "preprocessed"
  ]
  saved_model = lambda x: signature(images=tf.constant(x))["logits"].numpy()  # noqa: E731
  runners["SavedModel"] = {n: saved_model for n in batch_sizes}
  for label in ("LiteRT fp32", "LiteRT float16", "LiteRT int8 (dynamic range)"):
    runners[label] = {n: _litert_runner(litert, artifacts[label][n]) for n in batch_sizes}
  session = ort.InferenceSession(
    artifacts["ONNX (onnxruntime)"][batch_sizes[0]], providers=["CPUExecutionProvider"]
  )
  onnx_run = lambda x: session.run(["logits"], {"images": x})[0]  # noqa: E731
  runners["ONNX (onnxruntime)"] = {n: onnx_run for n in batch_sizes}

  rows = []
  for label, by_batch in runners.items():
    size = _size(artifacts[label][batch_sizes[0]]) if label in artifacts else _size(ckpt)
    row = {"runtime": label, "bytes": size}
    for n, run in by_batch.items():
      row[f"batch{n}_ms"] = round(_median_ms(lambda run=run, n=n: run(images[n]), args.repeats), 3)
    rows.append(row)
  header = "| runtime | size | " + " | ".join(f"batch {n} (ms)" for n in batch_sizes) + " |"
  lines = [header, "|---|---|" + "---|" * len(batch_sizes)]
  for row in rows:
    cells = [f"{row[f'batch{n}_ms']:.2f}" for n in batch_sizes]
    lines.append(f"| {row['runtime']} | {row['bytes'] / 1e6:.2f} MB | " + " | ".join(cells) + " |")
  table = "\n".join(lines)
  print(table)
  print(
    f"(CPU: {cpu_name()}; median of {args.repeats} runs after warm-up; JAX's size is the checkpoint's)"
  )
  result = dict(cpu=cpu_name(), checkpoint=ckpt, image_size=s, rows=rows, table=table)
  out_dir = args.out or common.results_dir("bench_export")
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(result, f, indent=2)
  return result


if __name__ == "__main__":
  cli.run(main, "experiments.benchmarks.bench_export", define_flags)
