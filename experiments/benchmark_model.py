r"""Forward and train-step throughput of the ViT models against timm, each side in its own process.

For each model, dtype and mode (forward; train step = forward + backward + optax update) this
prints images/s, the achieved FLOP/s, its fraction of the device's peak and, when PyTorch and
timm are importable, timm's images/s for the same architecture and the JAX/timm ratio. Every
implementation runs in a process of its own (this script re-invoked with `--process=jax|timm|
baseline`, one after the other), so neither competes with the other's threads or memory. With
`--baseline_rev` it also benchmarks `vit_jax/models/vit.py` (and `models_resnet.py`) as they are
at that git revision, so a model change is measured before/after in one run.

  # CPU defaults: the demo's model (32px, batch 128), ViT-Ti/16 (batch 32) and ViT-B/16 (batch
  # 8) at 224px, fp32:
  python -m experiments.benchmark_model
  # The CPU comparison with timm taking turns step by step (drift on a shared machine cancels):
  python -m experiments.benchmark_model --paired --repeats=16 --iters=1
  # The working tree against the last commit, timm off, forward only:
  python -m experiments.benchmark_model --baseline_rev=HEAD --timm=off --modes=forward
  # ... against another checkout of the repository:
  python -m experiments.benchmark_model --baseline_dir=../vit_jax_main --timm=off
  # A GPU or TPU (larger default batches there), bf16, timm eager and under torch.compile:
  python -m experiments.benchmark_model --models=B/16 --dtypes=bfloat16 --timm_compile
  # The same with the JAX model's attention in XLA instead of cuDNN (GPU):
  python -m experiments.benchmark_model --models=B/16 --dtypes=bfloat16 --attention_kernel=xla

`--models` takes presets or aliases (B/16, Ti/16, ...) and `demo`: experiments/demo.py's model
(the `testing` preset widened, patch 4 on 32px images, 10 classes).

Timing: in each process every (model, dtype, mode) is built, compiled and warmed up, then timed
for `--repeats` rounds of `--iters` back-to-back steps. With `--processes=N` each implementation
runs in N processes, started in turn (jax, timm, jax, timm, ...), and the median is over all their
rounds: on the 2-core machine the same step differs by up to ~8% from one process to the next,
and timed rounds within one process vary about as much, so one process per side can tilt a ratio
by that much. With `--paired` the implementations' processes are all started first and then take
turns: each round runs `--iters` steps of jax, then of each other side (reversed on odd rounds),
after `--pause` seconds of quiet, so the two sides of every round ran seconds apart, and the
ratio is the median of the rounds' ratios (printed with their interquartile range). Both sides
hold their model in memory at once. JAX steps end in `jax.block_until_ready`, torch steps in
`torch.cuda.synchronize()` on GPU. The machine should be otherwise idle: the sides run at
different times.

FLOPs: "model" FLOPs are the analytic count of the ViT's matmuls (multiply-add = 2 FLOPs; patch
embedding, QKV, QK^T, AV, output projection, MLP, head; the train step counted as 3x forward),
the convention of MFU figures and the same for JAX and timm. XLA's count, from
`jitted.lower(...).compile().cost_analysis()`, is printed alongside: it includes elementwise
work and the optimizer update, and misses FLOPs inside custom calls (cuDNN attention on GPU).
The fraction of peak uses the model FLOPs.

Peaks: dense per-chip figures from the vendors for known accelerators (`_PEAKS`). On TPU the fp32
entry is the bf16 peak (jax's default matmul precision there is one bf16 pass); on NVIDIA GPUs it
is the TF32 tensor-core peak (XLA's default precision for fp32 dots). On a CPU the peak is an
estimate, cores x FMA units x SIMD width x 2 x clock, from /proc/cpuinfo, and bf16 has the fp32
peak unless the CPU has AVX512-BF16/AMX; `--peak_tflops` overrides either.

Threads: torch gets `--torch_threads` (default: the CPUs this process may use, which is also what
XLA's CPU backend uses). `--xla_flags` is added to XLA_FLAGS before the backend starts, e.g.
`--xla_flags=--xla_cpu_multi_thread_eigen=false`.

Where the time goes (train step, 2 CPU cores, XLA's per-op profile from `jax.profiler`): before
the layout work in models_vit.py the attention's batched matmuls in the shapes autodiff produced
ran outside XLA's fast matmul path and took ~30% of the demo model's step, and the Dense layers'
weight gradients on [batch, tokens, width] activations were ~2.5x slower than the same matmul
on flattened rows. Then YNNPACK, which jax 0.10 uses for every CPU matmul, ran Ti/16's attention
backward matmuls at half the speed of XLA's own dots: vit_jax now keeps matmuls out of it
(vit_jax/kernels/xla_cpu_flags.py). LayerNorm and the tanh GELU got hand-written backward passes (fewer
fusions, no materialised broadcasts). Ablations of both sides then put the rest of the gap in the
attention core (about 74 ms per block of Ti/16's step against torch's fused CPU attention's ~41)
and in LayerNorm: on a one-device CPU both now run as C++ kernels (vit_jax/kernels/cpu.py;
`ablate_step.py --variants=full,xla_kernels` compares them with XLA's path).
On an H200 (ViT-B/16, bf16, batch 256) cuDNN's fused attention (`--attention_kernel=auto`) took
the train step from 93.5 to 74.4 ms; without any attention core it is 57.3 ms (README).

timm runs eager, and with `--timm_compile` also under torch.compile in a process of its own; on
CUDA its optimizer is torch's fused AdamW/SGD and fp32 matmuls may use TF32, as XLA's do. The
parent process starts no JAX backend, so on a GPU each measured process has the memory to itself.

PyTorch and timm are an optional extra (`--timm=auto` uses them when importable); nothing in the
package or its tests imports them.
"""

import dataclasses
import functools
import gc
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable

from absl import app, flags

# The checkout: `git show` reads --baseline_rev's files from it, and the measured processes start
# there (`python -m experiments.benchmark_model` resolves from the working directory).
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_MODELS = flags.DEFINE_list(
  "models", ["demo", "Ti/16", "B/16"], "Model presets or aliases, or 'demo' (experiments/demo.py)."
)
_BATCH_SIZES = flags.DEFINE_list(
  "batch_sizes", [], "Batch size per model (same order as --models); empty: backend defaults."
)
_DTYPES = flags.DEFINE_list("dtypes", ["float32"], "Computation dtypes.")
_MODES = flags.DEFINE_list("modes", ["forward", "train"], "forward and/or train.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 224, "Square input resolution.")
_NUM_CLASSES = flags.DEFINE_integer("num_classes", 1000, "Head width (ImageNet-1k as timm).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps per variant after compilation.")
_ITERS = flags.DEFINE_integer("iters", 3, "Back-to-back steps per timed round.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds per process.")
_PROCESSES = flags.DEFINE_integer(
  "processes",
  1,
  "Processes per implementation, started in turn (jax, timm, jax, timm, ...); the median is "
  "over every timed round of all of them.",
)
_PAIRED = flags.DEFINE_bool(
  "paired",
  False,
  "Take turns instead: one process per implementation, all alive at once, run --iters steps "
  "each in turn for --repeats rounds; ratios are medians of the rounds' ratios.",
)
_PAUSE = flags.DEFINE_float(
  "pause", 0.2, "--paired: idle seconds before each turn (the other side's threads go to sleep)."
)
_OPTIMIZER = flags.DEFINE_enum(
  "optimizer", "adamw", ["adamw", "sgd"], "Train-step optimizer (sgd = SGD with momentum 0.9)."
)
_TIMM = flags.DEFINE_enum("timm", "auto", ["auto", "on", "off"], "Benchmark timm alongside.")
_TIMM_COMPILE = flags.DEFINE_bool(
  "timm_compile", False, "Also benchmark timm under torch.compile (a process of its own)."
)
_ATTENTION_KERNEL = flags.DEFINE_enum(
  "attention_kernel",
  "auto",
  ["auto", "xla", "cudnn"],
  "The JAX model's attention core (ops.ATTENTION_KERNELS; 'auto': cuDNN on GPU for bf16).",
)
_TORCH_THREADS = flags.DEFINE_integer("torch_threads", 0, "0: the CPUs this process may use.")
_BASELINE_REV = flags.DEFINE_string(
  "baseline_rev", None, "Git revision whose models_vit.py/models_resnet.py run as 'before'."
)
_BASELINE_DIR = flags.DEFINE_string(
  "baseline_dir",
  None,
  "Instead of --baseline_rev: a tree whose vit_jax/models/vit.py and models_resnet.py run as "
  "'before'.",
)
_XLA_FLAGS = flags.DEFINE_string("xla_flags", "", "Appended to XLA_FLAGS before jax starts.")
_PEAK_TFLOPS = flags.DEFINE_float("peak_tflops", None, "Override the device peak (TFLOP/s).")
_PROCESS = flags.DEFINE_enum(
  "process",
  "all",
  ["all", "jax", "baseline", "timm", "timm_compile"],
  "all: run each implementation in its own process and compare; otherwise time only that one "
  "and print its rows as JSON (used by 'all').",
)

# Default batch sizes per backend: small enough for 2 CPU cores to finish in minutes, large
# enough on accelerators to fill the chip (single device; fits 16 GiB HBM on TPU v5e).
_DEFAULT_BATCH = {
  "cpu": {"ViT-B_16": 8, "ViT-Ti_16": 32, "demo": 128},
  "gpu": {"ViT-B_16": 256, "ViT-Ti_16": 1024, "demo": 4096},
  "tpu": {"ViT-B_16": 128, "ViT-Ti_16": 512, "demo": 4096},
}
_FALLBACK_BATCH = {"cpu": 8, "gpu": 128, "tpu": 64}

# Dense peak FLOP/s per chip (bf16, fp32) by a substring of `device.device_kind`, most specific
# first. fp32: bf16 peak on TPU (default precision = one bf16 pass), TF32 peak on NVIDIA.
_PEAKS = [
  ("TPU v6", 918e12, 918e12),  # v6e (Trillium), "TPU v6 lite".
  ("TPU v5p", 459e12, 459e12),
  ("TPU v5 lite", 197e12, 197e12),  # v5e.
  ("TPU v5e", 197e12, 197e12),
  ("TPU v5", 459e12, 459e12),  # v5p reports "TPU v5".
  ("TPU v4", 275e12, 275e12),
  ("H200", 989e12, 494.5e12),
  ("H100", 989e12, 494.5e12),  # SXM; the PCIe card is ~25% lower.
  ("A100", 312e12, 156e12),
]


# ---------------------------------------------------------------------------------------------
# Device peak and analytic FLOPs.
# ---------------------------------------------------------------------------------------------


# The /proc/cpuinfo flags that decide how fast XLA:CPU's matmuls can be, as Linux names them.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@dataclasses.dataclass
class CpuInfo:
  """What /proc/cpuinfo says of this machine's CPUs (of the first one listed, for the model)."""

  model: str | None
  flags: frozenset[str]
  mhz: list[float]  # every core's current clock

  def describe(self) -> str:
    """'AMD EPYC 7B13; avx2 fma, no avx512f avx512_bf16 amx_bf16 amx_tile'."""
    has = [f for f in CPU_FEATURES if f in self.flags]
    lacks = [f for f in CPU_FEATURES if f not in self.flags]
    features = " ".join(has) or "none of " + " ".join(CPU_FEATURES)
    if has and lacks:
      features += ", no " + " ".join(lacks)
    return f"{self.model or 'unknown model'}; {features}"


def parse_cpuinfo(text: str) -> CpuInfo:
  """The model name, flags and clocks of a /proc/cpuinfo text (x86: 'model name', 'flags')."""
  model, cpu_flags, mhz = None, set(), []
  for line in text.splitlines():
    key, sep, value = line.partition(":")
    if not sep:
      continue
    key, value = key.strip(), value.strip()
    if key == "model name" and model is None:
      model = value
    elif key == "flags":
      cpu_flags.update(value.split())
    elif key == "cpu MHz":
      mhz.append(float(value))
  return CpuInfo(model, frozenset(cpu_flags), mhz)


def read_cpuinfo(path: str = "/proc/cpuinfo") -> CpuInfo | None:
  """parse_cpuinfo of `path`; None where it cannot be read (not Linux, a sandbox)."""
  try:
    with open(path) as f:
      return parse_cpuinfo(f.read())
  except OSError:
    return None


def cpu_description(info: CpuInfo | None) -> str:
  """One line naming the CPU and its matmul features, for the header beside the figures."""
  if info is None:
    machine = platform.processor() or platform.machine() or "unknown"
    return f"{machine} (/proc/cpuinfo unreadable: model and features unknown)"
  return info.describe()


def _cpu_peak(info: CpuInfo | None = None) -> tuple[float | None, str]:
  """Estimates the fp32 peak of the CPUs this process may use from /proc/cpuinfo."""
  info = read_cpuinfo() if info is None else info
  if info is None:
    return None, "unknown (no /proc/cpuinfo)"
  if not info.mhz:
    return None, "unknown (no clock in /proc/cpuinfo)"
  if "avx512f" in info.flags:
    lanes = 16
  elif "avx2" in info.flags and "fma" in info.flags:
    lanes = 8
  else:
    return None, "unknown (no AVX2+FMA)"
  cores = len(os.sched_getaffinity(0))
  ghz = max(info.mhz) / 1e3
  # Two FMA pipes per core on every AVX2/AVX-512 server core of the last decade (Haswell+, Zen).
  peak = cores * 2 * lanes * 2 * ghz * 1e9
  isa = "AVX-512" if lanes == 16 else "AVX2"
  return peak, f"estimate: {cores} cores x 2 FMA x {lanes} fp32 lanes ({isa}) x 2 x {ghz:.2f} GHz"


def device_peak(
  platform: str, device_kind: str, dtype: str, peak_tflops: float | None = None
) -> tuple[float | None, str]:
  """Returns (peak FLOP/s or None, how it was obtained) for a device computing in `dtype`;
  `peak_tflops` (--peak_tflops) overrides it."""
  if peak_tflops:
    return peak_tflops * 1e12, "--peak_tflops"
  if platform == "cpu":
    peak, how = _cpu_peak()
    # bf16 trains slower than fp32 under XLA:CPU even on a CPU with AVX512-BF16 and AMX
    # (docs: "bf16 on a CPU"), so the fp32 peak is the bound.
    return peak, how + ("; bf16 bound by the fp32 peak" if dtype != "float32" else "")
  for key, bf16, fp32 in _PEAKS:
    if key.lower() in device_kind.lower():
      return (fp32 if dtype == "float32" else bf16), f"table: {key}"
  return None, f"unknown device kind {device_kind!r}"


def analytic_flops(config, image_size: int, num_classes: int) -> float | None:
  """Forward FLOPs of one image through a plain ViT (None for ResNet hybrids)."""
  if config.resnet is not None:
    return None
  p, d, m, layers = config.patch_size, config.hidden_size, config.mlp_dim, config.num_layers
  n = (image_size // p) ** 2
  t = n + (1 if config.classifier == "token" else 0)
  per_layer = 2 * t * d * 3 * d + 2 * 2 * t * t * d + 2 * t * d * d + 2 * 2 * t * d * m
  flops = 2 * n * p * p * 3 * d + layers * per_layer
  rep = config.representation_size
  if rep:
    flops += 2 * d * rep
  return flops + 2 * (rep or d) * num_classes


# ---------------------------------------------------------------------------------------------
# JAX variants.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Runner:
  """One benchmarked variant: `run(n)` performs n steps and waits for them."""

  name: str
  run: Callable[[int], None]
  xla_flops: float | None = None  # per step, from XLA's cost analysis
  times: list[float] = dataclasses.field(default_factory=list)


def _baseline_label() -> str | None:
  """The baseline's name in the rows: 'jax@<rev>' or 'jax@<folder name>' (None: no baseline)."""
  if _BASELINE_DIR.value:
    return "jax@" + os.path.basename(os.path.normpath(_BASELINE_DIR.value))
  return "jax@" + _BASELINE_REV.value if _BASELINE_REV.value else None


def _load_baseline_module(rev: str | None = None, tree: str | None = None) -> types.ModuleType:
  """Imports models_vit.py as of git revision `rev` of this checkout, or from the tree `tree`,
  using models_resnet.py of the same revision or tree."""

  def load(path, name):
    if tree is not None:
      origin = os.path.join(tree, path)
      with open(origin) as f:
        src = f.read()
    else:
      origin = f"{rev}:{path}"
      src = subprocess.run(
        ["git", "-C", _REPO, "show", origin], check=True, capture_output=True, text=True
      ).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(src, origin, "exec"), module.__dict__)  # noqa: S102
    return module

  resnet = load("vit_jax/models/resnet.py", "_baseline_models_resnet")
  vit = load("vit_jax/models/vit.py", "_baseline_models_vit")
  vit.models_resnet = resnet  # Resolved at call time, so the baseline uses its own ResNet.
  return vit


def _cost_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001 - some backends do not implement it.
    return None
  if isinstance(cost, list | tuple):
    cost = cost[0] if cost else None
  return float(cost["flops"]) if cost and "flops" in cost else None


def train_step_fn(module, tx):
  """(params, opt_state, images, labels) -> (params, opt_state, loss): softmax cross-entropy,
  gradients, one update of the optax transformation `tx`."""
  import jax
  import optax

  def train_step(params, opt_state, images, labels):
    def loss_fn(params):
      logits = module.apply({"params": params}, images, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return train_step


def jax_runner(name, module, batch, mode, image_size, num_classes, seed=0) -> Runner:
  """Builds, compiles and warms up the JAX forward or train step of `module`."""
  import jax
  import jax.numpy as jnp
  import optax

  rng = jax.random.key(seed)
  images = jax.random.uniform(rng, (batch, image_size, image_size, 3), jnp.float32, -1, 1)
  labels = jax.random.randint(rng, (batch,), 0, num_classes)
  params = jax.jit(lambda: module.init(rng, images[:1], train=False)["params"])()

  if mode == "forward":

    @jax.jit
    def forward(params, images):
      return module.apply({"params": params}, images, train=False)

    compiled = forward.lower(params, images).compile()

    def run(n):
      out = None
      for _ in range(n):
        out = compiled(params, images)
      jax.block_until_ready(out)

  else:
    if _OPTIMIZER.value == "adamw":
      tx = optax.adamw(1e-4, weight_decay=0.05)
    else:
      tx = optax.sgd(1e-3, momentum=0.9)
    opt_state = jax.jit(tx.init)(params)

    step = jax.jit(train_step_fn(module, tx), donate_argnums=(0, 1))
    compiled = step.lower(params, opt_state, images, labels).compile()
    state = [params, opt_state]

    def run(n):
      loss = None
      for _ in range(n):
        state[0], state[1], loss = compiled(state[0], state[1], images, labels)
      jax.block_until_ready((state, loss))

  runner = Runner(name, run, _cost_flops(compiled))
  run(_WARMUP.value)
  return runner


# ---------------------------------------------------------------------------------------------
# timm variant.
# ---------------------------------------------------------------------------------------------


def timm_runner(config, batch, mode, dtype, image_size, num_classes, compiled=False) -> Runner:
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

  def sync():
    if device.type == "cuda":
      torch.cuda.synchronize()

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
    if _OPTIMIZER.value == "adamw":
      opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=fused)
    else:
      opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, fused=fused)

    def run(n):
      for _ in range(n):
        with autocast():
          loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
      sync()

  run(_WARMUP.value)
  return Runner("timm_compile" if compiled else "timm", run)


# ---------------------------------------------------------------------------------------------
# Main.
# ---------------------------------------------------------------------------------------------


def _want_timm() -> bool:
  if _TIMM.value == "off":
    return False
  try:
    import timm  # noqa: F401
    import torch  # noqa: F401
  except ImportError:
    if _TIMM.value == "on":
      raise
    return False
  return True


def demo_model_config():
  """experiments/demo.py's model: the `testing` preset widened (32px images, 10 classes)."""
  from experiments import demo
  from vit_jax import models

  config = models.get_model_config("testing")
  config.update(demo.MODEL)
  return config


def _model(name: str):
  """(name, model config, image size, classes) of a --models entry."""
  from vit_jax import models

  if name == "demo":
    return "demo", demo_model_config(), 32, 10
  name = models.resolve_name(name)
  return name, models.get_model_config(name), _IMAGE_SIZE.value, _NUM_CLASSES.value


def _time(runner: Runner) -> None:
  for _ in range(_REPEATS.value):
    t0 = time.perf_counter()
    runner.run(_ITERS.value)
    runner.times.append((time.perf_counter() - t0) / _ITERS.value)


def _variants(impl: str) -> list[tuple[dict, Callable[[], Runner]]]:
  """(row fields, build) for every (model, dtype, mode) of one implementation, in this process;
  `build()` constructs, compiles and warms up that variant's Runner."""
  from vit_jax import models

  baseline = (
    _load_baseline_module(_BASELINE_REV.value, _BASELINE_DIR.value) if impl == "baseline" else None
  )
  device = None
  if impl.startswith("timm"):
    import timm
    import torch

    # No JAX backend in this process: on a GPU it would take most of the memory torch needs.
    backend = "gpu" if torch.cuda.is_available() else "cpu"

    cpus = len(os.sched_getaffinity(0))
    torch.set_num_threads(_TORCH_THREADS.value or cpus)
    # fp32 matmuls in TF32 on NVIDIA GPUs, as XLA's default precision does on the JAX side.
    torch.set_float32_matmul_precision("high")
    print(
      f"  torch {torch.__version__}, timm {timm.__version__}, {torch.get_num_threads()} threads",
      flush=True,
    )
  else:
    import jax

    device = jax.devices()[0]
    print(f"  jax {jax.__version__} on {device.device_kind} ({device.platform})", flush=True)
    backend = device.platform

  def build(config, batch, dtype, mode, image_size, num_classes) -> Runner:
    if impl.startswith("timm"):
      return timm_runner(
        config, batch, mode, dtype, image_size, num_classes, impl == "timm_compile"
      )
    module = models.get_model(
      config, num_classes, dtype=dtype, attention_kernel=_ATTENTION_KERNEL.value
    )
    if baseline is not None:
      # The fields the baseline's VisionTransformer has (older revisions have fewer).
      known = {f.name for f in dataclasses.fields(baseline.VisionTransformer)}
      fields = {
        f.name: getattr(module, f.name)
        for f in dataclasses.fields(module)
        if f.name not in ("parent", "name") and f.name in known
      }
      module = baseline.VisionTransformer(**fields)
    return jax_runner(impl, module, batch, mode, image_size, num_classes)

  variants = []
  for i, entry in enumerate(_MODELS.value):
    name, config, image_size, num_classes = _model(entry)
    if _BATCH_SIZES.value:
      batch = int(_BATCH_SIZES.value[i])
    else:
      batch = _DEFAULT_BATCH.get(backend, {}).get(name, _FALLBACK_BATCH.get(backend, 8))
    if impl.startswith("timm") and config.resnet is not None:
      continue
    for dtype in _DTYPES.value:
      for mode in _MODES.value:
        fields = dict(
          model=name,
          batch=batch,
          dtype=dtype,
          mode=mode,
          image_size=image_size,
          num_classes=num_classes,
          impl=impl if impl != "baseline" else _baseline_label(),
          device=None if device is None else [device.platform, device.device_kind],
        )
        args = (config, batch, dtype, mode, image_size, num_classes)
        variants.append((fields, functools.partial(build, *args)))
  return variants


def _rounds(times: list[float]) -> str:
  """Every timed round, in order (a drifting machine shows as a trend; paired rounds line up)."""
  return "rounds (ms): " + " ".join(f"{t * 1e3:.6g}" for t in times)


def _measure(impl: str) -> list[dict]:
  """Times every (model, dtype, mode) with one implementation, in this process."""
  results = []
  for fields, build in _variants(impl):
    runner = build()
    _time(runner)
    results.append(dict(fields, times=runner.times, xla_flops=runner.xla_flops))
    print(
      f"  {fields['model']} {fields['dtype']} {fields['mode']}: "
      f"{fields['batch'] / statistics.median(runner.times):.2f} img/s; {_rounds(runner.times)}"
    )
  return results


def _serve(impl: str) -> None:
  """--paired's measured side: announces its variants, then obeys the parent's commands on
  stdin, one per line: `build I` (variant I becomes the current one; the previous one is
  dropped) and `run` (one timed round of the current variant: --iters steps). Each answer is one
  _JSON_MARK line on stdout."""

  def answer(value):
    print(_JSON_MARK + json.dumps(value), flush=True)

  variants = _variants(impl)
  answer([fields for fields, _ in variants])
  runner = None
  for line in sys.stdin:
    command, *args = line.split()
    if command == "build":
      runner = None
      gc.collect()
      runner = variants[int(args[0])][1]()
      answer({"xla_flops": runner.xla_flops})
    elif command == "run":
      t0 = time.perf_counter()
      runner.run(_ITERS.value)
      answer((time.perf_counter() - t0) / _ITERS.value)
    else:
      raise ValueError(f"unknown command {line.strip()!r}")


def _process_args(impl: str) -> list[str]:
  """The command line that re-invokes this script as the process of one implementation."""
  flag_names = (
    "models batch_sizes dtypes modes image_size num_classes warmup iters repeats optimizer "
    "torch_threads baseline_rev baseline_dir attention_kernel"
  ).split()
  args = [sys.executable, "-m", "experiments.benchmark_model", f"--process={impl}"]
  for flag in flag_names:
    value = flags.FLAGS[flag].value
    if value is not None:
      args.append(f"--{flag}={','.join(value) if isinstance(value, list) else value}")
  return args


def _run_process(impl: str) -> list[dict]:
  """Re-invokes this script with --process=impl; returns its rows."""
  print(f"\n== {impl} (own process)", flush=True)
  proc = subprocess.run(_process_args(impl), stdout=subprocess.PIPE, text=True, cwd=_REPO)
  if proc.returncode:
    # One side failing (a missing kernel, out of memory) leaves the others' figures standing.
    print(f"  {impl} failed (exit status {proc.returncode}); its stderr is above", flush=True)
  rows = []
  for line in proc.stdout.splitlines():
    if line.startswith(_JSON_MARK):
      rows.extend(json.loads(line[len(_JSON_MARK) :]))
    else:
      print(line, flush=True)
  return rows


class _Side:
  """One implementation's process in --paired mode (this script with --process=impl --paired)."""

  def __init__(self, impl: str):
    self.impl = impl
    # Both sides hold their model at once: on a GPU JAX must not take most of the memory.
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    self.proc = subprocess.Popen(
      _process_args(impl) + ["--paired"],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
      env=env,
      cwd=_REPO,
    )
    self.variants = self._answer()

  def _answer(self):
    for line in self.proc.stdout:
      if line.startswith(_JSON_MARK):
        return json.loads(line[len(_JSON_MARK) :])
      print(line, end="", flush=True)
    raise RuntimeError(f"{self.impl} failed (exit status {self.proc.wait()}); its stderr is above")

  def ask(self, command: str):
    self.proc.stdin.write(command + "\n")
    self.proc.stdin.flush()
    return self._answer()

  def close(self) -> None:
    self.proc.stdin.close()
    self.proc.wait()


def _paired(impls: list[str]) -> dict[str, list[dict]]:
  """Rows of every implementation, timed in turns: one process per implementation stays alive,
  and for each variant round r runs --iters steps of jax, then of each other side (reversed on
  odd rounds), with --pause seconds of quiet before each turn. So the two sides of a ratio are
  timed seconds apart, never at once, and a machine whose speed drifts tilts neither."""
  sides = {}
  for impl in impls:
    print(f"\n== {impl} (own process, taking turns)", flush=True)
    try:
      sides[impl] = _Side(impl)
    except RuntimeError as e:
      print(f"  {e}", flush=True)  # the others' figures still stand
  measured = {impl: [] for impl in impls}
  if "jax" not in sides:
    return measured
  for fields in sides["jax"].variants:
    rows = {}
    for impl, side in list(sides.items()):
      index = [i for i, f in enumerate(side.variants) if _variant(f) == _variant(fields)]
      if not index:
        continue  # timm has no R50+ViT hybrid
      try:
        built = side.ask(f"build {index[0]}")
      except RuntimeError as e:
        print(f"  {e}", flush=True)
        del sides[impl]
        continue
      rows[impl] = dict(side.variants[index[0]], times=[], xla_flops=built["xla_flops"])
    order = list(rows)
    for r in range(_REPEATS.value):
      for impl in order if r % 2 == 0 else order[::-1]:
        time.sleep(_PAUSE.value)
        rows[impl]["times"].append(sides[impl].ask("run"))
    for impl, row in rows.items():
      measured[impl].append(row)
      print(
        f"  {impl} {row['model']} {row['dtype']} {row['mode']}: "
        f"{row['batch'] / statistics.median(row['times']):.2f} img/s; {_rounds(row['times'])}",
        flush=True,
      )
  for side in sides.values():
    side.close()
  return measured


_JSON_MARK = "BENCHMARK_ROWS "


def _variant(row: dict) -> tuple:
  """What makes two rows the same measurement: (model, batch, dtype, mode)."""
  return tuple(row[k] for k in ("model", "batch", "dtype", "mode"))


def _merge_rounds(rows: list[dict], new_rows: list[dict]) -> None:
  """Adds another process's rows to `rows`: the timed rounds of the same variant are pooled."""
  for new in new_rows:
    same = [r for r in rows if _variant(r) == _variant(new)]
    if same:
      same[0]["times"] = same[0]["times"] + new["times"]
    else:
      rows.append(dict(new))


def main(argv):
  del argv
  if _BASELINE_REV.value and _BASELINE_DIR.value:
    raise app.UsageError("--baseline_rev and --baseline_dir: one baseline at a time")
  if _BASELINE_DIR.value:
    # The measured processes start in the repository root: a relative path is from here.
    flags.FLAGS.baseline_dir = os.path.abspath(_BASELINE_DIR.value)
  if _XLA_FLAGS.value:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _XLA_FLAGS.value).strip()
  import vit_jax  # noqa: F401, PLC0415 (adds its XLA:CPU defaults to XLA_FLAGS: xla_cpu_flags)

  if _PROCESS.value != "all" and _PAIRED.value:
    _serve(_PROCESS.value)
    return
  if _PROCESS.value != "all":
    rows = _measure(_PROCESS.value)
    print(_JSON_MARK + json.dumps(rows), flush=True)
    return
  # This process starts no JAX backend (on a GPU it would hold memory the measured processes
  # need); the JAX processes report their device in their rows.
  cpus = len(os.sched_getaffinity(0))
  print(f"{cpus} CPUs: {cpu_description(read_cpuinfo())}")
  print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
  if _PAIRED.value:
    how = (
      f"{_REPEATS.value} rounds, each {_ITERS.value} steps per implementation in turn in its own "
      f"process ({_PAUSE.value} s pause before each turn); ratio: median of the rounds' ratios"
    )
  else:
    how = (
      f"{_REPEATS.value} rounds x {_ITERS.value} steps in each of {_PROCESSES.value} "
      "process(es) per implementation, started in turn (median round)"
    )
  print(
    f"JAX attention_kernel {_ATTENTION_KERNEL.value}, optimizer {_OPTIMIZER.value}, "
    f"warmup {_WARMUP.value}, {how}"
  )
  timm = ["timm"] + (["timm_compile"] if _TIMM_COMPILE.value else []) if _want_timm() else []
  impls = ["jax"] + (["baseline"] if _baseline_label() else []) + timm
  if _PAIRED.value:
    measured = _paired(impls)
  else:
    measured = {impl: [] for impl in impls}
    for _ in range(_PROCESSES.value):
      for impl in impls:
        _merge_rounds(measured[impl], _run_process(impl))
  rows = []
  for ref in measured["jax"]:
    group = [ref] + [
      r for impl in impls[1:] for r in measured[impl] if _variant(r) == _variant(ref)
    ]
    name, config, image_size, num_classes = _model(ref["model"])
    fwd_flops = analytic_flops(config, image_size, num_classes)
    peak, peak_how = device_peak(*ref["device"], ref["dtype"], _PEAK_TFLOPS.value)
    batch, mode = ref["batch"], ref["mode"]
    model_flops = fwd_flops * batch * (3 if mode == "train" else 1) if fwd_flops else None
    for r in group:
      step_s = statistics.median(r["times"])
      row = dict(
        model=name,
        batch=batch,
        dtype=ref["dtype"],
        mode=mode,
        impl=r["impl"],
        img_s=batch / step_s,
        step_ms=step_s * 1e3,
        spread=(max(r["times"]) - min(r["times"])) / step_s,
        best_img_s=batch / min(r["times"]),
        tflops=model_flops / step_s / 1e12 if model_flops else None,
        xla_tflops=r["xla_flops"] / step_s / 1e12 if r["xla_flops"] else None,
        peak=model_flops / step_s / peak if model_flops and peak else None,
        vs=ratio(r["times"], ref["times"], _PAIRED.value) if r is not ref else None,
        vs_quartiles=(
          ratio_quartiles(r["times"], ref["times"]) if r is not ref and _PAIRED.value else None
        ),
        vs_best=(min(r["times"]) / min(ref["times"])) if r is not ref else None,
      )
      rows.append(row)
      _print_row(row, header=len(rows) == 1)
    print(f"  peak {peak / 1e12:.3g} TFLOP/s ({peak_how})" if peak else f"  peak {peak_how}")
  _print_summary(rows)


def ratio(times: list[float], ref_times: list[float], paired: bool) -> float:
  """How many times faster `ref` (JAX) ran than `times`' side: paired (round i of both sides
  timed seconds apart), the median of the rounds' ratios; otherwise the ratio of the medians."""
  if paired:
    return statistics.median(t / r for t, r in zip(times, ref_times, strict=True))
  return statistics.median(times) / statistics.median(ref_times)


def ratio_quartiles(times: list[float], ref_times: list[float]) -> tuple[float, float] | None:
  """The first and third quartiles of paired rounds' ratios (None for fewer than two rounds)."""
  if len(times) < 2:
    return None
  q = statistics.quantiles([t / r for t, r in zip(times, ref_times, strict=True)], n=4)
  return q[0], q[2]


def _fmt(x, spec, missing="-"):
  return missing if x is None else format(x, spec)


def _print_row(row, header=False):
  if header:
    print(
      f"{'model':10} {'batch':>5} {'dtype':8} {'mode':7} {'impl':12} {'img/s':>8} {'ms/step':>9}"
      f" {'spread':>6} {'best':>8} {'TFLOP/s':>7} {'XLA':>6} {'%peak':>6} {'jax/this':>8}"
    )
  print(
    f"{row['model']:10} {row['batch']:5d} {row['dtype']:8} {row['mode']:7} {row['impl']:12}"
    f" {row['img_s']:8.2f} {row['step_ms']:9.1f} {row['spread']:6.1%} {row['best_img_s']:8.2f}"
    f" {_fmt(row['tflops'], '7.3f')} {_fmt(row['xla_tflops'], '6.3f')}"
    f" {_fmt(row['peak'] and 100 * row['peak'], '6.1f')} {_fmt(row['vs'], '8.3f')}",
    flush=True,
  )


def _print_summary(rows):
  """One line per (model, dtype, mode): JAX images/s and its ratio to each other variant."""
  print(
    "\nSummary: images/s of the median round (of the best round); ratio = JAX's over the"
    " other's, >1 means JAX is faster"
    + ("; --paired: median of the rounds' ratios" if _PAIRED.value else "")
  )
  keys = []
  for r in rows:
    k = _variant(r)
    if k not in keys:
      keys.append(k)
  for k in keys:
    group = [r for r in rows if _variant(r) == k]
    parts = [f"{group[0]['impl']} {group[0]['img_s']:.2f} ({group[0]['best_img_s']:.2f})"]
    for r in group[1:]:
      if r["vs_quartiles"]:
        detail = "rounds' ratios IQR {:.3f}-{:.3f}".format(*r["vs_quartiles"])
      else:
        detail = f"x{r['vs_best']:.3f}"
      parts.append(
        f"{r['impl']} {r['img_s']:.2f} ({r['best_img_s']:.2f}) ratio x{r['vs']:.3f} ({detail})"
      )
    print(f"  {k[0]} b{k[1]} {k[2]:8} {k[3]:7}: " + ", ".join(parts))


if __name__ == "__main__":
  app.run(main)
