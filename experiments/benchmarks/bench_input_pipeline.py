r"""Input pipeline throughput vs. the ViT-B/16 train step on this machine.

Writes ImageNet-like JPEG shards (photos from scikit-image, random crops with the shorter side
300–500 px, quality 90), streams them through the training path (`source='tfrecord'`,
`decode|inception_crop|flip_lr|value_range(-1, 1)` at 224 px) with 1, 2, ... tf.data threads, then
times a jitted ViT-B/16 train step (forward, backward, SGD update) at 224 px and prints the ratio.
With `--task=segmentation` the shards hold the same JPEGs with a mask each (a PNG of blocks of 8
classes), read by `source='seg_shards'` with the segment stage's `random_crop(0.5)|flip_lr` at
224 px.

  python -m experiments.benchmarks.bench_input_pipeline [--threads=1,2] [--batches=20] [--vit_batch=8]
  python -m experiments.benchmarks.bench_input_pipeline --task=segmentation --vit_steps=0
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import os
import tempfile
import time
import types

import numpy as np
from absl import flags

from vit_jax.runtime import cli


def _photos(num_images: int):
  """ImageNet-sized JPEG crops of scikit-image's sample photos: (bytes, height, width)."""
  import skimage.data
  import tensorflow as tf

  from vit_jax.input_pipeline import testing

  photos = [
    np.asarray(getattr(skimage.data, name)())
    for name in ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "cat")
  ]
  rng = np.random.default_rng(0)
  for i in range(num_images):
    photo = photos[i % len(photos)]
    h, w = photo.shape[:2]
    ch, cw = rng.integers(h // 2, h + 1), rng.integers(w // 2, w + 1)
    y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    crop = photo[y : y + ch, x : x + cw]
    short = rng.integers(300, 501)
    scale = short / min(ch, cw)
    size = (int(ch * scale), int(cw * scale))
    image = tf.cast(tf.image.resize(crop, size, antialias=True), tf.uint8).numpy()
    yield testing.encode(image, "jpeg"), size[0], size[1]


def write_jpeg_shards(directory: str, num_images: int, num_shards: int = 8) -> None:
  """ImageNet-sized JPEG shards from scikit-image's sample photos."""
  from vit_jax.input_pipeline import testing

  records = [testing.example(jpeg, i % 1000) for i, (jpeg, _, _) in enumerate(_photos(num_images))]
  testing.write_shards(directory, "bench-train", records, num_shards)


def write_segmentation_shards(directory: str, num_images: int, num_shards: int = 8) -> None:
  """The same JPEGs with a mask each (8 classes in blocks of 16 px), as make_shards writes."""
  from vit_jax.tools import make_shards

  rng = np.random.default_rng(1)
  examples = []
  for i, (jpeg, h, w) in enumerate(_photos(num_images)):
    blocks = rng.integers(0, 8, (h // 16 + 1, w // 16 + 1)).astype(np.uint8)
    mask = np.kron(blocks, np.ones((16, 16), np.uint8))[:h, :w]
    examples.append((jpeg, mask, f"{i}.jpg", i))
  classes = [f"class{c}" for c in range(8)]
  make_shards._write_segmentation(
    examples, num_images, directory, "bench", "train", num_shards, classes, 3
  )


def pipeline_images_per_s(
  directory: str, threads: int, local_batch: int, batches: int, task: str = "classification"
) -> float:
  from vit_jax import input_pipeline

  config = input_pipeline.dataset_config(
    source="tfrecord",
    name="bench",
    data_dir=directory,
    train_split="train",
    eval_split="train",
    num_classes=1000,
    image_size=224,
    shuffle_buffer=1024,
    num_threads=threads,
  )
  if task == "segmentation":
    config.update(source="seg_shards", num_classes=None, pp_train="random_crop(0.5)|flip_lr")
  it = input_pipeline.make_train_iterator(config, global_batch_size=local_batch, seed=0)
  for _ in range(3):  # Warm-up: tracing, buffers filling.
    next(it)
  start = time.perf_counter()
  for _ in range(batches):
    next(it)
  rate = batches * local_batch / (time.perf_counter() - start)
  it.close()
  return rate


def vit_b16_images_per_s(batch: int, steps: int) -> float | None:
  """Train-step images/s of ViT-B/16 at 224 px, or None if the model code is not available."""
  try:
    from vit_jax import models
  except ImportError as e:
    print(f"ViT-B/16 not available ({e}); skipping the ratio.")
    return None
  import jax
  import jax.numpy as jnp
  import optax

  model = models.get_model("ViT-B_16", num_classes=1000)
  images = jnp.zeros((batch, 224, 224, 3), jnp.float32)
  labels = jnp.zeros((batch,), jnp.int32)
  params = jax.jit(lambda k: model.init({"params": k}, images[:1], train=False)["params"])(
    jax.random.PRNGKey(0)
  )
  tx = optax.sgd(0.01, momentum=0.9)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, key):
    def loss_fn(p):
      logits, _ = model.apply({"params": p}, images, train=True, rngs={"dropout": key})
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    grads = jax.grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  key = jax.random.PRNGKey(1)
  params, opt_state = step(params, opt_state, key)  # Compile.
  jax.block_until_ready(params)
  start = time.perf_counter()
  for _ in range(steps):
    params, opt_state = step(params, opt_state, key)
  jax.block_until_ready(params)
  return steps * batch / (time.perf_counter() - start)


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    threads=flags.DEFINE_string(
      "threads", "1,2", "tf.data thread counts to measure.", flag_values=values
    ),
    batches=flags.DEFINE_integer(
      "batches", 20, "Timed batches per measurement.", flag_values=values
    ),
    batch=flags.DEFINE_integer("batch", 64, "Pipeline batch size (one host).", flag_values=values),
    images=flags.DEFINE_integer("images", 512, "JPEGs written to the shards.", flag_values=values),
    vit_batch=flags.DEFINE_integer(
      "vit_batch", 8, "ViT-B/16 train batch size.", flag_values=values
    ),
    vit_steps=flags.DEFINE_integer(
      "vit_steps", 3, "Timed ViT-B/16 steps (0: no ViT step, no ratio).", flag_values=values
    ),
    task=flags.DEFINE_enum(
      "task",
      "classification",
      ["classification", "segmentation"],
      "The shards and source: JPEGs and labels ('tfrecord'), or JPEGs and masks ('seg_shards').",
      flag_values=values,
    ),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> None:
  args = cli.values(f)

  print(f"cores: {os.cpu_count()}")
  with tempfile.TemporaryDirectory() as directory:
    write = write_segmentation_shards if args.task == "segmentation" else write_jpeg_shards
    write(directory, args.images)
    mb = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)) / 2**20
    masks = " with masks" if args.task == "segmentation" else ""
    print(f"shards: {args.images} JPEGs{masks} (shorter side 300-500 px), {mb:.1f} MiB, 8 files")
    rates = {}
    for threads in (int(t) for t in args.threads.split(",")):
      rates[threads] = pipeline_images_per_s(
        directory, threads, args.batch, args.batches, args.task
      )
      print(
        f"pipeline{masks and ' (segmentation)'}, {threads} tf.data thread(s): "
        f"{rates[threads]:8.1f} images/s (224 px, train pp)"
      )
  if args.vit_steps <= 0:
    return
  vit = vit_b16_images_per_s(args.vit_batch, args.vit_steps)
  if vit is None:
    return
  print(f"ViT-B/16 train step (batch {args.vit_batch}, 224 px): {vit:8.2f} images/s")
  for threads, rate in rates.items():
    print(f"ratio pipeline/train step, {threads} thread(s): {rate / vit:8.1f}x")


if __name__ == "__main__":
  cli.run(main, "experiments.benchmarks.bench_input_pipeline", define_flags)
