r"""Forward and train-step images/s of vit_jax's models against timm and against vit_jax at
another revision, each side in a process of its own.

For every model (--models), dtype and mode (forward; train = forward + backward + an optax
update): images/s, the model's TFLOP/s and their fraction of the device's peak; for timm (when
PyTorch and timm are importable) and a baseline (--baseline_rev, --baseline_dir) their images/s
and the vit_jax / other ratio. Every side is this script again (--process=<side>, the parent's
options), so no side competes with another's threads or memory; the parent starts no JAX
backend. A baseline process has the other tree's whole `vit_jax` package first on its PYTHONPATH
(--baseline_rev: `git archive <rev> vit_jax`) and builds its model with that tree's
`models.get_model`; each JAX process prints the vit_jax it imported. Each variant is built,
compiled, warmed up and timed for --repeats rounds of --iters back-to-back steps: --processes=N
runs each side N times in turn, rounds pooled; --paired keeps every side alive, taking turns
round by round (ratio: the median of the rounds' ratios). Model FLOPs: vit_jax.cost.flops' count
of the model's matmuls (train: 3 x forward), the same for every side; peaks: vit_jax.cost.devices.

  python -m experiments.benchmarks.benchmark_model                 # CPU: demo, Ti/16 and B/16 at 224px, fp32
  python -m experiments.benchmarks.benchmark_model --paired --repeats=16 --iters=1
  python -m experiments.benchmarks.benchmark_model --baseline_rev=HEAD --timm=off --modes=forward
  python -m experiments.benchmarks.benchmark_model --baseline_dir=../vit_jax_main --timm=off
  python -m experiments.benchmarks.benchmark_model --models=B/16 --dtypes=bfloat16 --timm_compile  # GPU

The method in detail, and the figures measured with it: docs/benchmarks.md.
"""

import contextlib
import dataclasses
import functools
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable

from absl import app, flags

from experiments import common
from experiments.benchmarks.benchmark_report import (
  print_row,
  print_summary,
  ratio,
  ratio_quartiles,
  variant,
)

# common.REPO, the checkout: `git archive` reads --baseline_rev's vit_jax from it, and it holds
# the driver (`experiments`) that every measured process runs.
_JSON_MARK = "BENCHMARK_ROWS "

# Default batch sizes per backend: small enough for 2 CPU cores to finish in minutes, large
# enough on accelerators to fill the chip (single device; fits 16 GiB HBM on TPU v5e).
_DEFAULT_BATCH = {
  "cpu": {"ViT-B_16": 8, "ViT-Ti_16": 32, "demo": 128},
  "gpu": {"ViT-B_16": 256, "ViT-L_16": 128, "ViT-Ti_16": 1024, "demo": 4096},
  "tpu": {"ViT-B_16": 128, "ViT-Ti_16": 512, "demo": 4096},
}
_FALLBACK_BATCH = {"cpu": 8, "gpu": 128, "tpu": 64}


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The benchmark's flags, defined as every command's are (vit_jax.runtime.cli)."""

  def define(kind, name, default, help_text, *args):
    return getattr(flags, f"DEFINE_{kind}")(name, default, *args, help_text, flag_values=values)

  sides = ["all", "jax", "baseline", "timm", "timm_compile"]
  return types.SimpleNamespace(
    models=define("list", "models", ["demo", "Ti/16", "B/16"], "presets, aliases or 'demo'"),
    batch_sizes=define("list", "batch_sizes", [], "per model (empty: the backend's defaults)"),
    dtypes=define("list", "dtypes", ["float32"], "computation dtypes"),
    modes=define("list", "modes", ["forward", "train"], "forward and/or train"),
    image_size=define("integer", "image_size", 224, "square input resolution (demo: 32)"),
    num_classes=define("integer", "num_classes", 1000, "head width (demo: 10)"),
    warmup=define("integer", "warmup", 2, "untimed steps per variant after compilation"),
    iters=define("integer", "iters", 3, "back-to-back steps per timed round"),
    repeats=define("integer", "repeats", 3, "timed rounds per process"),
    processes=define("integer", "processes", 1, "processes per side, started in turn, pooled"),
    paired=define("bool", "paired", False, "one process per side, taking turns round by round"),
    pause=define("float", "pause", 0.2, "--paired: idle seconds before each turn"),
    optimizer=define("enum", "optimizer", "adamw", "sgd: momentum 0.9", ["adamw", "sgd"]),
    timm=define(
      "enum",
      "timm",
      "auto",
      "benchmark timm alongside (compiled: only under torch.compile)",
      ["auto", "on", "off", "compiled"],
    ),
    timm_compile=define("bool", "timm_compile", False, "also timm under torch.compile"),
    attention_kernel=define(
      "enum", "attention_kernel", "auto", "JAX's core", ["auto", "xla", "cudnn"]
    ),
    torch_threads=define("integer", "torch_threads", 0, "0: the CPUs this process may use"),
    baseline_rev=define("string", "baseline_rev", None, "a git revision whose vit_jax is 'before'"),
    baseline_dir=define("string", "baseline_dir", None, "or a tree whose vit_jax is 'before'"),
    xla_flags=define("string", "xla_flags", "", "appended to XLA_FLAGS (every process)"),
    peak_tflops=define("float", "peak_tflops", None, "the device's peak instead of devices'"),
    process=define(
      "enum", "process", "all", "all: run and compare the sides; else be that side", sides
    ),
  )


# ---------------------------------------------------------------------------------------------
# The measured side: one implementation in this process.


@dataclasses.dataclass
class Runner:
  """One benchmarked variant: `run(n)` performs n steps and waits for them."""

  run: Callable[[int], None]
  xla_flops: float | None = None  # per step, from XLA's cost analysis
  times: list[float] = dataclasses.field(default_factory=list)


def _baseline_label(args) -> str | None:
  """The baseline's name in the rows: 'jax@<rev>' or 'jax@<folder name>' (None: no baseline)."""
  if args.baseline_dir:
    return "jax@" + os.path.basename(os.path.normpath(args.baseline_dir))
  return "jax@" + args.baseline_rev if args.baseline_rev else None


def jax_runner(args, module, batch, mode, image_size, num_classes, seed=0) -> Runner:
  """Builds, compiles and warms up the JAX forward or train step of `module`."""
  import jax
  import jax.numpy as jnp
  import optax

  rng = jax.random.key(seed)
  images = jax.random.uniform(rng, (batch, image_size, image_size, 3), jnp.float32, -1, 1)
  labels = jax.random.randint(rng, (batch,), 0, num_classes)
  params = jax.jit(lambda: module.init(rng, images[:1], train=False)["params"])()

  if mode == "forward":
    forward = jax.jit(
      lambda params, images: common.logits_of(module.apply({"params": params}, images, train=False))
    )
    compiled = forward.lower(params, images).compile()

    def run(n):
      out = None
      for _ in range(n):
        out = compiled(params, images)
      jax.block_until_ready(out)

  else:
    adamw = args.optimizer == "adamw"
    tx = optax.adamw(1e-4, weight_decay=0.05) if adamw else optax.sgd(1e-3, momentum=0.9)
    opt_state = jax.jit(tx.init)(params)

    step = jax.jit(common.train_step_fn(module, tx), donate_argnums=(0, 1))
    compiled = step.lower(params, opt_state, images, labels).compile()
    state = [params, opt_state]

    def run(n):
      loss = None
      for _ in range(n):
        state[0], state[1], loss = compiled(state[0], state[1], images, labels)
      jax.block_until_ready((state, loss))

  try:  # a baseline's vit_jax may predate vit_jax.cost
    from vit_jax.cost import flops
  except ImportError:
    xla_flops = None
  else:
    xla_flops = flops.compiled_flops(compiled)
  run(args.warmup)
  return Runner(run, xla_flops)


def timm_runner(args, config, batch, mode, dtype, image_size, num_classes, compiled) -> Runner:
  """timm's VisionTransformer with the same sizes and the tanh GELU, eager (or under
  torch.compile), trained with the torch.optim twin of --optimizer (fused kernels on CUDA)."""
  import torch
  import torch.nn.functional as F
  from timm.models.vision_transformer import VisionTransformer

  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  model = VisionTransformer(
    img_size=image_size,
    patch_size=config.patch_size,
    embed_dim=config.hidden_size,
    depth=config.num_layers,
    num_heads=config.num_heads,
    mlp_ratio=config.mlp_dim / config.hidden_size,
    num_classes=num_classes,
    act_layer="gelu_tanh",
  ).to(device)
  if compiled:
    model = torch.compile(model)
  images = torch.rand(batch, 3, image_size, image_size, device=device) * 2 - 1
  labels = torch.randint(0, num_classes, (batch,), device=device)
  autocast = functools.partial(
    torch.autocast, device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"
  )

  sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

  if mode == "forward":
    model.eval()

    def run(n):
      with torch.inference_mode(), autocast():
        for _ in range(n):
          model(images)
      sync()

  else:
    model.train()
    fused = device.type == "cuda"  # one kernel per update on GPU; not implemented on CPU
    opt = (
      torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=fused)
      if args.optimizer == "adamw"
      else torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, fused=fused)
    )

    def run(n):
      for _ in range(n):
        with autocast():
          loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
      sync()

  run(args.warmup)
  return Runner(run)


def _build(impl, args, config, batch, dtype, mode, image_size, num_classes) -> Runner:
  if impl.startswith("timm"):
    compiled = impl == "timm_compile"
    return timm_runner(args, config, batch, mode, dtype, image_size, num_classes, compiled)
  from vit_jax import models

  # The same call on both JAX sides, each with its own vit_jax; a field that an older tree's
  # model lacks is left out.
  wanted = dict(dtype=dtype, attention_kernel=args.attention_kernel)
  module = models.get_model(config, num_classes, **{k: v for k, v in wanted.items() if k in config})
  return jax_runner(args, module, batch, mode, image_size, num_classes)


def _start(impl: str, args):
  """Starts this process's framework and says what it runs; returns (backend, JAX device)."""
  if impl.startswith("timm"):
    import timm
    import torch

    # No JAX backend in this process: on a GPU it would take most of the memory torch needs.
    torch.set_num_threads(args.torch_threads or len(os.sched_getaffinity(0)))
    # fp32 matmuls in TF32 on NVIDIA GPUs, as XLA's default precision does on the JAX side.
    torch.set_float32_matmul_precision("high")
    print(
      f"  torch {torch.__version__}, timm {timm.__version__}, {torch.get_num_threads()} threads",
      flush=True,
    )
    return ("gpu" if torch.cuda.is_available() else "cpu"), None
  import jax

  import vit_jax

  device = jax.devices()[0]
  print(f"  jax {jax.__version__} on {device.device_kind} ({device.platform})", flush=True)
  xla_flags = os.environ.get("XLA_FLAGS", "")
  print(f"  vit_jax {os.path.realpath(vit_jax.__file__)}; XLA_FLAGS={xla_flags!r}", flush=True)
  try:  # a baseline's vit_jax may predate xla_cpu_memory
    from vit_jax.kernels import xla_cpu_memory
  except ImportError:
    pass
  else:
    print(f"  malloc: {xla_cpu_memory.status}", flush=True)
  return device.platform, device


# The 'demo' preset's architecture, for a baseline tree from before that preset existed (it
# builds the demo's ViT from its 'testing' preset, as the demo then did).
_DEMO_BEFORE_ITS_PRESET = dict(hidden_size=64, mlp_dim=256, num_heads=4, num_layers=4)


def _demo_config(models):
  """The demo's model ConfigDict in this process's vit_jax (this tree's or a baseline's)."""
  if "ViT-demo" in models.MODEL_CONFIGS:
    return models.get_model_config("demo")
  config = models.get_model_config("testing")
  config.update(_DEMO_BEFORE_ITS_PRESET)
  return config


def _variants(impl: str, args) -> list[tuple[dict, Callable[[], Runner]]]:
  """(row fields, build) for every (model, dtype, mode) of one implementation, in this process;
  `build()` constructs, compiles and warms up that variant's Runner."""
  from vit_jax import models

  backend, device = _start(impl, args)
  variants = []
  for i, entry in enumerate(args.models):
    # This process's vit_jax: a baseline's own presets in a baseline process.
    if entry == "demo":
      name, config, image_size, num_classes = "demo", _demo_config(models), 32, 10
    else:
      name = models.resolve_name(entry)
      config = models.get_model_config(name)
      image_size, num_classes = args.image_size, args.num_classes
    if args.batch_sizes:
      batch = int(args.batch_sizes[i])
    else:
      batch = _DEFAULT_BATCH.get(backend, {}).get(name, _FALLBACK_BATCH.get(backend, 8))
    if impl.startswith("timm") and (config.get("resnet") is not None or "block_units" in config):
      continue  # timm has no R50+ViT hybrid or BiT of these fields
    forward = None  # the model FLOPs of every side's rows: counted on this tree's model
    if impl == "jax":
      from vit_jax.cost import flops

      module = models.get_model(config, num_classes)
      forward = flops.forward_flops(module, (image_size, image_size))
    label = impl if impl != "baseline" else _baseline_label(args)
    where = None if device is None else [device.platform, device.device_kind]
    model_fields = dict(model=name, batch=batch, impl=label, device=where, forward_flops=forward)
    for dtype in args.dtypes:
      for mode in args.modes:
        fields = dict(model_fields, dtype=dtype, mode=mode)
        build = functools.partial(
          _build, impl, args, config, batch, dtype, mode, image_size, num_classes
        )
        variants.append((fields, build))
  return variants


def _serve(impl: str, args) -> None:
  """A measuring process: announces its variants, then obeys the parent's commands on stdin, one
  per line: `build I` (variant I becomes the current one; the previous one is dropped) and `run`
  (one timed round of the current variant: --iters steps). Each answer is one _JSON_MARK line on
  stdout."""

  def answer(value):
    print(_JSON_MARK + json.dumps(value), flush=True)

  variants = _variants(impl, args)
  answer([fields for fields, _ in variants])
  runner = None
  for line in sys.stdin:
    command, *rest = line.split()
    if command == "build":
      runner = None
      gc.collect()
      runner = variants[int(rest[0])][1]()
      answer({"xla_flops": runner.xla_flops})
    elif command == "run":
      t0 = time.perf_counter()
      runner.run(args.iters)
      answer((time.perf_counter() - t0) / args.iters)
    else:
      raise ValueError(f"unknown command {line.strip()!r}")


# ---------------------------------------------------------------------------------------------
# The parent: one process per implementation, and the comparison.


def _check_baseline_rev(rev: str, repo: str | None = None) -> None:
  """Exits with one line unless `repo` (this checkout) is a git checkout of its own holding `rev`.

  --baseline_rev exports the revision's vit_jax with `git archive` from the checkout this script
  lies in: a copy of the tree without `.git`, one inside another repository, or a machine without
  git cannot give it (--baseline_dir can).
  """
  repo = repo or common.REPO
  hint = "; --baseline_dir=<a tree holding the baseline's vit_jax> needs no git"

  def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)

  try:
    top = git("rev-parse", "--show-toplevel")
  except FileNotFoundError:
    raise SystemExit(f"--baseline_rev={rev}: git is not installed{hint}") from None
  if top.returncode:
    reason = (top.stderr.strip().splitlines() or ["git rev-parse failed"])[0]
    if "not a git repository" in reason:
      raise SystemExit(f"--baseline_rev={rev}: {repo} is not a git checkout{hint}")
    raise SystemExit(f"--baseline_rev={rev}: git cannot read the checkout {repo}: {reason}")
  top_level = top.stdout.strip()
  if os.path.realpath(top_level) != os.path.realpath(repo):
    raise SystemExit(
      f"--baseline_rev={rev}: {repo} is not a git checkout (it lies inside another one, "
      f"{top_level}){hint}"
    )
  if git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").returncode:
    raise SystemExit(f"--baseline_rev={rev}: no such revision in the git checkout {repo}")


@contextlib.contextmanager
def _baseline_tree(args):
  """A temporary folder holding only the baseline's `vit_jax` (None without a baseline): from
  --baseline_rev, or a link to --baseline_dir's; the driver (`experiments`) stays this one."""
  if not _baseline_label(args):
    yield None
    return
  with tempfile.TemporaryDirectory(prefix="vit_jax_baseline_") as tree:
    if args.baseline_dir:
      package = os.path.join(os.path.abspath(args.baseline_dir), "vit_jax")
      if not os.path.isfile(os.path.join(package, "__init__.py")):
        raise SystemExit(f"--baseline_dir={args.baseline_dir} has no vit_jax package")
      os.symlink(package, os.path.join(tree, "vit_jax"))
    else:
      archive = subprocess.run(
        ["git", "-C", common.REPO, "archive", args.baseline_rev, "vit_jax"], capture_output=True
      )
      if archive.returncode:
        raise SystemExit(f"--baseline_rev={args.baseline_rev}: {archive.stderr.decode().strip()}")
      subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    yield tree


class _Side:
  """One implementation's process: this script, the parent's options, --process=impl. With
  `python -P` only PYTHONPATH decides what it imports: for `baseline` the baseline's tree first
  (its vit_jax), then this checkout (`experiments`, and vit_jax for the other sides)."""

  def __init__(self, impl: str, argv: list[str], env: dict, tree: str | None, paired: bool):
    print(f"\n== {impl} (own process{', taking turns' if paired else ''})", flush=True)
    self.impl = impl
    path = [
      p for p in (tree if impl == "baseline" else None, common.REPO, env.get("PYTHONPATH")) if p
    ]
    env = dict(env, PYTHONPATH=os.pathsep.join(path))
    if paired:  # both sides hold their model at once: on a GPU JAX must not take most memory
      env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    cmd = [
      sys.executable,
      "-P",
      "-m",
      "experiments.benchmarks.benchmark_model",
      *argv,
      f"--process={impl}",
    ]
    self.proc = subprocess.Popen(
      cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=common.REPO
    )
    self.variants = self._answer()

  def _answer(self):
    for line in self.proc.stdout:
      if line.startswith(_JSON_MARK):
        return json.loads(line[len(_JSON_MARK) :])
      print(line, end="", flush=True)
    raise RuntimeError(f"{self.impl} failed (exit status {self.proc.wait()}); its stderr is above")

  def ask(self, command: str):
    try:
      self.proc.stdin.write(command + "\n")
      self.proc.stdin.flush()
    except BrokenPipeError:
      pass  # it has ended: _answer says how
    return self._answer()

  def close(self) -> None:
    self.proc.stdin.close()
    self.proc.wait()


def _take_turns(sides: dict[str, _Side], args, measured: dict[str, list[dict]]) -> None:
  """For each variant of the first side: built in every side, then --repeats rounds of --iters
  steps, side after side (reversed on odd rounds; --paired: after --pause seconds of quiet), so
  the sides of a ratio run seconds apart, never at once, and a drifting machine tilts neither."""

  def ask(impl: str, command: str):
    """The side's answer; None where it failed (it is dropped: the others' figures stand)."""
    try:
      return sides[impl].ask(command)
    except RuntimeError as e:
      print(f"  {e}", flush=True)
      del sides[impl]
      return None

  for fields in next(iter(sides.values())).variants if sides else []:
    rows = {}
    for impl, side in list(sides.items()):
      index = [i for i, f in enumerate(side.variants) if variant(f) == variant(fields)]
      built = ask(impl, f"build {index[0]}") if index else None  # timm has no hybrid
      if built:
        rows[impl] = dict(side.variants[index[0]], times=[], xla_flops=built["xla_flops"])
    for r in range(args.repeats):
      for impl in list(rows) if r % 2 == 0 else list(rows)[::-1]:
        if args.paired:
          time.sleep(args.pause)
        step = ask(impl, "run")
        if step is None:
          del rows[impl]
        else:
          rows[impl]["times"].append(step)
    for impl, row in rows.items():
      _merge_rounds(measured[impl], row)
      # Every timed round, in order (drift shows as a trend; paired rounds line up).
      rounds = " ".join(f"{t * 1e3:.6g}" for t in row["times"])
      img_s = row["batch"] / statistics.median(row["times"])
      print(
        f"  {impl} {row['model']} {row['dtype']} {row['mode']}: {img_s:.2f} img/s; "
        f"rounds (ms): {rounds}",
        flush=True,
      )


def _measure(impls: list[str], argv: list[str], env: dict, tree: str | None, args) -> dict:
  """Every implementation's rows: --paired, one process each, all alive, taking turns; else
  --processes processes each, one at a time (jax, timm, jax, timm, ...), rounds pooled."""
  measured = {impl: [] for impl in impls}
  if args.paired:
    groups = [impls]
  else:
    groups = [[impl] for _ in range(args.processes) for impl in impls]
  for group in groups:
    sides = {}
    for impl in group:
      try:
        sides[impl] = _Side(impl, argv, env, tree, args.paired)
      except RuntimeError as e:
        print(f"  {e}", flush=True)
    if "jax" in sides or not args.paired:  # the ratios are against jax
      _take_turns(sides, args, measured)
    for side in sides.values():
      side.close()
  return measured


def _merge_rounds(rows: list[dict], new: dict) -> None:
  """Adds a row to `rows`; the timed rounds of a variant measured before are pooled with it."""
  same = [r for r in rows if variant(r) == variant(new)]
  if same:
    same[0]["times"] = same[0]["times"] + new["times"]
  else:
    rows.append(dict(new))


def _want_timm(args) -> bool:
  found = all(importlib.util.find_spec(name) for name in ("timm", "torch"))
  if args.timm in ("on", "compiled") and not found:
    raise SystemExit(f"--timm={args.timm}, but timm or torch is not importable")
  return found and args.timm != "off"


def _compare(argv: list[str], args, env: dict) -> None:
  """The parent: every implementation's process, then the table and the summary."""
  from vit_jax.cost import devices, flops  # no JAX backend: that is the measured processes'

  print(f"{len(os.sched_getaffinity(0))} CPUs: {devices.cpu_description(devices.read_cpuinfo())}")
  given = (env.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()
  print(f"XLA_FLAGS={given!r}, to which each JAX process's vit_jax adds its defaults")
  how = (
    f"{args.repeats} rounds, each {args.iters} steps per implementation in turn in its own "
    f"process ({args.pause} s pause before each turn); ratio: median of the rounds' ratios"
    if args.paired
    else f"{args.repeats} rounds x {args.iters} steps in each of {args.processes} "
    "process(es) per implementation, started in turn (median round)"
  )
  print(
    f"JAX attention_kernel {args.attention_kernel}, optimizer {args.optimizer}, "
    f"warmup {args.warmup}, {how}"
  )
  compiled = ["timm_compile"] if args.timm_compile or args.timm == "compiled" else []
  timm = (compiled if args.timm == "compiled" else ["timm", *compiled]) if _want_timm(args) else []
  impls = ["jax"] + (["baseline"] if _baseline_label(args) else []) + timm
  with _baseline_tree(args) as tree:
    measured = _measure(impls, argv, env, tree, args)
  rows = []
  for ref in measured["jax"]:
    group = [ref] + [r for impl in impls[1:] for r in measured[impl] if variant(r) == variant(ref)]
    peak, peak_how = devices.device_peak(*ref["device"], ref["dtype"], args.peak_tflops)
    batch, mode = ref["batch"], ref["mode"]
    passes = flops.TRAIN_PASSES if mode == "train" else 1
    model_flops = ref["forward_flops"] * batch * passes if ref["forward_flops"] else None
    for r in group:
      step_s = statistics.median(r["times"])
      paired = args.paired and r is not ref
      row = dict(
        r,
        img_s=batch / step_s,
        step_ms=step_s * 1e3,
        spread=(max(r["times"]) - min(r["times"])) / step_s,
        best_img_s=batch / min(r["times"]),
        tflops=model_flops / step_s / 1e12 if model_flops else None,
        xla_tflops=r["xla_flops"] / step_s / 1e12 if r["xla_flops"] else None,
        peak=model_flops / step_s / peak if model_flops and peak else None,
        vs=ratio(r["times"], ref["times"], args.paired) if r is not ref else None,
        vs_quartiles=ratio_quartiles(r["times"], ref["times"]) if paired else None,
        vs_best=(min(r["times"]) / min(ref["times"])) if r is not ref else None,
      )
      rows.append(row)
      print_row(row, header=len(rows) == 1)
    print(f"  peak {peak / 1e12:.3g} TFLOP/s ({peak_how})" if peak else f"  peak {peak_how}")
  print_summary(rows, args.paired)


def main(argv: list[str], f: types.SimpleNamespace) -> None:
  # As vit_jax.runtime.cli.values and .given do: this driver imports no vit_jax before a side
  # knows which tree's it runs (a baseline's).
  args = types.SimpleNamespace(**{name: h.value for name, h in vars(f).items()})
  argv = [h.serialize() for h in vars(f).values() if h.present]  # every side's flags
  if args.baseline_rev and args.baseline_dir:
    raise app.UsageError("--baseline_rev and --baseline_dir: one baseline at a time")
  if args.baseline_rev and args.process == "all":
    _check_baseline_rev(args.baseline_rev)  # before anything is printed or started
  # What every measured process starts from: the environment as given, before --xla_flags and
  # before any vit_jax adds its XLA:CPU defaults (each process's own vit_jax does that).
  env = dict(os.environ)
  if args.process == "all":
    _compare(argv, args, env)
    return
  if args.process == "baseline":
    # Only the baseline tree's vit_jax: an editable install's finder (setuptools') would fill in
    # the modules that tree lacks from this checkout.
    sys.meta_path[:] = [
      f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")
    ]
  if args.xla_flags:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()
  _configure_process()
  _serve(args.process, args)


def _configure_process() -> None:
  """This side's process set up as a command's, before JAX starts: by its vit_jax's
  `runtime.process.configure()`, or, in a tree from before that existed, by `import vit_jax`."""
  try:
    from vit_jax.runtime import process
  except ImportError:
    import vit_jax  # noqa: F401 (such a tree set its allocator and XLA flags on import)
  else:
    process.configure()


if __name__ == "__main__":
  # absl's own app.run rather than vit_jax.runtime.cli.run, for the reason main() gives.
  _flags = define_flags()
  app.run(lambda argv: main(argv, _flags))
