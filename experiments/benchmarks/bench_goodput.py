r"""What goodput accounting costs the step: the trainer's images/s with and without it, paired;
and the account of the demo's pretraining.

  python -m experiments.benchmarks.bench_goodput                       # 6 pairs of 250 steps
  python -m experiments.benchmarks.bench_goodput --pairs=10 --steps=500
  python -m experiments.benchmarks.bench_goodput --pairs=0 --demo_account  # the demo pretraining's account

Each pair trains the demo's pretraining (experiments/benchmarks/bench_trainer.py's config: batch 128,
evaluators off, the final checkpoint included; a log step every 10 steps, as the demo logs) twice, once with vit_jax.runtime.goodput.Account
("on") and once with an account whose every method does nothing ("off": the calls stay, about
0.1 µs each, their bookkeeping goes; the images/s meter reads the wall clock), in alternating order (on-off, off-on, ...) so that a
drift of the machine falls on both. Each run's images/s is the mean of its log windows after the
first (bench_trainer.trainer). Prints every pair, then the mean cost (off − on) / off over the
pairs and its standard error, and writes them to <out>/overhead.json. Run it on an otherwise
idle machine; the figure is the machine's. Because run-to-run drift of a 2-core machine is larger
than the cost sought, it also times the account's own work per step as the trainer calls it
(`enter` twice per step, `scalars` once per log window), 100,000 steps in a loop, against the
step time of the "off" runs.

With --demo_account it also runs the demo's pretraining as its command
(`python -m vit_jax.main --config=configs/pretrain.py:dataset=fashion_mnist`, in a process of its
own, into --workdir) and writes the workdir's account (vit_jax.tools.goodput) to
<out>/account.json and account.md. <out> is --out, by default experiments/results/goodput/.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
import types

from absl import flags

from experiments import common
from experiments.benchmarks import bench_trainer
from vit_jax.runtime import cli

DEMO_PRETRAIN = "--config=configs/pretrain.py:dataset=fashion_mnist"


def _no_account():
  """A vit_jax.runtime.goodput.Account whose methods do nothing (and write nothing)."""
  from vit_jax.runtime import goodput

  class NoAccount(goodput.Account):
    def enter(self, phase):
      pass

    def phase(self, phase, pending=None):
      return contextlib.nullcontext()

    def training_seconds(self):  # the images/s meter's clock: the wall time, phases untold
      return time.perf_counter()

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
    demo_account=flags.DEFINE_bool(
      "demo_account", False, "Also run the demo's pretraining for its account.", flag_values=values
    ),
    workdir=flags.DEFINE_string(
      "workdir", "/tmp/vit_goodput", "--demo_account's workdir (replaced).", flag_values=values
    ),
    out=flags.DEFINE_string(
      "out", common.results_dir("goodput"), "Where the results files go.", flag_values=values
    ),
  )


def overhead(args) -> dict:
  """The paired runs with and without the account (see the module docstring)."""
  config = bench_trainer.demo_config(args.batch_size, args.steps, args.log_every)
  pairs, costs = [], []
  for i in range(args.pairs):
    order = (True, False) if i % 2 == 0 else (False, True)
    rates = {on: images_per_sec(config, on) for on in order}
    pairs.append(dict(on=rates[True], off=rates[False]))
    costs.append((rates[False] - rates[True]) / rates[False])
    print(
      f"pair {i + 1}: on {rates[True]:.1f} images/s, off {rates[False]:.1f} images/s, "
      f"cost {costs[-1]:+.2%}",
      flush=True,
    )
  stderr = statistics.stdev(costs) / len(costs) ** 0.5 if len(costs) > 1 else None
  spread = f" ± {stderr:.2%} (standard error)" if stderr is not None else ""
  print(
    f"goodput accounting: cost {statistics.mean(costs):+.2%}{spread}, {len(costs)} pairs of "
    f"{args.steps} steps, batch {args.batch_size}"
  )
  per_step = bookkeeping_seconds_per_step(args.log_every)
  step_s = args.batch_size / statistics.mean(p["off"] for p in pairs)
  print(
    f"the account's own work: {1e6 * per_step:.2f} µs per step, {per_step / step_s:.4%} of the "
    f"step ({1e3 * step_s:.1f} ms at the 'off' runs' mean images/s)"
  )
  return dict(
    pairs=pairs,
    cost=statistics.mean(costs),
    cost_stderr=stderr,
    steps=args.steps,
    batch_size=args.batch_size,
    bookkeeping_s_per_step=per_step,
    step_s=step_s,
  )


def bookkeeping_seconds_per_step(log_every: int, steps: int = 100_000) -> float:
  """The seconds per step of the account's calls as the trainer's loop makes them."""
  import tempfile

  from vit_jax.runtime import goodput

  with tempfile.TemporaryDirectory() as workdir:
    account = goodput.Account(workdir)
    start = time.perf_counter()
    for step in range(1, steps + 1):
      account.enter("data_wait")
      account.enter("step")
      if step % log_every == 0:
        account.scalars(step)
    return (time.perf_counter() - start) / steps


def demo_account(workdir: str) -> dict:
  """The demo pretraining's command run into `workdir`, then its account."""
  from vit_jax.runtime import goodput

  shutil.rmtree(workdir, ignore_errors=True)
  command = [sys.executable, "-m", "vit_jax.main", DEMO_PRETRAIN, f"--workdir={workdir}"]
  print("running " + " ".join(command[1:]), flush=True)
  start = time.perf_counter()
  subprocess.run(command, cwd=common.REPO, check=True)
  wall = time.perf_counter() - start
  account = goodput.totals(goodput.read(workdir)["attempts"])
  print(goodput.table(account))
  return dict(command=f"python -m vit_jax.main {DEMO_PRETRAIN}", wall_seconds=wall, account=account)


def account_table(account: dict) -> str:
  """The account as markdown: each phase's seconds and share of the run's wall time."""
  from vit_jax.runtime import goodput

  lines = ["| phase | seconds | share |", "|---|---|---|"]
  for phase in (*goodput.PHASES, "lost"):
    seconds = account.get(phase, 0.0)
    lines.append(
      f"| {phase.replace('_', ' ')} | {seconds:,.1f} | {100 * seconds / account['total']:.1f}% |"
    )
  lines.append(f"| total | {account['total']:,.1f} | |")
  return "\n".join(lines) + "\n"


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  args = cli.values(f)
  results = {}
  if args.pairs:
    results = overhead(args)
    common.write_results(os.path.join(args.out, "overhead.json"), results)
  if args.demo_account:
    demo = demo_account(args.workdir)
    common.write_results(os.path.join(args.out, "account.json"), demo)
    with open(os.path.join(args.out, "account.md"), "w") as out:
      out.write(account_table(demo["account"]))
    results["demo_account"] = demo
  return results


if __name__ == "__main__":
  cli.run(main, "experiments.benchmarks.bench_goodput", define_flags)
