r"""What summing the gradients across devices in bfloat16 instead of float32 costs: accuracy at
small scale on simulated devices, and bytes on the wire of a compiled multi-slice TPU step.

  python -m experiments.grad_reduce            # writes experiments/results/grad_reduce/
  python -m experiments.grad_reduce --quick    # tiny budgets, a check that it runs
  python -m experiments.grad_reduce --resume   # keeps the runs finished in --workdir

With bfloat16 compute the weight gradients leave their matmuls in bfloat16 and are summed across
devices so; `model.grad_reduce_dtype=float32` makes those matmuls accumulate into float32 instead
(vit_jax.models.ops.dense). Accuracy: the CPU demo's pretraining (`configs/pretrain.py:
dataset=fashion_mnist`, the 'demo' ViT) in bfloat16 on 8 simulated CPU devices (XLA's
--xla_force_host_platform_device_count=8, data parallelism over them), once per reduction dtype
and once with the model in float32 as the reference, the same seed, data and steps (and the two
bf16 runs with a second seed, for the spread of other random draws alone); each run's
final training loss, validation top-1 on Fashion-MNIST's test split and few-shot top-1, with its
wall time (a shared machine: times say what a rerun costs, not which is faster). Bytes: the
planner's compile of ViT-Ti/16's step for 2 slices of a v5e:2x2 (needs libtpu; skipped without
it), the bytes each device sends per step between the slices and inside them, by element type.
Writes results.json, table.md (accuracy) and wire.md (bytes) to --out.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import json
import os
import subprocess
import sys
import time
import types

from absl import flags

from experiments import common, fingerprint
from vit_jax.runtime import cli

DEVICES = 8
# (label, model dtype, grad_reduce_dtype, seed): the two bf16 runs again with another seed, for
# the spread that other random draws alone give.
RUNS = (
  ("bf16 compute, gradients summed in bf16", "bfloat16", "bfloat16", 0),
  ("bf16 compute, gradients summed in f32", "bfloat16", "float32", 0),
  ("f32 compute (reference)", "float32", "float32", 0),
  ("bf16 compute, gradients summed in bf16, seed 1", "bfloat16", "bfloat16", 1),
  ("bf16 compute, gradients summed in f32, seed 1", "bfloat16", "float32", 1),
)
PLAN = [
  "--config=configs/pretrain.py:dataset=jft,model=Ti/16,epochs=7,lr=1e-3",
  "--topology=v5e:2x2",
  "--slices=2",
  "--config.batch_size=256",
  "--json",
]


def run_flags(dtype: str, reduce_dtype: str, seed: int, steps: int, test: str) -> list[str]:
  """One run of the demo's pretraining with the model in `dtype`, its gradients summed in
  `reduce_dtype`."""
  return [
    "--config=configs/pretrain.py:dataset=fashion_mnist",
    f"--config.seed={seed}",
    f"--config.model.dtype={dtype}",
    f"--config.model.grad_reduce_dtype={reduce_dtype}",
    f"--config.total_steps={steps}",
    f"--config.schedule.warmup_steps={max(steps // 10, 1)}",
    f"--config.checkpoint.every_steps={steps}",
    f"--config.dataset.eval_split={test}",
    "--config.evals.val.every_steps=0",
    "--config.eval_batch_size=200",
    *[
      f"--config.evals.fewshot_{name}.{field}"
      for name in ("animal_mnist", "mnist_5k")
      for field in (
        "every_steps=0",
        "dataset.train_split=train[:500]",
        f"dataset.eval_split={test}",
      )
    ],
  ]


def wire_bytes(reduce_dtype: str) -> dict | None:
  """The planner's JSON for the multi-slice step, in a process of its own (libtpu)."""
  from vit_jax.tools import plan as planner  # noqa: PLC0415

  if not planner.libtpu_available():
    return None
  env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  env.pop("XLA_FLAGS", None)
  cmd = [sys.executable, "-m", "vit_jax.tools.plan", *PLAN,
         f"--config.model.grad_reduce_dtype={reduce_dtype}"]  # fmt: skip
  start = time.perf_counter()
  done = subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO, env=env)
  if done.returncode:
    raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
  plan = json.loads(done.stdout[done.stdout.index("{") :])
  stats = plan["stats"]
  return dict(
    command="python -m vit_jax.tools.plan " + " ".join(PLAN[:-1]),
    dcn_bytes=stats["dcn_bytes"],
    ici_bytes=stats["ici_bytes"],
    dcn_dtypes=stats["dcn_dtypes"],
    ici_dtypes=stats["ici_dtypes"],
    total=stats["total"],
    compile_seconds=plan["compile_seconds"],
    wall_seconds=time.perf_counter() - start,
  )


def table(results: dict) -> str:
  """The accuracy runs (table.md)."""
  lines = [
    "| run | final training loss | validation top-1 | few-shot top-1 (10-shot Animal-MNIST / "
    "MNIST-5k) | wall time |",
    "|---|---|---|---|---|",
  ]
  for r in results["runs"].values():
    m = r["metrics"]
    lines.append(
      f"| {r['label']} | {m['loss']:.4f} | {100 * m['val/accuracy']:.2f}% "
      f"| {100 * m['fewshot_animal_mnist/10shot']:.1f}% / {100 * m['fewshot_mnist_5k/10shot']:.1f}% "
      f"| {common.fmt_seconds(r['seconds'])} |"
    )
  return "\n".join(lines)


def wire_table(results: dict) -> str:
  """The bytes of the compiled multi-slice step (wire.md); empty without them."""
  wires = [(r["label"], r["wire"]) for r in results["runs"].values() if r.get("wire")]
  if not wires:
    return ""
  lines = [
    "| ViT-Ti/16 step on 2 × v5e:2x2, per device | MiB sent between slices (DCN) | of which "
    "bf16 / f32 | MiB inside a slice (ICI) | of which bf16 / f32 | total HBM |",
    "|---|---|---|---|---|---|",
  ]
  for label, w in wires:

    def split(kind, w=w):
      by = w[f"{kind}_dtypes"]
      whole = w[f"{kind}_bytes"] or 1.0
      return f"{100 * by.get('bf16', 0) / whole:.1f}% / {100 * by.get('f32', 0) / whole:.1f}%"

    lines.append(
      f"| {label.split(', ')[1]} | {w['dcn_bytes'] / 2**20:.2f} | {split('dcn')} "
      f"| {w['ici_bytes'] / 2**20:.2f} | {split('ici')} | {w['total'] / 2**30:.2f} GiB |"
    )
  return "\n".join(lines)


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    **common.define_stage_flags(values, "/tmp/vit_grad_reduce", "Tiny budgets, to check it runs."),
    resume=flags.DEFINE_bool(
      "resume", False, "Keep the runs that finished in --workdir before.", flag_values=values
    ),
  )


def stage_flags(quick: bool) -> dict[str, list[str]]:
  """Every run's flags by its workdir's name (run<i>, in RUNS' order)."""
  steps, test = (8, "test[:200]") if quick else (500, "test")
  return {
    f"run{i}": run_flags(dtype, reduce_dtype, seed, steps, test)
    for i, (_, dtype, reduce_dtype, seed) in enumerate(RUNS)
  }


def run(quick: bool, workdir: str, verbose: bool = False, resume: bool = False) -> dict:
  """Every run (and, for the full profile, its compiled step's bytes): the results' dict."""
  start = time.perf_counter()
  flags = stage_flags(quick)
  # What the runs read (experiments/fingerprint.py): the same data for all of them.
  inputs = fingerprint.data(flags["run0"])
  results = dict(quick=quick, steps=8 if quick else 500, devices=DEVICES, runs={}, inputs=inputs)
  for (label, dtype, reduce_dtype, seed), (name, stage) in zip(RUNS, flags.items(), strict=True):
    metrics, seconds = common.run_stage(
      label, stage, os.path.join(workdir, name), resume=resume, verbose=verbose
    )
    run = dict(label=label, flags=stage, metrics=metrics, seconds=seconds)
    if dtype == "bfloat16" and seed == 0 and not quick:
      run["wire"] = wire_bytes(reduce_dtype)
    results["runs"][name] = run
  results["seconds"] = dict(total=time.perf_counter() - start)
  return results


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  args = cli.values(f)
  given = os.environ.get("XLA_FLAGS", "")
  if f"device_count={DEVICES}" not in given:  # before JAX's backend starts in this process
    os.environ["XLA_FLAGS"] = f"{given} --xla_force_host_platform_device_count={DEVICES}".strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # no libtpu probe in the training runs
  import jax  # noqa: PLC0415

  if jax.device_count() != DEVICES:
    raise SystemExit(f"grad_reduce: {jax.device_count()} devices, not {DEVICES} (XLA_FLAGS set?)")
  started = common.provenance()
  results = run(args.quick, args.workdir, args.verbose, args.resume)
  out = common.out_dir(args.out, "grad_reduce", args.workdir, args.quick)
  if out == common.results_dir("grad_reduce"):  # the committed results: with the fingerprint
    quick = run(True, os.path.join(args.workdir, "fingerprint"), args.verbose)
    fingerprint.attach(results, quick, stage_flags(quick=False))
  common.write_results(os.path.join(out, "results.json"), results, started)
  text, wires = table(results), wire_table(results)
  print(text + ("\n\n" + wires if wires else ""))
  common.finish_report(results, text, out)
  if wires:
    with open(os.path.join(out, "wire.md"), "w") as f:
      f.write(wires + "\n")
  return results


if __name__ == "__main__":
  cli.run(main, "experiments.grad_reduce", define_flags)
