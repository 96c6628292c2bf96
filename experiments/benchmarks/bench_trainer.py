r"""What the trainer loses around its step: trainer images/s against the bare compiled step.

  python -m experiments.benchmarks.bench_trainer                       # the demo's pretraining (32px)
  python -m experiments.benchmarks.bench_trainer --steps=300 --batch_size=128

1. The bare step: the trainer's own jitted step (`vit_jax.train.build` → `jit_step`) of the
   demo's pretraining config (the 'demo' ViT, Fashion-MNIST, batch 128, AdamW with
   the config's masks and clipping), on one fixed batch already on the device, timed over
   back-to-back calls, before the trainer and again after it (a machine's speed drifts).
2. The trainer: `vit_jax.train.run` on the same config for `--steps` steps (input pipeline,
   host-to-device transfers, metrics and the final checkpoint included; evaluators off), with
   images/s from its own meter, averaged over the log windows after the first (compilation).
3. The input pipeline alone (`--pipeline_batches`): the trainer's iterator drained as fast as it
   goes, with the process's CPU time per batch, which the trainer's step shares the cores with.

Prints them and the trainer's ratio to the mean of the two bare timings. Run it on an otherwise
idle machine.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import statistics
import tempfile
import time
import types

from absl import flags

from vit_jax.runtime import cli


def demo_config(batch_size: int, steps: int, log_every: int):
  from vit_jax.configs import pretrain

  config = pretrain.get_config("dataset=fashion_mnist")  # the demo's model and loss
  config.batch_size = batch_size
  config.total_steps = steps
  config.log_every_steps = log_every
  config.checkpoint.every_steps = steps
  for evaluator in config.evals.values():
    evaluator.every_steps = 0
  config.evals = {}
  return config


def bare_step(config, iters: int) -> float:
  """Images/s of the trainer's compiled step on one fixed on-device batch."""
  import jax
  import numpy as np

  from vit_jax import sharding, train

  mesh = sharding.make_mesh(config.mesh, None)
  built = train.build(config, mesh, 10)
  state = jax.jit(built.init_state, out_shardings=built.state_shardings)(built.init_key)
  rng = np.random.default_rng(0)
  size, b = config.dataset.image_size, config.batch_size
  batch = dict(
    image=rng.uniform(-1, 1, (b, size, size, 3)).astype(np.float32),
    label=rng.integers(0, 10, b).astype(np.int32),
    mask=np.ones(b, np.float32),
  )
  batch = jax.device_put(batch)
  window = jax.device_put(train.empty_window())
  step = built.jit_step(batch).lower(state, batch, window).compile()
  for _ in range(5):
    state, window, _ = step(state, batch, window)
  jax.block_until_ready(state)
  start = time.perf_counter()
  for _ in range(iters):
    state, window, _ = step(state, batch, window)
  jax.block_until_ready(state)
  return iters * b / (time.perf_counter() - start)


def pipeline_cpu(config, batches: int) -> tuple[float, float]:
  """(images/s, CPU ms per batch) of the trainer's input pipeline drained on its own."""
  import resource

  from vit_jax import input_pipeline, sharding

  def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

  mesh = sharding.make_mesh(config.mesh, None)
  iterator = input_pipeline.make_train_iterator(
    config.dataset,
    global_batch_size=config.batch_size,
    mesh=mesh,
    data_axes=sharding.BATCH_AXES,
    seed=config.seed,
  )
  try:
    for _ in range(min(20, batches)):  # tf.data's autotuning settles
      next(iterator)
    cpu, start = cpu_seconds(), time.perf_counter()
    for _ in range(batches):
      next(iterator)
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
  finally:
    iterator.close()
  return batches * config.batch_size / wall, 1000 * cpu / batches


def trainer(config) -> float:
  """Mean images/s of the trainer's log windows after the first."""
  from absl import logging

  from vit_jax import train
  from vit_jax.runtime import logging_util

  rates = []
  original = logging_util.Throughput.__call__

  def record(self, step):
    out = original(self, step)
    if "images_per_sec" in out:
      rates.append(out["images_per_sec"])
    return out

  verbosity = logging.get_verbosity()
  logging_util.Throughput.__call__ = record
  logging.set_verbosity(logging.WARNING)
  try:
    with tempfile.TemporaryDirectory() as workdir:
      train.run(config, workdir)
  finally:  # the meter and the log level as they were (a caller may train again)
    logging_util.Throughput.__call__ = original
    logging.set_verbosity(verbosity)
  return statistics.mean(rates[1:])


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    batch_size=flags.DEFINE_integer(
      "batch_size", 128, "The demo's pretraining batch size.", flag_values=values
    ),
    steps=flags.DEFINE_integer("steps", 250, "Trainer steps.", flag_values=values),
    log_every=flags.DEFINE_integer(
      "log_every", 50, "Steps per log window (the meter's).", flag_values=values
    ),
    bare_iters=flags.DEFINE_integer(
      "bare_iters",
      150,
      "Timed calls of the bare step, before and after the trainer.",
      flag_values=values,
    ),
    pipeline_batches=flags.DEFINE_integer(
      "pipeline_batches",
      300,
      "Batches of the input pipeline alone (0: not timed).",
      flag_values=values,
    ),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> None:
  args = cli.values(f)
  config = demo_config(args.batch_size, args.steps, args.log_every)
  before = bare_step(config, args.bare_iters)
  ours = trainer(config)
  after = bare_step(config, args.bare_iters)
  bare = (before + after) / 2
  print(
    f"bare step: {bare:.1f} images/s ({args.bare_iters} steps, batch {args.batch_size}; "
    f"{before:.1f} before the trainer, {after:.1f} after)"
  )
  print(
    f"trainer:   {ours:.1f} images/s ({args.steps} steps, mean of the log windows after the "
    f"first)\ntrainer / bare step: {ours / bare:.1%}"
  )
  if args.pipeline_batches:
    rate, cpu_ms = pipeline_cpu(config, args.pipeline_batches)
    print(
      f"input pipeline alone: {rate:.0f} images/s, {cpu_ms:.1f} ms of CPU per batch "
      f"({args.pipeline_batches} batches)"
    )


if __name__ == "__main__":
  cli.run(main, "experiments.benchmarks.bench_trainer", define_flags)
