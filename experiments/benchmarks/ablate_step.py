r"""Where a ViT step's time goes: the step with one part removed or swapped, all in one process.

Each variant replaces one function of `vit_jax/models/ops.py` while the step is traced (the
attention core `ops.attention`, `ops.layer_norm` or `ops.gelu_tanh` by the identity; or their
hand-written backward passes by plain autodiff of the same forward), and is compiled next to the
unchanged step. Timed rounds then alternate between the variants, so a machine whose speed drifts
(2 CPU cores: ±10% from round to round) tilts none of them. The difference to `full` is what that
part costs inside the compiled step, fusions with its neighbours included, which per-op profiles
on XLA:CPU do not show (its dot events time only the dispatch).

  # ViT-Ti/16 train step (forward + backward + AdamW) on the CPU, batch 32, fp32:
  python -m experiments.benchmarks.ablate_step --model=Ti/16 --batch=32
  # On a GPU: ViT-B/16, bf16, cuDNN attention against the XLA path:
  python -m experiments.benchmarks.ablate_step --model=B/16 --batch=256 --dtype=bfloat16 \
      --variants=full,xla_attention,autodiff_attention,no_attention

`--model=demo` is the demo's model (the 'demo' preset: 32px, 10 classes).

Variants: full, no_attention (the attention core returns V), no_layernorm, no_gelu,
xla_attention (attention_kernel='xla': on a one-device CPU, XLA instead of the C++ kernel of
vit_jax/kernels/cpu.py), xla_layer_norm (likewise layer_norm_kernel='xla'), xla_kernels (both),
autodiff_attention (the XLA path without `ops.attention`'s hand-written backward), autodiff_norms
(`ops.layer_norm` and `ops.gelu_tanh` without theirs). The variants that replace `ops.attention`
or `ops.layer_norm` run that part on the XLA path. A removed part also changes the loss, so the
numbers are costs, not a model anyone would train.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import dataclasses
import statistics
import time
import types
from collections.abc import Callable

from absl import flags

from experiments import common
from vit_jax.runtime import cli


def _plain_attention(q, k, v):
  import jax.numpy as jnp

  from vit_jax.models import ops

  return jnp.einsum("bhqk,bhkd->bhqd", ops.attention_weights(q, k), v)


def _plain_layer_norm(x, scale, bias):
  from vit_jax.models import ops

  return ops.layer_norm_forward(x, scale, bias)[0]


def _plain_gelu(x):
  import flax.linen as nn

  return nn.gelu(x, approximate=True)


@dataclasses.dataclass(frozen=True)
class Variant:
  """vit_jax.models.ops functions to replace while tracing, and model field overrides."""

  patches: dict[str, Callable]
  overrides: dict[str, str]


_XLA_ATTENTION = {"attention_kernel": "xla"}
_XLA_LAYER_NORM = {"layer_norm_kernel": "xla"}
VARIANTS = {
  "full": Variant({}, {}),
  "no_attention": Variant({"attention": lambda q, k, v: v}, _XLA_ATTENTION),
  "no_layernorm": Variant({"layer_norm": lambda x, scale, bias: x}, _XLA_LAYER_NORM),
  "no_gelu": Variant({"gelu_tanh": lambda x: x}, {}),
  "xla_attention": Variant({}, _XLA_ATTENTION),
  "xla_layer_norm": Variant({}, _XLA_LAYER_NORM),
  "xla_kernels": Variant({}, {**_XLA_ATTENTION, **_XLA_LAYER_NORM}),
  "autodiff_attention": Variant({"attention": _plain_attention}, _XLA_ATTENTION),
  "autodiff_norms": Variant(
    {"layer_norm": _plain_layer_norm, "gelu_tanh": _plain_gelu}, _XLA_LAYER_NORM
  ),
}


def model_config(name: str):
  """The model ConfigDict of a preset or alias ('demo': the demo's ViT)."""
  from vit_jax import models

  return models.get_model_config(name)


def compile_step(model_name, variant, batch, dtype, mode, image_size, num_classes):
  """Returns (run: () -> loss or logits, first output) for one variant, compiled and warm."""
  import jax
  import jax.numpy as jnp
  import optax

  from vit_jax import models
  from vit_jax.models import ops

  saved = {name: getattr(ops, name) for name in variant.patches}
  try:
    for name, fn in variant.patches.items():
      setattr(ops, name, fn)
    config = model_config(model_name)
    model = models.get_model(config, num_classes, dtype=dtype, **variant.overrides)
    rng = jax.random.key(0)
    images = jax.random.uniform(rng, (batch, image_size, image_size, 3), jnp.float32, -1, 1)
    labels = jax.random.randint(rng, (batch,), 0, num_classes)
    params = jax.jit(lambda: model.init(rng, images[:1], train=False)["params"])()
    # Noise on every parameter (the head starts at zero), so the output depends on every part.
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(rng, len(leaves))
    leaves = [
      p + 0.1 * jax.random.normal(k, p.shape, p.dtype) for p, k in zip(leaves, keys, strict=True)
    ]
    params = jax.tree.unflatten(treedef, leaves)
    if mode == "forward":
      forward = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False)[0])
      compiled = forward.lower(params, images).compile()

      def run():
        return jax.block_until_ready(compiled(params, images))

      return run, run()
    tx = optax.adamw(1e-4, weight_decay=0.05)
    state = [params, jax.jit(tx.init)(params)]
    step = jax.jit(common.train_step_fn(model, tx))
    compiled = step.lower(state[0], state[1], images, labels).compile()
  finally:
    for name, fn in saved.items():
      setattr(ops, name, fn)

  def run():
    # The same parameters every time (not donated), so each round does the same work.
    return jax.block_until_ready(compiled(state[0], state[1], images, labels)[2])

  return run, run()


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    model=flags.DEFINE_string(
      "model", "Ti/16", "Model preset or alias, or 'demo' (32px, 10 classes).", flag_values=values
    ),
    batch=flags.DEFINE_integer("batch", 32, "Batch size.", flag_values=values),
    dtype=flags.DEFINE_enum(
      "dtype", "float32", ["float32", "bfloat16"], "Computation dtype.", flag_values=values
    ),
    mode=flags.DEFINE_enum(
      "mode",
      "train",
      ["train", "forward"],
      "The train step or the forward pass.",
      flag_values=values,
    ),
    image_size=flags.DEFINE_integer(
      "image_size", None, "Default 224 (demo: 32).", flag_values=values
    ),
    num_classes=flags.DEFINE_integer(
      "num_classes", None, "Default 1000 (demo: 10).", flag_values=values
    ),
    variants=flags.DEFINE_string(
      "variants",
      "full,no_attention,no_layernorm,no_gelu",
      f"Comma-separated, from {sorted(VARIANTS)}; 'full' is always added first.",
      flag_values=values,
    ),
    rounds=flags.DEFINE_integer("rounds", 6, "Timed rounds per variant.", flag_values=values),
    iters=flags.DEFINE_integer("iters", 1, "Steps per timed round.", flag_values=values),
  )


def main(argv: list[str], f: types.SimpleNamespace) -> None:
  args = cli.values(f)
  demo_model = args.model == "demo"
  args.image_size = args.image_size or (32 if demo_model else 224)
  args.num_classes = args.num_classes or (10 if demo_model else 1000)
  names = ["full"] + [v for v in args.variants.split(",") if v and v != "full"]
  unknown = [v for v in names if v not in VARIANTS]
  if unknown:
    raise ValueError(f"unknown variant(s) {unknown}; known: {sorted(VARIANTS)}")

  import jax

  from vit_jax import models
  from vit_jax.cost import devices, flops

  device = jax.devices()[0]
  model = models.get_model(model_config(args.model), args.num_classes, dtype=args.dtype)
  passes = flops.TRAIN_PASSES if args.mode == "train" else 1
  model_flops = flops.forward_flops(model, (args.image_size, args.image_size)) * args.batch * passes
  peak, peak_how = devices.device_peak(device.platform, device.device_kind, args.dtype)
  print(
    f"{args.model} {args.mode}, batch {args.batch}, {args.dtype}, jax {jax.__version__} on "
    f"{device.device_kind}; {args.rounds} alternating rounds of {args.iters} step(s)",
    flush=True,
  )
  if device.platform == "cpu":
    print(f"  CPU: {devices.cpu_description(devices.read_cpuinfo())}", flush=True)
  runs = {}
  for name in names:
    t0 = time.perf_counter()
    runs[name], out = compile_step(
      args.model, VARIANTS[name], args.batch, args.dtype, args.mode, args.image_size,
      args.num_classes,
    )  # fmt: skip
    first = float(out.ravel()[0])
    print(f"  compiled {name} in {time.perf_counter() - t0:.0f} s (first output {first:.6f})")
  times = {name: [] for name in names}
  for _ in range(args.rounds):
    for name in names:
      t0 = time.perf_counter()
      for _ in range(args.iters):
        runs[name]()
      times[name].append((time.perf_counter() - t0) / args.iters)
  full = statistics.median(times["full"])
  print(f"{'variant':20} {'ms/step':>9} {'min':>9} {'img/s':>9} {'vs full':>9} {'MFU':>6}")
  for name in names:
    step = statistics.median(times[name])
    mfu = f"{100 * model_flops / step / peak:5.1f}%" if peak else "     -"
    print(
      f"{name:20} {step * 1e3:9.1f} {min(times[name]) * 1e3:9.1f} {args.batch / step:9.1f}"
      f" {(step - full) * 1e3:+9.1f} {mfu}"
    )
  print(f"MFU: the model's matmul FLOPs of the full step over the peak ({peak_how})")


if __name__ == "__main__":
  cli.run(main, "experiments.benchmarks.ablate_step", define_flags, errors=(ValueError,))
