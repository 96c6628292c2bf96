r"""Will it fit on the pod? Compiles the trainer's own train step for a TPU topology, on any machine.

  python -m vit_jax.tools.plan --config=configs/pretrain.py:dataset=jft,model=H/14 \
      --topology=v3:16x16 [--config.model.remat=True ...] [--search] [--json]

With libtpu installed, `jax.experimental.topologies` describes the devices of a TPU slice without
the hardware; the step that `vit_jax.train.build` returns is lowered on ShapeDtypeStructs
carrying the trainer's NamedShardings and compiled by the TPU compiler. It prints the compiler's
memory, FLOPs, implied step time and MFU and the collectives per device, and proposes settings
that would fit (`--search` compiles them). With `--slices=N` it compiles for N slices (Multislice)
and adds the bytes each device sends over the data-centre network. What it prints and what that
proves: docs/pod_planning.md. Bad input ends in one line, `plan: error: <Kind>: <message>`.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.quiet_libtpu()  # before JAX loads: the planner needs no local accelerator
  process.configure()

import dataclasses
import importlib.util
import json
import math
import os
import re
import time
from collections.abc import Sequence
from typing import Any

from absl import logging

from vit_jax.runtime import cli, libtpu_lock

GiB = 2**30
# Cloud TPU v5e's per-host NIC configuration, 2 x 100 Gbps (docs.cloud.google.com/tpu/docs/v5e:
# "Per-host NIC configuration"; its "data center network bandwidth per Pod", 6.4 Tbps over the
# 32 hosts of a v5e:16x16, is the same). Other generations: pass --dcn_gbps.
DCN_GBPS_PER_HOST = 200.0
HEADROOM = 0.9  # what the suggestions aim for, and search prefers: a tenth of the HBM left free
# The head width of datasets whose class count is not readable without the data.
KNOWN_NUM_CLASSES = {
  "jft": 18_291,
  "imagenet21k": 21_843,
  "imagenet2012": 1_000,
  "cifar10": 10,
  "coco": 80,
}
_TOPOLOGY_RE = re.compile(r"^(v2|v3|v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")


def install_hint() -> str:
  import jax  # noqa: PLC0415

  return (
    f'libtpu is not installed: pip install -e ".[tpu]" (or pip install "jax[tpu]=={jax.__version__}"'
    "), about 700 MB; it compiles for TPU topologies on any Linux x86-64 machine"
  )


def libtpu_available() -> bool:
  return importlib.util.find_spec("libtpu") is not None


def quiet_libtpu(topology: str | None = None) -> None:
  """Environment for libtpu on a machine without a TPU (set only where the user has not):
  JAX_PLATFORMS=cpu (vit_jax.runtime.process.quiet_libtpu), and TPU_ACCELERATOR_TYPE, which
  libtpu would otherwise ask the TPU VM metadata server for (with a warning). A library caller
  calls it before it imports JAX."""
  from vit_jax.runtime import process

  process.quiet_libtpu()
  if topology and _TOPOLOGY_RE.match(topology):
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator_type(topology))


def accelerator_type(topology: str) -> str:
  """'v3:16x16' → 'v3-512' (Cloud TPU's name: cores for v2-v5p, chips for v5e and v6e)."""
  generation, dims = parse_topology(topology)
  chips = math.prod(dims)
  if generation in ("v5e", "v6e"):
    return f"{'v5litepod' if generation == 'v5e' else 'v6e'}-{chips}"
  return f"{generation}-{chips * 2}"


def parse_topology(topology: str) -> tuple[str, tuple[int, ...]]:
  m = _TOPOLOGY_RE.match(topology or "")
  if not m:
    raise ValueError(
      f"--topology={topology!r}: expected <generation>:<AxB or AxBxC>, generation one of v2, v3, "
      "v4, v5e, v5p, v6e (e.g. v3:16x16, v4:4x4x4)"
    )
  return m.group(1), tuple(int(d) for d in m.group(2).split("x"))


def topology_devices(topology: str, slices: int = 1) -> list[Any]:
  """The devices of `slices` TPU slices of `topology`, from libtpu's description (no TPU needed);
  with several, each device's `slice_index` says its slice."""
  generation, _ = parse_topology(topology)
  if not libtpu_available():
    raise RuntimeError(install_hint())
  quiet_libtpu(topology)
  # v4 and v5p are used as one device per chip (megacore), as Cloud TPU VMs run them.
  chip_config = "megacore" if generation in ("v4", "v5p") else "default"
  if slices < 1:
    raise ValueError(f"--slices={slices}: expected a positive number of slices")
  kwargs = dict(num_slices=slices) if slices > 1 else {}
  # Without libtpu's one-process lock where there is no TPU (vit_jax.runtime.libtpu_lock).
  return list(libtpu_lock.topology_desc(topology, chip_config_name=chip_config, **kwargs).devices)


def abstract_batch(config, mesh, num_classes: int) -> dict[str, Any]:
  """ShapeDtypeStructs of a global training batch, as vit_jax.input_pipeline yields it.

  {'image': f32 [B, H, W, 3], 'label': i32 [B] | f32 [B, K] (multi-label) | f32 [B, M, 6] (the
  detect stage's boxes, M = dataset.max_boxes), 'mask': f32 [B]}, each sharded over the batch
  axes (mixup happens inside the step).
  """
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  from vit_jax import sharding  # noqa: PLC0415

  size = config.dataset.image_size
  height, width = (size, size) if isinstance(size, int) else tuple(size)
  batch = int(config.batch_size)
  if config.stage == "detect":
    label = ((batch, int(config.dataset.max_boxes), 6), jnp.float32)
  elif config.dataset.multi_label:
    label = ((batch, num_classes), jnp.float32)
  else:
    label = ((batch,), jnp.int32)
  shapes = dict(
    image=((batch, height, width, 3), jnp.float32), label=label, mask=((batch,), jnp.float32)
  )
  return {
    k: jax.ShapeDtypeStruct(s, d, sharding=sharding.batch_sharding(mesh, len(s)))
    for k, (s, d) in shapes.items()
  }


@dataclasses.dataclass
class Plan:
  """The compiled step of one config on one topology, per device (see compiled_stats)."""

  topology: str
  device_kind: str
  num_devices: int
  mesh: dict[str, int]
  settings: dict[str, Any]  # batch_size, per_device_batch, accum_steps, remat, scan
  stats: Any  # compiled_stats.StepStats
  hbm: int | None
  peak_flops: float | None
  model_flops: float  # per device per step, no recomputation
  efficiency: float
  compile_seconds: float
  refused: str = ""  # the compiler's error when it refused the step for lack of memory
  slices: int = 1
  slice_axis: str = "data"  # the mesh axis whose outer factor crosses the slices
  devices_per_host: int = 1
  dcn_gbps: float = DCN_GBPS_PER_HOST  # per host

  @property
  def dcn_seconds(self) -> float | None:
    """The time a step's DCN bytes take at `dcn_gbps` per host (every device of a host sending
    its share at once), or None for one slice."""
    if self.slices < 2:
      return None
    return self.stats.dcn_bytes * self.devices_per_host / (self.dcn_gbps * 1e9 / 8)

  @property
  def fits(self) -> bool:
    return not self.refused and self.hbm is not None and self.stats.total <= self.hbm

  @property
  def step_seconds(self) -> float | None:
    if not self.peak_flops or self.refused:
      return None
    return self.stats.flops / (self.peak_flops * self.efficiency)

  @property
  def mfu(self) -> float | None:
    t = self.step_seconds
    return self.model_flops / (t * self.peak_flops) if t else None

  def to_dict(self) -> dict[str, Any]:
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "stats"}
    out.update(
      stats=self.stats.to_dict(),
      fits=self.fits,
      step_seconds=self.step_seconds,
      mfu=self.mfu,
      dcn_seconds=self.dcn_seconds,
    )
    return out


def settings_of(config) -> dict[str, Any]:
  return dict(
    batch_size=int(config.batch_size),
    accum_steps=int(config.accum_steps),
    remat=bool(config.model.get("remat", False)),
    scan=bool(config.model.get("scan", False)),
  )


def num_classes_for(config, num_classes: int | None) -> int:
  if num_classes:
    return int(num_classes)
  name = str(config.dataset.name)
  if name not in KNOWN_NUM_CLASSES:
    raise ValueError(
      f"dataset {name!r}: pass --num_classes (known without the data: {sorted(KNOWN_NUM_CLASSES)})"
    )
  return KNOWN_NUM_CLASSES[name]


def plan(
  config,
  topology: str,
  num_classes: int | None = None,
  efficiency: float = 0.5,
  devices=None,
  slices: int = 1,
  dcn_gbps: float = DCN_GBPS_PER_HOST,
  slice_axis: str | None = None,
) -> Plan:
  """Compiles the trainer's step of `config` for `topology`; returns its per-device costs.

  Args:
    config: a pretrain or finetune stage config.
    topology: e.g. 'v3:16x16'.
    num_classes: head width (default: KNOWN_NUM_CLASSES of the dataset).
    efficiency: assumed fraction of peak FLOP/s for the implied step time.
    devices: devices to compile for instead of the topology's (tests: CPU devices).
    slices: slices of `topology` (Multislice): the step is compiled with mesh.slices = slices.
    slice_axis: 'data' | 'fsdp', the mesh.slice_axis to compile with (default: the config's).
    dcn_gbps: data-centre network bandwidth per host, Gbit/s (Plan.dcn_seconds).
  """
  import jax  # noqa: PLC0415

  from vit_jax import sharding, train  # noqa: PLC0415
  from vit_jax.checkpoint.state import train_state  # noqa: PLC0415
  from vit_jax.cost import compiled_stats, flops  # noqa: PLC0415
  from vit_jax.cost import devices as device_table  # noqa: PLC0415

  devices = topology_devices(topology, slices) if devices is None else list(devices)
  overrides = {"mesh.slices": slices, "mesh.slice_axis": slice_axis}
  overrides = {
    k: v for k, v in overrides.items() if v is not None and v != config.mesh.get(k.split(".")[1])
  }
  if overrides:
    config = apply_overrides(config, overrides)
  classes = num_classes_for(config, num_classes)
  mesh = sharding.make_mesh(config.mesh, devices)
  built = train.build(config, mesh, classes)
  state = train_state.abstract_tree(built.abstract_state, built.state_shardings)
  batch = abstract_batch(config, mesh, classes)
  window = train.abstract_window(mesh)
  start = time.perf_counter()
  refused = ""
  try:
    compiled = built.jit_step(batch).lower(state, batch, window).compile()
  except jax.errors.JaxRuntimeError as e:
    # The TPU compiler refuses a program whose temporaries exceed the HBM, and says how much
    # it needed: a plan that does not fit, for the suggestions and --search to work from.
    arguments = compiled_stats.argument_bytes(state, built.state_shardings, batch)
    temp = compiled_stats.temporaries_refused(str(e), arguments)
    if temp is None:
      raise
    seconds = time.perf_counter() - start
    refused = str(e).strip().splitlines()[0]
    stats = compiled_stats.refused_step_stats(state, built.state_shardings, batch, temp)
  else:
    seconds = time.perf_counter() - start
    stats = compiled_stats.step_stats(compiled, state, built.state_shardings, batch)
  height, width = batch["image"].shape[1:3]
  per_example = flops.model_flops_per_example(built.model, (height, width))
  settings = settings_of(config)
  settings["per_device_batch"] = int(config.batch_size) // sharding.num_batch_shards(mesh)
  return Plan(
    topology=topology,
    device_kind=devices[0].device_kind,
    num_devices=len(devices),
    mesh=dict(mesh.shape),
    settings=settings,
    stats=stats,
    hbm=device_table.hbm_bytes_per_device(devices[0]),
    peak_flops=device_table.peak_flops_per_device(devices[0]),
    model_flops=per_example * int(config.batch_size) / len(devices),
    efficiency=efficiency,
    compile_seconds=seconds,
    refused=refused,
    slices=slices,
    slice_axis=str(config.mesh.get("slice_axis", "data")),
    devices_per_host=len(devices) // len({(_slice(d), d.process_index) for d in devices}),
    dcn_gbps=dcn_gbps,
  )


def _slice(device) -> int:
  return int(getattr(device, "slice_index", 0))


# --------------------------------------------------------------------------------------------------
# What would fit.


def suggest(
  *,
  state_bytes: float,
  activation_bytes: float,
  fixed_bytes: float,
  hbm: float,
  settings: dict[str, Any],
  mesh: dict[str, int],
  num_layers: int,
) -> list[tuple[dict[str, Any], str]]:
  """Settings that would bring a step within `hbm`, cheapest in speed first.

  Args:
    state_bytes: per device, parameters + optimizer state + gradients (what FSDP shards).
    activation_bytes: per device, temporaries other than gradients (what remat, accumulation
      and a smaller batch shrink).
    fixed_bytes: the rest (batch, code).
    hbm: the device's memory.
    settings: settings_of(config) with 'per_device_batch'.
    mesh: sizes of the data, fsdp and model axes.
    num_layers: encoder blocks (remat keeps about one block's activations of them).

  Returns:
    [(config overrides {'model.remat': True, 'mesh.fsdp': 4, ...}, why)], empty if it fits.
  """
  total = state_bytes + activation_bytes + fixed_bytes
  if total <= hbm:
    return []
  out = []
  budget = HEADROOM * hbm  # leave room for what the estimate misses
  per_device = int(settings["per_device_batch"])
  devices = math.prod(mesh.values())
  fsdp = int(mesh.get("fsdp", 1))
  remat = bool(settings["remat"])
  act_after_remat = activation_bytes if remat else activation_bytes * 2 / max(num_layers, 1)
  if not remat:
    out.append(
      (
        {"model.remat": True},
        f"remat recomputes each block's activations in the backward pass: activations "
        f"{activation_bytes / GiB:.1f} GiB → about {act_after_remat / GiB:.1f} GiB, "
        "for about a third more FLOPs",
      )
    )
  # FSDP: shard parameters, optimizer state and gradients over k devices.
  for k in (2**i for i in range(1, 20)):
    degree = fsdp * k
    if degree > devices or devices % degree or (per_device * devices) % degree:
      break
    if state_bytes / k + act_after_remat + fixed_bytes <= budget:
      overrides = {"mesh.fsdp": degree, "mesh.data": -1}
      if not remat and state_bytes / k + activation_bytes + fixed_bytes > budget:
        overrides["model.remat"] = True
      out.append(
        (
          overrides,
          f"FSDP over {degree} devices shards parameters, optimizer state and gradients: "
          f"{state_bytes / GiB:.1f} GiB → {state_bytes / k / GiB:.1f} GiB per device",
        )
      )
      break
  # Gradient accumulation: the same global batch in micro-batches.
  accum = int(settings["accum_steps"])
  for a in (2**i for i in range(1, 10)):
    if (per_device // accum) % a or per_device // accum < a:
      break
    if state_bytes + activation_bytes / a + fixed_bytes <= budget:
      out.append(
        (
          {"accum_steps": accum * a},
          f"accum_steps={accum * a}: micro-batches of {per_device // (accum * a)} per device, "
          f"activations → about {activation_bytes / a / GiB:.1f} GiB (same global batch)",
        )
      )
      break
  if not settings["scan"]:
    out.append(
      (
        {"model.scan": True, "model.remat": True},
        "scan over the blocks with remat: one block compiled, one block's activations kept",
      )
    )
  if per_device > 1:
    half = settings["batch_size"] // 2
    out.append(
      (
        {"batch_size": half},
        f"batch_size={half} ({per_device // 2} per device): changes the recipe's global batch",
      )
    )
  return out


def suggestions_for(p: Plan, config) -> list[tuple[dict[str, Any], str]]:
  s = p.stats
  return suggest(
    state_bytes=s.params + s.opt_state + s.gradients,
    activation_bytes=s.activations,
    fixed_bytes=s.total - (s.params + s.opt_state + s.gradients + s.activations),
    hbm=p.hbm or float("inf"),
    settings=p.settings,
    mesh=p.mesh,
    num_layers=int(config.model.num_layers),
  )


def apply_overrides(config, overrides: dict[str, Any]):
  """A copy of `config` with dotted-path overrides ('model.remat': True)."""
  import ml_collections  # noqa: PLC0415

  new = ml_collections.ConfigDict(config.to_dict())
  for path, value in overrides.items():
    *parents, leaf = path.split(".")
    node = new
    for p in parents:
      node = node[p]
    node[leaf] = value
  return new


def search(
  config, topology: str, base: Plan, max_trials: int, devices=None, **kwargs
) -> list[tuple[dict[str, Any], Plan]]:
  """Compiles the suggested settings (and remat with each) and returns those that fit.

  Ordered by the implied step time, those that leave a tenth of the HBM free first (a step
  compiled to 99% of the HBM fits on paper and leaves no room for the runtime's own buffers).
  """
  candidates = []
  for overrides, _ in suggestions_for(base, config):
    candidates.append(overrides)
    if not base.settings["remat"] and "model.remat" not in overrides:
      candidates.append({**overrides, "model.remat": True})
  found = []
  for overrides in candidates[:max_trials]:
    try:
      trial = plan(apply_overrides(config, overrides), topology, devices=devices, **kwargs)
    except ValueError as e:
      logging.info("search: %s does not apply: %s", overrides, e)
      continue
    logging.info("search: %s → %.2f GiB", overrides, trial.stats.total / GiB)
    if trial.fits:
      found.append((overrides, trial))
  found.sort(key=lambda kv: (kv[1].stats.total > HEADROOM * kv[1].hbm, kv[1].step_seconds or 0.0))
  return found


# --------------------------------------------------------------------------------------------------
# Report.


def _gib(x: float) -> str:
  return f"{x / GiB:6.2f} GiB" if x >= 0.01 * GiB else f"{x / 2**20:6.2f} MiB"


def format_plan(p: Plan) -> str:
  s = p.stats
  memory = [
    f"  parameters        {_gib(s.params)}",
    f"  optimizer state   {_gib(s.opt_state)}",
    f"  batch             {_gib(s.batch)}",
  ]
  lines = [
    f"{p.topology}{f' × {p.slices} slices' if p.slices > 1 else ''}: {p.num_devices} × "
    f"{p.device_kind}, mesh {p.mesh}, "
    f"batch {p.settings['batch_size']} ({p.settings['per_device_batch']} per device, "
    f"accum_steps {p.settings['accum_steps']}), remat={p.settings['remat']}, "
    f"scan={p.settings['scan']}; compiled in {p.compile_seconds:.0f} s",
  ]
  if p.refused:
    return "\n".join(
      [
        *lines,
        f"the compiler refused the step: {p.refused}",
        *memory,
        f"  temporaries       {_gib(s.temp)}   (the compiler's figure)",
        f"  total             {_gib(s.total)}   of {p.hbm / GiB:.0f} GiB HBM: DOES NOT FIT "
        f"({100 * s.total / p.hbm:.0f}%)",
        "no FLOPs or collectives: nothing was compiled",
      ]
    )
  lines += [
    "memory per device (compiler's memory_analysis):",
    *memory,
    f"  arguments         {_gib(s.argument)}   (the three above, and the step counter and rng)",
    f"  temporaries       {_gib(s.temp)}   of which gradients ≈ {_gib(s.gradients).strip()}, "
    f"activations and the rest ≈ {_gib(s.activations).strip()}",
    f"  outputs not donated {_gib(s.output - s.alias)}",
    f"  code              {_gib(s.code)}",
  ]
  if p.hbm:
    verdict = "fits" if p.fits else "DOES NOT FIT"
    lines.append(
      f"  total             {_gib(s.total)}   of {p.hbm / GiB:.0f} GiB HBM: {verdict} "
      f"({100 * s.total / p.hbm:.0f}%)"
    )
  else:
    lines.append(f"  total             {_gib(s.total)}   (HBM of {p.device_kind} unknown)")
  lines.append(
    f"FLOPs per device per step: {s.flops:.4g} compiled (XLA cost analysis {s.flops_xla:.4g}"
    f"{', loop bodies once' if s.flops != s.flops_xla else ''}), {p.model_flops:.4g} model "
    "(3 × forward, no recomputation)"
  )
  if p.step_seconds:
    lines.append(
      f"implied at {100 * p.efficiency:.0f}% of {p.peak_flops / 1e12:.1f} TFLOP/s peak: "
      f"{p.step_seconds:.3f} s/step, MFU {100 * p.mfu:.1f}% (an estimate until measured)"
    )
  unknown = [name for name, trips in s.loops if trips is None]
  if unknown:
    lines.append(f"  (trip count not found for {len(unknown)} loop(s): counted once)")
  if p.slices > 1:
    bound = p.dcn_seconds > (p.step_seconds or 0.0)
    sent = s.dcn_bytes + s.ici_bytes
    of_step = f", {100 * p.dcn_seconds / p.step_seconds:.1f}% of the implied step"
    of_step = of_step if p.step_seconds else ""
    lines.append(
      f"across {p.slices} slices ({p.slice_axis} across them): {s.dcn_bytes / 2**20:.1f} MiB per "
      f"device per step over the data-centre network, {s.ici_bytes / 2**20:.1f} MiB over the "
      f"chips' interconnect (DCN {100 * s.dcn_bytes / sent if sent else 0:.2f}% of the bytes); "
      f"{p.devices_per_host} devices per host at {p.dcn_gbps:g} Gbit/s per host: "
      f"{1e3 * p.dcn_seconds:.3f} ms per step over DCN{of_step}"
      + (" (longer than the implied compute time: bound by DCN)" if bound else "")
    )
    shares = sorted(s.dcn_dtypes.items(), key=lambda kv: -kv[1]) if s.dcn_bytes else []
    if shares:
      by_type = ", ".join(f"{t} {100 * b / s.dcn_bytes:.1f}%" for t, b in shares)
      lines.append(f"  DCN bytes by element type: {by_type}")
  lines.append("collectives per device per step (bytes sent, ring algorithms):")
  for kind, v in s.collectives.items():
    if v["count"]:
      lines.append(f"  {kind:<19}{v['count']:7.0f} ops  {v['bytes'] / 2**20:10.1f} MiB")
  if not any(v["count"] for v in s.collectives.values()):
    lines.append("  none")
  return "\n".join(lines)


def _flags_text(overrides: dict[str, Any]) -> str:
  return " ".join(f"--config.{k}={v}" for k, v in overrides.items())


define_flags = cli.define_flags(
  config=cli.config_flag,
  topology=cli.Flag(str, "TPU slice, e.g. v3:16x16, v4:8x8x8, v5e:16x16.", required=True),
  num_classes=cli.Flag(
    int, "Classes of the head (default: known for jft, imagenet21k, imagenet2012)."
  ),
  efficiency=cli.Flag(
    0.5, "Assumed fraction of peak FLOP/s at which the chip runs the compiled step."
  ),
  search=cli.Flag(False, "Compile the proposed settings; print those that fit."),
  max_trials=cli.Flag(4, "At most this many compilations for --search."),
  json=cli.Flag(False, "Print one JSON object instead of the report."),
  slices=cli.Flag(1, "Slices of --topology joined by the data-centre network (Multislice)."),
  slice_axis=cli.Flag(
    None,
    "The mesh axis whose outer factor crosses the slices (default: the config's mesh.slice_axis).",
    choices=["data", "fsdp"],
  ),
  dcn_gbps=cli.Flag(
    DCN_GBPS_PER_HOST,
    "Data-centre network bandwidth per host, Gbit/s, for the time the DCN bytes take.",
  ),
)


def main(argv: Sequence[str], f) -> None:
  cli.no_arguments(argv)
  topology = f.topology.value  # checked, and libtpu looked for, by `topology_devices`
  config = f.config.value
  kwargs = dict(
    num_classes=f.num_classes.value,
    efficiency=f.efficiency.value,
    slices=f.slices.value,
    dcn_gbps=f.dcn_gbps.value,
    slice_axis=f.slice_axis.value,
  )
  base = plan(config, topology, **kwargs)
  suggestions = suggestions_for(base, config)
  found = search(config, topology, base, f.max_trials.value, **kwargs) if f.search.value else []
  if f.json.value:
    out = base.to_dict()
    out["suggestions"] = [dict(overrides=o, why=w) for o, w in suggestions]
    if f.search.value:
      out["search"] = [dict(overrides=o, plan=p.to_dict()) for o, p in found]
    print(json.dumps(out, indent=2, default=str))
    return
  print(format_plan(base))
  if suggestions:
    print("\nIt does not fit. Settings that would (cheapest in speed first):")
    for overrides, why in suggestions:
      print(f"  {_flags_text(overrides)}\n      {why}")
  if f.search.value:
    print(f"\n--search: {len(found)} of the proposed settings fit (fastest first):")
    for overrides, p in found:
      print(
        f"  {_flags_text(overrides)}: {p.stats.total / GiB:.2f} GiB, "
        f"{p.step_seconds:.3f} s/step at {100 * p.efficiency:.0f}% of peak"
      )


if __name__ == "__main__":
  cli.run(main, "plan", define_flags, errors=(ValueError, RuntimeError))
