r"""What goodput accounting costs the step: the trainer's images/s with and without it, paired.

  python -m experiments.bench_goodput                       # 6 pairs of 250 steps
  python -m experiments.bench_goodput --pairs=10 --steps=500

Each pair trains the demo's pretraining (experiments/bench_trainer.py's config: batch 128,
evaluators off, the final checkpoint included; a log step every 10 steps, as the demo logs) twice, once with vit_jax.runtime.goodput.Account
("on") and once with an account whose every method does nothing ("off": the calls stay, about
0.1 µs each, their bookkeeping goes), in alternating order (on-off, off-on, ...) so that a
drift of the machine falls on both. Each run's images/s is the mean of its log windows after the
first (bench_trainer.trainer). Prints every pair, then the mean cost (off − on) / off over the
pairs and its standard error. Run it on an otherwise idle machine; the figure is the machine's.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import contextlib
import statistics
import types

from absl import flags

from experiments import bench_trainer
from vit_jax.runtime import cli


def _no_account():
  """A vit_jax.runtime.goodput.Account whose methods do nothing (and write nothing)."""
  from vit_jax.runtime import goodput

  class NoAccount(goodput.Account):
    def enter(self, phase):
      pass

    def phase(self, phase):
      return contextlib.nullcontext()

    def resumed(self, step, source, newest_committed):
      pass

    def saved(self, step):
      pass

    def scalars(self, step):
      return {}

    def finish(self, outcome):
      pass

  return NoAccount


def images_per_sec(config, account: bool) -> float:
  """bench_trainer.trainer's images/s, with the real account or the one that does nothing."""
  from vit_jax.runtime import goodput

  real = goodput.Account
  goodput.Account = real if account else _no_account()
  try:
    return bench_trainer.trainer(config)
  finally:
    goodput.Account = real


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    pairs=flags.DEFINE_integer("pairs", 6, "Pairs of runs (on, off).", flag_values=values),
    batch_size=flags.DEFINE_integer(
      "batch_size", 128, "The demo's pretraining batch size.", flag_values=values
    ),
    steps=flags.DEFINE_integer("steps", 250, "Trainer steps per run.", flag_values=values),
    log_every=flags.DEFINE_integer(
      "log_every", 10, "Steps per log window (the demo config's).", flag_values=values
    ),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> list[tuple[float, float]]:
  args = cli.values(f)
  config = bench_trainer.demo_config(args.batch_size, args.steps, args.log_every)
  pairs, costs = [], []
  for i in range(args.pairs):
    order = (True, False) if i % 2 == 0 else (False, True)
    rates = {on: images_per_sec(config, on) for on in order}
    pairs.append((rates[True], rates[False]))
    costs.append((rates[False] - rates[True]) / rates[False])
    print(
      f"pair {i + 1}: on {rates[True]:.1f} images/s, off {rates[False]:.1f} images/s, "
      f"cost {costs[-1]:+.2%}",
      flush=True,
    )
  spread = ""
  if len(costs) > 1:
    spread = f" ± {statistics.stdev(costs) / len(costs) ** 0.5:.2%} (standard error)"
  print(
    f"goodput accounting: cost {statistics.mean(costs):+.2%}{spread}, {len(costs)} pairs of "
    f"{args.steps} steps, batch {args.batch_size}"
  )
  return pairs


if __name__ == "__main__":
  cli.run(main, "experiments.bench_goodput", define_flags)
