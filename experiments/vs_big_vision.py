r"""vit_jax's train step beside big_vision's, compiled for the same TPU slices: memory, FLOPs,
collectives, compile time, and the largest per-device batch that fits.

  python -m experiments.vs_big_vision --big_vision_dir=/path/to/big_vision
      [--models=B/16,L/16,H/14] [--topologies=v3:2x2,v4:2x2x2,v5e:4x4,v5p:2x2x2]
  python -m experiments.vs_big_vision --quick   # vit_jax's steps of a small row (tests)

needs libtpu (`pip install -e ".[tpu]"`), no TPU, and a checkout of
github.com/google-research/big_vision (not on PyPI; only its `big_vision/models/vit.py` is
imported, by experiments/big_vision_step.py). Writes results.json and table.md to --out_dir
(default experiments/results/vs_big_vision/); the committed copy keeps the fingerprint of the
code that wrote it (experiments/fingerprint.py: --quick's figures, which need no checkout).

The run of each row, the same on both sides: the ViT paper's architecture (class token, a
Dense+tanh representation layer), 224px, bfloat16 matmuls with float32 parameters, sigmoid
cross-entropy with the head bias at -10, no scan, no remat; ViT-B/16 and ViT-L/16 on
ImageNet-21k (21,843 classes, dropout 0.1), ViT-H/14 on JFT (18,291 classes, no dropout).
vit_jax's side is the trainer's own step (`vit_jax.train.build`, compiled by
vit_jax.tools.plan) of `configs/pretrain.py:dataset=<set>,model=<model>`: Adam in float32. big_vision's
is its `vit.Model` in the step of big_vision's recipe (experiments/big_vision_step.py: Adam with
its first moment in bfloat16, as configs/vit_i21k.py sets it; big_vision has no public ViT-H JFT
config, and its ImageNet-21k recipe is used for every row). Both sides data-parallel over every
device of the slice.

Each compile runs in a process of its own (libtpu holds one per process), one at a time; run
the command under `nice` on a shared machine. Figures per device: temporaries, total HBM (the
compiler's memory_analysis: arguments + outputs not donated + temporaries + code), XLA's FLOPs
(cost analysis), the bytes each collective kind sends (vit_jax.cost.compiled_stats), compile
time. All at the row's starting per-device batch (`start_batch`); then, per side, the largest
per-device batch (1, 2, 4 or a multiple of 8) whose step the compiler accepts within the HBM,
found by bisection guided by a linear fit of memory against batch (a refused compile reports the
temporaries it asked for). Every compile's result is kept in --cache (default
<out_dir>/compiles.json) under its side, row, batch and a hash of that side's source files, so a
rerun compiles only what changed.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.quiet_libtpu()  # before JAX loads: the compiles need no local accelerator
  process.configure()

import glob
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from typing import Any

from absl import flags

from experiments import common, fingerprint
from vit_jax.runtime import cli
from vit_jax.tools import plan as planner

GiB, MiB = 2**30, 2**20
SIDES = ("vit_jax", "big_vision")
# vit_jax's step with Adam's first moment in bfloat16 (optimizer.mu_dtype), as big_vision's recipe
# keeps it: compiled at each row's first batch only, for the memory at equal optimizer state.
SAME_STATE = "vit_jax_mu_bf16"
# model -> (dataset of our recipe, head classes, dropout: the paper's Table 3 for that set)
RUNS = {
  "B/16": ("imagenet21k", 21_843, 0.1),
  "L/16": ("imagenet21k", 21_843, 0.1),
  "H/14": ("jft", 18_291, 0.0),
}
OTHER_MODEL = ("imagenet21k", 21_843, 0.1)  # a model without a row of its own ('testing')
# --quick: vit_jax's two steps (no big_vision checkout needed) for the 'testing' ViT at 224px on a
# v4:2x2x2, 8 images per device: seconds of compiles, for the tests' fingerprint.
QUICK = dict(model="testing", topology="v4:2x2x2", batch=8, sides=("vit_jax",))
WORKDIR = "/tmp/vit_vs_big_vision"  # with --quick and no --out_dir, results in <WORKDIR>/results
TOPOLOGIES = ("v3:2x2", "v4:2x2x2", "v5e:4x4", "v5p:2x2x2")
# Where a row's figures are compared: the per-device batch that a straight line of memory against
# batch (bytes besides the batch's, bytes per image) puts just under the chip's HBM, so that the
# first compile is also the bisection's first guess. B/16: both sides' compiles at 64 images per
# v4 device (about 2.0 GB + 82.7 MB per image); L/16 and H/14 scaled from it by parameters (16
# bytes each: float32 parameters, Adam's two moments, gradients) and by layers x width x tokens.
MEMORY_MODEL = {"B/16": (2.0e9, 82.7e6), "L/16": (5.5e9, 220e6), "H/14": (11e9, 520e6)}
COMPILE_TIMEOUT = 3 * 3600


# --------------------------------------------------------------------------------------------------
# One compile (in its own process).


def vit_jax_config(model: str, global_batch: int, image_size: int = 224):
  """vit_jax's pretraining config of the row (a model without a recipe row, e.g. 'testing',
  gets ImageNet-21k's settings)."""
  from vit_jax.configs import pretrain  # noqa: PLC0415

  dataset, _, dropout = RUNS.get(model, OTHER_MODEL)
  extra = "" if model in RUNS else ",epochs=7,lr=1e-3"
  config = pretrain.get_config(f"dataset={dataset},model={model}{extra}")
  config.batch_size = global_batch
  config.dataset.image_size = image_size
  config.model.dropout_rate = dropout
  return config


def compile_one(
  side: str,
  model: str,
  topology: str,
  per_device_batch: int,
  big_vision_dir: str,
  *,
  devices=None,
  image_size: int = 224,
  num_classes: int | None = None,
) -> dict[str, Any]:
  """Compiles one side's step of a row; returns its figures per device (see `_result`).

  Args:
    side: 'vit_jax' | 'big_vision'.
    model: a vit_jax preset ('B/16', ...; 'testing' for tests).
    topology: a TPU slice ('v4:2x2x2'); with `devices`, only a label.
    per_device_batch: images per device per step.
    big_vision_dir: the big_vision checkout.
    devices: compile for these instead of the topology's (tests: CPU devices).
    image_size, num_classes: the row's (default 224 and RUNS' classes).
  """
  devices = planner.topology_devices(topology) if devices is None else list(devices)
  classes = num_classes or RUNS.get(model, OTHER_MODEL)[1]
  global_batch = per_device_batch * len(devices)
  start = time.perf_counter()
  if side in ("vit_jax", SAME_STATE):
    mu_dtype = "bfloat16" if side == SAME_STATE else "float32"
    lower, state, shardings, batch = _vit_jax_step(
      model, devices, global_batch, image_size, classes, mu_dtype
    )
  elif side == "big_vision":
    lower, state, shardings, batch = _big_vision_step(
      model, devices, global_batch, image_size, classes, big_vision_dir
    )
  else:
    raise ValueError(f"side={side!r}: expected one of {SIDES}")
  return _compile(lower, state, shardings, batch, devices, start)


def _vit_jax_step(model, devices, global_batch, image_size, classes, mu_dtype="float32"):
  """The trainer's step (vit_jax.train.build), as vit_jax.tools.plan compiles it."""
  from vit_jax import sharding, train  # noqa: PLC0415
  from vit_jax.checkpoint.state import train_state  # noqa: PLC0415

  config = vit_jax_config(model, global_batch, image_size)
  config.optimizer.mu_dtype = mu_dtype
  mesh = sharding.make_mesh(config.mesh, devices)
  built = train.build(config, mesh, classes)
  state = train_state.abstract_tree(built.abstract_state, built.state_shardings)
  batch = planner.abstract_batch(config, mesh, classes)
  window = train.abstract_window(mesh)
  return (
    lambda: built.jit_step(batch).lower(state, batch, window),
    state,
    built.state_shardings,
    batch,
  )


def _big_vision_step(model, devices, global_batch, image_size, classes, big_vision_dir):
  """big_vision's model in its recipe's step (experiments/big_vision_step.py)."""
  from experiments import big_vision_step  # noqa: PLC0415
  from vit_jax import models  # noqa: PLC0415

  m = models.get_model_config(model)
  kwargs = big_vision_step.model_kwargs(
    patch_size=m.patch_size,
    width=m.hidden_size,
    depth=m.num_layers,
    mlp_dim=m.mlp_dim,
    num_heads=m.num_heads,
    num_classes=classes,
    dropout=RUNS.get(model, (None, None, 0.1))[2],
    dtype_mm="bfloat16",
  )
  vit = big_vision_step.load_model_module(big_vision_dir)
  step = big_vision_step.build_step(vit, kwargs, devices, global_batch, image_size)
  return lambda: step.jitted.lower(*step.args), step.state, step.state_shardings, step.batch


def _compile(lower, state, shardings, batch, devices, start) -> dict[str, Any]:
  """Lowers and compiles; a step the TPU compiler refuses for lack of HBM is a result too."""
  import jax  # noqa: PLC0415

  from vit_jax.cost import compiled_stats  # noqa: PLC0415

  compile_start, compile_cpu = time.perf_counter(), time.process_time()
  refused = ""
  try:
    compiled = lower().compile()
  except jax.errors.JaxRuntimeError as e:
    temp = compiled_stats.temporaries_refused(str(e))
    if temp is None:
      raise
    seconds, cpu = time.perf_counter() - compile_start, time.process_time() - compile_cpu
    refused = str(e).strip().splitlines()[0]
    stats = compiled_stats.refused_step_stats(state, shardings, batch, temp)
  else:
    seconds, cpu = time.perf_counter() - compile_start, time.process_time() - compile_cpu
    stats = compiled_stats.step_stats(compiled, state, shardings, batch)
  return dict(_result(stats, refused, seconds, devices, start), compile_cpu_seconds=cpu)


def _result(stats, refused: str, compile_seconds: float, devices, start: float) -> dict:
  from vit_jax.cost import devices as device_table  # noqa: PLC0415

  hbm = device_table.hbm_bytes_per_device(devices[0])
  return dict(
    stats=stats.to_dict(),
    refused=refused,
    fits=not refused and (hbm is None or stats.total <= hbm),
    hbm=hbm,
    device_kind=devices[0].device_kind,
    num_devices=len(devices),
    compile_seconds=compile_seconds,
    wall_seconds=time.perf_counter() - start,
  )


# --------------------------------------------------------------------------------------------------
# The cache and the child processes.


def source_hash(side: str, big_vision_dir: str) -> str:
  """A hash of the files that decide a side's compiled step: vit_jax's package for vit_jax;
  big_vision's model module and experiments/big_vision_step.py for big_vision."""
  if side in ("vit_jax", SAME_STATE):
    found = glob.glob(os.path.join(common.REPO, "vit_jax", "**", "*.py"), recursive=True)
    found += glob.glob(os.path.join(common.REPO, "configs", "*.py"))  # vit_jax/configs links here
    files = sorted({os.path.realpath(p) for p in found})
  else:
    files = [
      os.path.join(big_vision_dir, "big_vision", "models", "vit.py"),
      os.path.join(common.REPO, "experiments", "big_vision_step.py"),
    ]
  digest = hashlib.sha256()
  for path in files:
    with open(path, "rb") as f:
      digest.update(os.path.basename(path).encode() + b"\0" + f.read())
  return digest.hexdigest()[:16]


class Compiler:
  """Compiles (side, model, topology, batch) in a child process, or returns the cached result."""

  def __init__(self, big_vision_dir: str, cache_path: str, dump_dir: str | None = None):
    self.big_vision_dir = big_vision_dir
    self.cache_path = cache_path
    self.dump_dir = dump_dir
    self.hashes = {  # without a checkout (--quick), vit_jax's sides only
      side: source_hash(side, big_vision_dir)
      for side in (*SIDES, SAME_STATE)
      if big_vision_dir or side != "big_vision"
    }
    self.cache = {}
    if os.path.exists(cache_path):
      with open(cache_path) as f:
        self.cache = json.load(f)

  def key(self, side: str, model: str, topology: str, batch: int) -> str:
    return f"{side}|{model}|{topology}|{batch}|{self.hashes[side]}"

  def __call__(self, side: str, model: str, topology: str, batch: int) -> dict:
    key = self.key(side, model, topology, batch)
    if key not in self.cache:
      spec = dict(side=side, model=model, topology=topology, per_device_batch=batch)
      print(f"compiling {side} {model} {topology} {batch}/device ...", flush=True)
      cmd = [sys.executable, "-m", "experiments.vs_big_vision", "--compile_one", json.dumps(spec),
             f"--big_vision_dir={self.big_vision_dir}"]  # fmt: skip
      env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
      with tempfile.TemporaryDirectory(prefix="vs_big_vision_dump_") as dump:
        if self.dump_dir:
          env["XLA_FLAGS"] = " ".join(
            [env.get("XLA_FLAGS", ""), f"--xla_dump_to={dump}", _DUMP_MODULES]
          ).strip()
        done = subprocess.run(
          cmd, capture_output=True, text=True, cwd=common.REPO, env=env, timeout=COMPILE_TIMEOUT
        )
        if self.dump_dir:
          _keep_dump(dump, os.path.join(self.dump_dir, key.replace("|", "_").replace("/", "-")))
      lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
      if done.returncode or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
      self.cache[key] = json.loads(lines[-1][len("RESULT ") :])
      common.write_json(self.cache_path, self.cache, sort_keys=True)
    result = self.cache[key]
    print(f"  {side} {model} {topology} {batch}/device: {_verdict(result)}", flush=True)
    return result


_DUMP_MODULES = "--xla_dump_hlo_module_re=.*train_step.*"
# What --dump_dir keeps of XLA's dump of a compile: the buffers of the peak by size, and the
# optimized HLO (gzip'd).
_DUMP_KEEP = ("after_optimizations-memory-usage-report.txt", "after_optimizations.txt")


def _keep_dump(dump: str, into: str) -> None:
  os.makedirs(into, exist_ok=True)
  for name in os.listdir(dump):
    if name.endswith(_DUMP_KEEP):
      with (
        open(os.path.join(dump, name), "rb") as f,
        gzip.open(os.path.join(into, name.split(".", 1)[1] + ".gz"), "wb") as out,
      ):
        shutil.copyfileobj(f, out)


def _verdict(r: dict) -> str:
  s = r["stats"]
  fits = "fits" if r["fits"] else "does not fit"
  return (
    f"total {s['total'] / GiB:.2f} GiB of {(r['hbm'] or 0) / GiB:.0f} ({fits}), temporaries "
    f"{s['temp'] / GiB:.2f} GiB, compiled in {r['compile_seconds']:.0f} s"
  )


# --------------------------------------------------------------------------------------------------
# The largest batch.


def candidates_between(lo: int, hi: int) -> list[int]:
  """Per-device batches strictly between lo and hi: 1, 2, 4 and multiples of 8."""
  return [b for b in (1, 2, 4, *range(8, hi, 8)) if lo < b < hi]


def largest_batch(measure, start: int, hbm: int, limit: int = 4096) -> tuple[int, list[int]]:
  """The largest per-device batch whose step fits (0 if not even 1), and the batches compiled.

  `measure(batch)` returns a compile's result. Above the largest fitting batch so far and no
  refused one yet, the next batch is where a straight line through the two nearest measured
  totals (or through one and the batch-independent bytes) meets the HBM, at most twice the
  batch; inside a bracket of a fitting and a refused batch, that guess and the bracket's middle
  take turns, so the bracket halves at least every two compiles. (Near the HBM the TPU compiler
  rematerialises to fit, so memory stops growing with the batch and a straight line alone can
  point far off.)
  """
  points: dict[int, dict] = {}

  def fit(b):
    points[b] = measure(b)
    return points[b]["fits"]

  lo, hi = (start, None) if fit(start) else (0, start)
  turn = 0
  while True:
    top = min(2 * max(lo, 1), limit) + 1 if hi is None else hi
    inside = candidates_between(lo, top)
    if not inside:
      return lo, sorted(points)
    guess = _predict(points, hbm)
    below = [b for b in inside if b <= guess]
    b = below[-1] if below else inside[0]
    if hi is not None and turn % 2:
      b = inside[len(inside) // 2]
    turn += 1
    if b in points:
      b = next(c for c in inside if c not in points)
    if fit(b):
      lo = b
    else:
      hi = b
    if hi is None and lo >= limit:
      return lo, sorted(points)


def _predict(points: dict[int, dict], hbm: int) -> float:
  """The batch at which the line through the measured totals reaches `hbm` (inf if flat)."""
  xs = sorted(points)
  totals = {b: points[b]["stats"]["total"] for b in xs}
  if len(xs) >= 2:
    b0, b1 = sorted(sorted(xs, key=lambda b: abs(totals[b] - hbm))[:2])
    slope = (totals[b1] - totals[b0]) / (b1 - b0)
    base = totals[b0] - slope * b0
  else:
    s = points[xs[0]]["stats"]
    base = s["params"] + s["opt_state"] + s["gradients"] + s["code"]
    slope = (s["total"] - base) / xs[0]
  return (hbm - base) / slope if slope > 0 else float("inf")


# --------------------------------------------------------------------------------------------------
# The table.


def start_batch(model: str, topology: str) -> int:
  """The row's first per-device batch (see MEMORY_MODEL): a batch of `candidates_between`."""
  from vit_jax.cost import devices as device_table  # noqa: PLC0415

  generation = planner.parse_topology(topology)[0]
  kind = {"v5e": "TPU v5 lite", "v5p": "TPU v5p"}.get(generation, f"TPU {generation}")
  base, per_image = MEMORY_MODEL[model]
  fits = (device_table.HBM_BYTES[kind] - base) / per_image
  return max([1, *(b for b in candidates_between(0, 1 << 20) if b <= fits)])


def run_row(
  compile_,
  model: str,
  topology: str,
  start: int | None = None,
  search: bool = True,
  sides: tuple[str, ...] = SIDES,
) -> dict:
  """The `sides` of a row (and vit_jax's step with big_vision's optimizer state):
  `compile_(side, model, topology, batch)` at the starting batch, then (with `search`) the
  largest batch that fits (None where the device's HBM is unknown, e.g. CPU devices, or not
  searched)."""
  start = start or start_batch(model, topology)
  row = dict(model=model, topology=topology, batch=start, sides={})
  for side in sides:
    first = compile_(side, model, topology, start)
    largest, tried = None, [start]
    if first["hbm"] and search:

      def measure(b, side=side):
        return compile_(side, model, topology, b)

      largest, tried = largest_batch(measure, start, first["hbm"])
    row["sides"][side] = dict(
      at_start=first,
      largest_batch=largest,
      largest=compile_(side, model, topology, largest) if largest else None,
      batches_compiled=tried,
    )
  row[SAME_STATE] = compile_(SAME_STATE, model, topology, start)
  return row


def _collectives(stats: dict) -> str:
  parts = [f"{k} {v['bytes'] / MiB:,.0f}" for k, v in stats["collectives"].items() if v["count"]]
  return ", ".join(parts) or "none"


def _flops_per_image(result: dict, batch: int) -> float:
  return result["stats"]["flops_xla"] / batch


def _largest(row: dict, side: str) -> str:
  """'288 (+2.4%)': the largest batch and its FLOPs per image against the first batch's (the
  compiler's rematerialisation near the HBM)."""
  s = row["sides"][side]
  if not s["largest_batch"]:
    return "—"  # not searched (--nosearch), or the device's HBM is unknown
  start = _flops_per_image(s["at_start"], row["batch"])
  there = _flops_per_image(s["largest"], s["largest_batch"])
  return (
    f"{s['largest_batch']} ({100 * (there / start - 1):+.1f}%)"
    if start
    else str(s["largest_batch"])
  )


def _compile_time(result: dict) -> str:
  cpu = result.get("compile_cpu_seconds")
  return f"{result['compile_seconds']:.0f}" + (f" ({cpu:.0f})" if cpu else "")


def table(rows: list[dict]) -> str:
  """The report: each row's figures per device at its first batch, vit_jax / big_vision."""
  lines = [
    "| model | slice | batch / device | temporaries vit_jax / big_vision | total HBM vit_jax / "
    "big_vision | memory ratio | memory ratio, Adam's first moment in bf16 on both sides "
    "| GFLOPs (XLA) vit_jax / big_vision | FLOP ratio | collectives MiB vit_jax / big_vision "
    "| compile s (CPU s) vit_jax / big_vision | largest batch / device (FLOPs per image there) "
    "vit_jax / big_vision |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    a, b = (r["sides"][s]["at_start"] for s in SIDES)
    sa, sb = a["stats"], b["stats"]
    same = r.get(SAME_STATE)

    def both(fmt, key, sa=sa, sb=sb):
      return f"{fmt(sa[key])} / {fmt(sb[key])}"

    refused = " (refused)" if a["refused"] or b["refused"] else ""
    flops = (
      f"{sa['flops_xla'] / 1e9:,.0f} / {sb['flops_xla'] / 1e9:,.0f} | "
      f"{sa['flops_xla'] / sb['flops_xla']:.3f}"
      if sa["flops_xla"] and sb["flops_xla"]
      else "— | —"
    )
    same_ratio = f"{same['stats']['total'] / sb['total']:.3f}" if same else "—"
    lines.append(
      f"| {r['model']} | {r['topology']} | {r['batch']}{refused} "
      f"| {both(lambda x: f'{x / GiB:.2f} GiB', 'temp')} "
      f"| {both(lambda x: f'{x / GiB:.2f}', 'total')} of {(a['hbm'] or 0) / GiB:.0f} GiB "
      f"| {sa['total'] / sb['total']:.3f} | {same_ratio} | {flops} "
      f"| {_collectives(sa)} / {_collectives(sb)} "
      f"| {_compile_time(a)} / {_compile_time(b)} "
      f"| {_largest(r, 'vit_jax')} / {_largest(r, 'big_vision')} |"
    )
  return "\n".join(lines) + "\n"


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""

  def define(kind, name, default, help_text):
    return getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values)

  return types.SimpleNamespace(
    big_vision_dir=define("string", "big_vision_dir", None, "A big_vision checkout (required)."),
    out_dir=define(
      "string",
      "out_dir",
      None,
      f"Results' folder (default experiments/results/vs_big_vision/; --quick: {WORKDIR}/results).",
    ),
    cache=define("string", "cache", None, "Compile results (default <out_dir>/compiles.json)."),
    models=define("string", "models", ",".join(RUNS), "Rows' models."),
    topologies=define("string", "topologies", ",".join(TOPOLOGIES), "Rows' TPU slices."),
    dump_dir=define("string", "dump_dir", None, "Keep XLA's memory report and optimized HLO."),
    search=define("bool", "search", True, "Search each side's largest batch (else: None)."),
    batch=define(
      "integer", "batch", None, "Each row's first per-device batch (else: start_batch)."
    ),
    quick=define(
      "bool", "quick", False, "Only vit_jax's steps of a 'testing' row (no checkout; tests)."
    ),
    compile_one=define("string", "compile_one", None, "A child's one compile (JSON; internal)."),
  )


def stage_configs(rows: list[dict]) -> dict:
  """vit_jax's config of each row of the results (its per-device batch on its devices), by the
  row's name."""
  return {
    f"{r['model']} on {r['topology']}": vit_jax_config(
      r["model"], r["batch"] * r["sides"]["vit_jax"]["at_start"]["num_devices"]
    )
    for r in rows
  }


def quick(out_dir: str, dump_dir: str | None = None) -> dict:
  """The --quick profile: vit_jax's steps of the QUICK row; compiles.json in `out_dir`."""
  start = time.perf_counter()
  compile_ = Compiler("", os.path.join(out_dir, "compiles.json"), dump_dir)
  row = run_row(compile_, QUICK["model"], QUICK["topology"], QUICK["batch"], False, QUICK["sides"])
  name = f"{QUICK['model']} on {QUICK['topology']}"
  return dict(quick=True, rows={name: row}, seconds=dict(total=time.perf_counter() - start))


def main(argv: list[str], f: types.SimpleNamespace) -> dict | None:
  args = cli.values(f)
  if not planner.libtpu_available():
    raise SystemExit(planner.install_hint())
  out_dir = common.out_dir(args.out_dir, "vs_big_vision", WORKDIR, args.quick)
  if args.compile_one:
    result = compile_one(**json.loads(args.compile_one), big_vision_dir=args.big_vision_dir)
    print("RESULT " + json.dumps(result), flush=True)
    return None
  started = common.provenance()
  if args.quick:
    os.makedirs(out_dir, exist_ok=True)
    results = quick(out_dir, args.dump_dir)
    common.write_results(os.path.join(out_dir, "results.json"), results, started)
    print(f"results.json in {out_dir}")
    return results
  if not args.big_vision_dir:
    raise SystemExit("vs_big_vision: --big_vision_dir is required (a big_vision checkout)")
  from experiments import big_vision_step  # noqa: PLC0415

  big_vision_step.model_path(args.big_vision_dir)  # a wrong folder is one line, now
  cache = args.cache or os.path.join(out_dir, "compiles.json")
  compile_ = Compiler(args.big_vision_dir, cache, args.dump_dir)
  start = time.perf_counter()
  results = dict(quick=False, rows={}, source_hashes=compile_.hashes, seconds={})
  for model in args.models.split(","):
    for topology in args.topologies.split(","):
      row = run_row(compile_, model, topology, start=args.batch, search=args.search)
      results["rows"][f"{model} on {topology}"] = row
      results["seconds"]["total"] = time.perf_counter() - start
      common.write_results(os.path.join(out_dir, "results.json"), results, started)
      with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table(list(results["rows"].values())))
  if out_dir == common.results_dir("vs_big_vision"):  # the committed results: the fingerprint
    rows = list(results["rows"].values())
    fingerprint.attach(results, quick(os.path.join(WORKDIR, "fingerprint")), stage_configs(rows))
    common.write_results(os.path.join(out_dir, "results.json"), results, started)
  print(table(list(results["rows"].values())))
  return results


if __name__ == "__main__":
  cli.run(main, "experiments.vs_big_vision", define_flags)
