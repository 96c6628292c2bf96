r"""The paper's pretraining configs compiled for TPU slices: memory, FLOPs, implied TPUv3-core-days.

  python -m experiments.pod_plan          # writes experiments/results/pod_plan/
  python -m experiments.pod_plan --quick  # one compile of B/32 on a v3-32 (tests)
  python -m experiments.pod_plan --stage=detect  # writes experiments/results/pod_plan_detect/

needs libtpu (`pip install -e ".[tpu]"`) and no TPU. For each (model, topology) it compiles the
trainer's step of `configs/pretrain.py:dataset=jft,model=<model>` (batch 4096, with
`model.scan=True`) with vit_jax.tools.plan; when a configuration does not fit, the planner's
search picks the fastest proposed setting that leaves a tenth of the HBM free. Writes results.json
and table.md (docs/pod_planning.md's table) to --out_dir (default experiments/results/pod_plan/;
the committed copy keeps the fingerprint of the code that wrote it: experiments/fingerprint.py).

Memory and FLOPs are the TPU compiler's. Step times and core-days are estimates at an assumed
fraction of peak (--efficiency); the column "efficiency implied by the paper" is the fraction
that would reproduce the paper's TPUv3-core-days (ViT paper Table 2: H/14 2.5k, L/16 0.68k on
JFT-300M), for the epochs assumed below.

`--stage=detect` compiles the detect stage's ViTDet setting instead
(`configs/detect.py:dataset=folder,setting=vitdet`: ViT-B/16 at 1024x1024, 14x14 windows with
4 global blocks, batch 64, COCO's 80 classes; blocks unrolled, as window attention needs) on a
v4-16 (v4:2x2x2) and a v5e-16 (v5e:4x4).
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.quiet_libtpu()  # before JAX loads: the planner needs no local accelerator
  process.configure()

import os
import time
import types

from absl import flags

from experiments import common, fingerprint
from vit_jax.runtime import cli
from vit_jax.tools import plan as planner

JFT_IMAGES = 303_000_000
# Epochs of the paper's JFT-300M pretraining runs behind Table 2 (as we read App. B, Table 6).
EPOCHS = {"B/16": 7, "L/16": 7, "H/14": 14}
PAPER_CORE_DAYS = {"L/16": 680, "H/14": 2500}
# (model, topology): the paper's TPUv3 slice, then slices of the newer chips with as many devices
# (v4, v5p: one megacore device per chip) or chips (v5e, v6e).
TOPOLOGIES = ("v3:16x16", "v4:8x8x8", "v5p:8x8x8", "v5e:16x16", "v6e:16x16")
RUNS = [(model, topology) for topology in TOPOLOGIES for model in ("B/16", "L/16", "H/14")]
# --stage=detect: the ViTDet setting of the detect stage on a v4 and a v5e slice of 8 and 16 chips.
DETECT_RUNS = [("ViTDet-B/16", "v4:2x2x2"), ("ViTDet-B/16", "v5e:4x4")]
DETECT_CLASSES = 80  # COCO's
# --quick: one compile that fits (half a minute on 2 cores), for the tests' fingerprint.
QUICK_RUNS = [("B/32", "v3:4x4")]
WORKDIR = "/tmp/vit_pod_plan"  # with --quick and no --out_dir, results in <WORKDIR>/results


def plan_config(model: str):
  """`configs/pretrain.py:dataset=jft,model=<model>` with scanned blocks: the same step, with one
  block compiled instead of 12-32 (about a minute per compile on a 2-core machine instead of 16+
  for an unrolled B/16 on a 512-device slice)."""
  from vit_jax.configs import detect, pretrain  # noqa: PLC0415 (imports JAX: after quiet_libtpu)

  if model.startswith("ViTDet"):
    return detect.get_config("dataset=folder,setting=vitdet")
  config = pretrain.get_config(f"dataset=jft,model={model}")
  config.model.scan = True
  return config


def stage_configs(runs: list[tuple[str, str]]) -> dict:
  """The config each (model, topology) compiles, by the row's name."""
  return {f"{model} on {topology}": plan_config(model) for model, topology in runs}


def run_one(model: str, topology: str, efficiency: float, max_trials: int) -> dict:
  config = plan_config(model)
  start = time.perf_counter()
  classes = DETECT_CLASSES if config.stage == "detect" else None
  base = planner.plan(config, topology, classes, efficiency=efficiency)
  chosen, overrides = base, {}
  if not base.fits:
    found = planner.search(
      config, topology, base, max_trials, num_classes=classes, efficiency=efficiency
    )
    if found:
      overrides, chosen = found[0]
  steps = EPOCHS[model] * JFT_IMAGES / int(config.batch_size) if model in EPOCHS else None
  core_days = None
  if steps and chosen.step_seconds and topology.startswith("v3"):
    core_days = chosen.step_seconds * steps * chosen.num_devices / 86_400
  row = dict(
    model=model,
    topology=topology,
    base=base.to_dict(),
    overrides=overrides,
    chosen=chosen.to_dict(),
    steps=steps,
    core_days=core_days,
    paper_core_days=PAPER_CORE_DAYS.get(model) if topology.startswith("v3") else None,
    wall_seconds=time.perf_counter() - start,
  )
  print(planner.format_plan(chosen), flush=True)
  return row


def run(runs: list[tuple[str, str]], efficiency: float, max_trials: int, out: str) -> dict:
  """Every (model, topology) of `runs`; results.json and table.md in `out` after each."""
  start = time.perf_counter()
  results = dict(quick=runs is QUICK_RUNS, rows={}, seconds={})
  for model, topology in runs:
    results["rows"][f"{model} on {topology}"] = run_one(model, topology, efficiency, max_trials)
    results["seconds"]["total"] = time.perf_counter() - start
    common.write_results(os.path.join(out, "results.json"), results, default=str)
    with open(os.path.join(out, "table.md"), "w") as f:
      f.write(table(list(results["rows"].values())))
  results["seconds"]["total"] = time.perf_counter() - start
  return results


def table(rows: list[dict]) -> str:
  lines = [
    "| model | slice | devices | settings | params+opt / device | temporaries | total / HBM "
    "| GFLOPs / device / step | implied s/step | TPUv3-core-days (implied / paper) "
    "| efficiency implied by the paper |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    c, s = r["chosen"], r["chosen"]["stats"]
    on = [k for k in ("scan", "remat") if c["settings"][k]]
    settings = ", ".join(
      [f"{c['settings']['per_device_batch']}/device", *on]
      + [
        f"{k.split('.')[-1]}={v}"
        for k, v in r["overrides"].items()
        if k != "mesh.data" and k.split(".")[-1] not in on
      ]
    )
    if not c["fits"]:
      settings += " (does not fit)"
    days = paper = eff = ""
    if r["core_days"]:
      days = f"{r['core_days'] / 1000:.2f}k"
    if r["paper_core_days"]:
      paper = f" / {r['paper_core_days'] / 1000:.2f}k"
      eff = f"{100 * c['efficiency'] * r['core_days'] / r['paper_core_days']:.0f}%"
    lines.append(
      f"| {r['model']} | {r['topology']} | {c['num_devices']} × {c['device_kind']} | {settings} "
      f"| {(s['params'] + s['opt_state']) / 2**30:.2f} GiB | {s['temp'] / 2**30:.2f} GiB "
      f"| {s['total'] / 2**30:.2f} / {c['hbm'] / 2**30:.0f} GiB | {s['flops'] / 1e9:,.0f} "
      f"| {c['step_seconds']:.3f} | {days}{paper} | {eff} |"
    )
  return "\n".join(lines) + "\n"


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    out_dir=flags.DEFINE_string(
      "out_dir",
      None,
      "results.json, table.md (default experiments/results/pod_plan/; with --quick, "
      f"{WORKDIR}/results/).",
      flag_values=values,
    ),
    stage=flags.DEFINE_enum(
      "stage",
      "pretrain",
      ["pretrain", "detect"],
      "pretrain: the paper's JFT configs; detect: the detect stage's ViTDet setting.",
      flag_values=values,
    ),
    quick=flags.DEFINE_bool(
      "quick", False, f"Only {QUICK_RUNS[0][0]} on {QUICK_RUNS[0][1]} (tests).", flag_values=values
    ),
    efficiency=flags.DEFINE_float(
      "efficiency",
      0.5,
      "Assumed fraction of peak FLOP/s for the implied step time and core-days.",
      flag_values=values,
    ),
    max_trials=flags.DEFINE_integer(
      "max_trials",
      4,
      "At most this many compilations when a configuration does not fit.",
      flag_values=values,
    ),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  args = cli.values(f)
  if not planner.libtpu_available():
    raise SystemExit(planner.install_hint())
  name = "pod_plan_detect" if args.stage == "detect" else "pod_plan"
  out = common.out_dir(args.out_dir, name, WORKDIR, args.quick)
  os.makedirs(out, exist_ok=True)
  started = common.provenance()
  full = DETECT_RUNS if args.stage == "detect" else RUNS
  results = run(QUICK_RUNS if args.quick else full, args.efficiency, args.max_trials, out)
  if out == common.results_dir(name):  # the committed results: with the fingerprint
    quick = run(QUICK_RUNS, args.efficiency, args.max_trials, os.path.join(WORKDIR, "fingerprint"))
    fingerprint.attach(results, quick, stage_configs(full))
  common.write_results(os.path.join(out, "results.json"), results, started, default=str)
  print(table(list(results["rows"].values())))
  return results


if __name__ == "__main__":
  cli.run(main, "experiments.pod_plan", define_flags)
