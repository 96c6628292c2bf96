"""What one compiled train step costs per device: memory, FLOPs and collective traffic.

Read from the compiler, not estimated: memory from `compiled.memory_analysis()`, FLOPs from
`compiled.cost_analysis()`, and the collectives from the compiled HLO text. Used by the planner
(vit_jax.tools.plan) and by the trainer at startup (the same numbers for the step it runs).

Loops. XLA's cost analysis counts the body of a `while` loop once, but a scanned model runs its
body once per layer and gradient accumulation once per micro-batch. `parse_hlo` finds each
loop's trip count (the `known_trip_count` the compiler records, else the bound of the `i < N`
comparison of its condition) and multiplies what is inside; FLOPs are corrected by the matmul
and convolution FLOPs of loop bodies (elementwise work inside loops stays counted once: a few
percent of a transformer's FLOPs).

Collective bytes are what one device sends per step under ring algorithms over a group of n
devices: all-gather (n−1)/n of the gathered buffer, reduce-scatter (n−1)/n of its input,
all-reduce 2(n−1)/n of the buffer, all-to-all (n−1)/n, collective-permute the whole buffer.

This file must not import TensorFlow.
"""

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from absl import logging

from vit_jax.cost import devices
from vit_jax.cost.flops import compiled_flops

GiB = 2**30
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

_DTYPE_BYTES = {
  "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
  "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
  "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e5m2fnuz": 1, "f8e4m3fnuz": 1, "f8e4m3b11fnuz": 1,
}  # fmt: skip
_ARRAY = re.compile(
  r"\b(" + "|".join(sorted(_DTYPE_BYTES, key=len, reverse=True)) + r")\[([\d,]*)\]"
)
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_CALLS = re.compile(
  r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


def _arrays(text: str) -> list[tuple[str, tuple[int, ...]]]:
  """Every `dtype[d0,d1,...]` in a type string, in order."""
  return [(t, tuple(int(d) for d in dims.split(",") if d)) for t, dims in _ARRAY.findall(text)]


def _nbytes(arrays: list[tuple[str, tuple[int, ...]]]) -> float:
  return float(sum(_DTYPE_BYTES[t] * math.prod(dims) for t, dims in arrays))


def _split_type(rest: str) -> tuple[str, str]:
  """'(f32[2], s32[]) op(...), attrs' → ('(f32[2], s32[])', 'op(...), attrs')."""
  rest = rest.lstrip()
  if not rest.startswith("("):
    head, _, tail = rest.partition(" ")
    return head, tail
  depth = 0
  for i, ch in enumerate(rest):
    depth += ch == "("
    depth -= ch == ")"
    if depth == 0:
      return rest[: i + 1], rest[i + 1 :].lstrip()
  return rest, ""


def _group_size(attrs: str, num_devices: int) -> int:
  """Devices per replica group: `{{0,1},{2,3}}`, iota `[2,4]<=[8]`, or `mesh[...] {'axis_0'}`."""
  m = re.search(r"replica_groups=\{\{([^}]*)\}", attrs)
  if m:
    return len([x for x in m.group(1).split(",") if x.strip()])
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
  if m:
    return int(m.group(2))
  m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
  if m:
    sizes = dict(re.findall(r"'([^']+)'=(\d+)", m.group(1)))
    axes = re.findall(r"'([^']+)'", m.group(2))
    return math.prod(int(sizes[a]) for a in axes if a in sizes)
  m = re.search(r"source_target_pairs=\{(.*?)\}\}", attrs)
  if m:
    return 2
  return num_devices  # `replica_groups={}`: every device


@dataclasses.dataclass
class _Instr:
  name: str
  opcode: str
  type_str: str
  attrs: str  # operands and attributes, after the opcode


@dataclasses.dataclass
class HloStats:
  """Loop-aware totals of one HLO module, per device.

  Attributes:
    collectives: {kind: {'count': executions per step, 'bytes': bytes sent per step}}.
    matmul_flops: FLOPs of dots and convolutions, each counted once per execution.
    matmul_flops_once: the same, counting every loop body once (as XLA's cost analysis does).
    loops: [(body name, trip count or None if not found)].
    dcn_bytes: bytes sent per step between slices: the TPU compiler splits a collective across
      slices into one inside each slice and a host transfer (`send` with
      `_xla_megascale_transfer_type`) between them, counted as a ring over the S slices sends
      its buffer (all-reduce 2 (S - 1) / S of it; all-gather, reduce-scatter, all-to-all
      (S - 1) / S; anything else all of it).
    ici_bytes: the bytes of the other collectives (`collectives`), inside a slice.
    dcn_dtypes, ici_dtypes: `dcn_bytes` and `ici_bytes` by element type ({'bf16': ..., 'f32': ...}).
  """

  collectives: dict[str, dict[str, float]]
  matmul_flops: float
  matmul_flops_once: float
  loops: list[tuple[str, int | None]]
  dcn_bytes: float = 0.0
  ici_bytes: float = 0.0
  dcn_dtypes: dict[str, float] = dataclasses.field(default_factory=dict)
  ici_dtypes: dict[str, float] = dataclasses.field(default_factory=dict)


def _computations(text: str) -> tuple[dict[str, list[_Instr]], dict[str, dict[str, str]], str]:
  comps: dict[str, list[_Instr]] = {}
  shapes: dict[str, dict[str, str]] = {}  # computation -> instruction/parameter name -> type
  entry, current = "", None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(" "):
      current = header.group(2)
      comps[current], shapes[current] = [], {}
      if header.group(1):
        entry = current
      params = line[line.index("(") + 1 : line.rindex("->")] if "->" in line else ""
      for pname, ptype in re.findall(r"([\w.\-]+):\s*([^,()]+\[[\d,]*\][^,()]*)", params):
        shapes[current][pname] = ptype
      continue
    if current is None or line.startswith("}"):
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    type_str, rest = _split_type(m.group(2))
    op = re.match(r"([\w\-]+)\(", rest)
    if not op:
      continue
    instr = _Instr(m.group(1), op.group(1), type_str, rest[op.end() :])
    comps[current].append(instr)
    shapes[current][instr.name] = type_str
  if not entry and comps:
    entry = list(comps)[-1]
  return comps, shapes, entry


def _trip_count(instr: _Instr, comps: dict[str, list[_Instr]]) -> int | None:
  m = re.search(r'known_trip_count"?\s*[:=]\s*\{\s*"?n"?\s*[:=]\s*"?(\d+)', instr.attrs)
  if m:
    return int(m.group(1))
  cond = re.search(r"condition=%?([\w.\-]+)", instr.attrs)
  body = comps.get(cond.group(1), []) if cond else []
  constants = {}
  for i in body:
    c = re.match(r"(-?\d+)\)", i.attrs)
    if i.opcode == "constant" and c and re.match(r"[su](32|64)\[\]", i.type_str):
      constants[i.name] = int(c.group(1))
  for i in body:
    if i.opcode == "compare" and "direction=LT" in i.attrs:
      operands = re.findall(r"%([\w.\-]+)", i.attrs.split(")")[0])
      bounds = [constants[o] for o in operands[1:] if o in constants]
      if bounds:
        return bounds[0]
  return None


def _operand_shape(instr: _Instr, index: int, table: dict[str, str]) -> tuple[int, ...] | None:
  inside = instr.attrs.split(")")[0]
  operands = [o.strip() for o in inside.split(",")]
  if index >= len(operands):
    return None
  inline = _arrays(operands[index])
  if inline:
    return inline[0][1]
  name = re.search(r"%?([\w.\-]+)\s*$", operands[index])
  found = _arrays(table.get(name.group(1), "")) if name else []
  return found[0][1] if found else None


def _matmul_flops(instr: _Instr, table: dict[str, str]) -> float:
  out = _arrays(instr.type_str)
  if not out:
    return 0.0
  out_size = math.prod(out[0][1])
  if instr.opcode == "dot":
    lhs = _operand_shape(instr, 0, table)
    dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.attrs)
    if lhs is None or dims is None:
      return 0.0
    contracted = math.prod(lhs[int(d)] for d in dims.group(1).split(",") if d)
    return 2.0 * out_size * contracted
  if instr.opcode == "convolution":
    lhs, rhs = _operand_shape(instr, 0, table), _operand_shape(instr, 1, table)
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instr.attrs)
    if lhs is None or rhs is None or labels is None or "i" not in labels.group(2):
      return 0.0
    lhs_l, rhs_l, out_l = labels.groups()
    spatial = sorted(d for d in rhs_l if d.isdigit())
    found = _WINDOW.search(instr.attrs)
    window = dict(re.findall(r"(\w+)=([\d_x\-]+)", found.group(1))) if found else {}

    def per_dim(key: str, default: str) -> list[str]:
      return window[key].split("x") if key in window else [default] * len(spatial)

    pads, strides = per_dim("pad", "0_0"), per_dim("stride", "1")
    lhs_dil, rhs_dil = per_dim("lhs_dilate", "1"), per_dim("rhs_dilate", "1")
    # Each output element sums over the input features of its group (rhs 'i') and over the
    # window taps that land on real input: TPU programs express matmuls as convolutions whose
    # window is mostly padding, so counting the whole window would overcount them many times.
    taps = 1
    for k, d in enumerate(spatial):
      taps *= _valid_taps(
        size=lhs[lhs_l.index(d)],
        outputs=out[0][1][out_l.index(d)],
        window=rhs[rhs_l.index(d)],
        pad_lo=int(pads[k].split("_")[0]),
        stride=int(strides[k]),
        lhs_dilation=int(lhs_dil[k]),
        rhs_dilation=int(rhs_dil[k]),
      )
    outputs_per_position = out_size / math.prod(out[0][1][out_l.index(d)] for d in spatial)
    return 2.0 * outputs_per_position * rhs[rhs_l.index("i")] * taps
  return 0.0


def _valid_taps(
  *,
  size: int,
  outputs: int,
  window: int,
  pad_lo: int,
  stride: int,
  lhs_dilation: int,
  rhs_dilation: int,
) -> int:
  """(output position, window tap) pairs of one spatial dimension that read a real input."""
  pos = np.arange(outputs)[:, None] * stride + np.arange(window)[None, :] * rhs_dilation - pad_lo
  real = (pos >= 0) & (pos % lhs_dilation == 0) & (pos // lhs_dilation < size)
  return int(real.sum())


def parse_hlo(text: str, num_devices: int, slices: int = 1) -> HloStats:
  """Collectives and matmul FLOPs of a compiled HLO module (`compiled.as_text()`), per device.

  Args:
    text: the HLO text of one device's program (SPMD: every device runs the same).
    num_devices: devices of the mesh (the group of a collective with `replica_groups={}`).
    slices: TPU slices the program spans (Multislice), for `dcn_bytes`.
  """
  comps, shapes, entry = _computations(text)
  mult: dict[str, float] = {name: 0.0 for name in comps}
  mult[entry] = 1.0
  loops = []
  # HLO text lists callees before their callers: walking it backwards visits callers first.
  for name in reversed(list(comps)):
    for instr in comps[name]:
      trips = _trip_count(instr, comps) if instr.opcode == "while" else None
      if instr.opcode == "while":
        body = re.search(r"body=%?([\w.\-]+)", instr.attrs)
        loops.append((body.group(1) if body else instr.name, trips))
      callees = [(k, c) for k, c in _CALLS.findall(instr.attrs)]
      for branches in _BRANCHES.findall(instr.attrs):
        callees += [("branch", c.strip().lstrip("%")) for c in branches.split(",") if c.strip()]
      for kind, callee in callees:
        factor = (trips or 1) if kind in ("body", "condition") else 1
        if callee in mult:
          mult[callee] += mult[name] * factor
  collectives = {k: {"count": 0.0, "bytes": 0.0} for k in COLLECTIVES}
  flops = flops_once = dcn = 0.0
  dcn_dtypes: dict[str, float] = {}
  ici_dtypes: dict[str, float] = {}
  for name, instrs in comps.items():
    for instr in instrs:
      f = _matmul_flops(instr, shapes[name]) if instr.opcode in ("dot", "convolution") else 0.0
      flops += f * mult[name]
      flops_once += f if mult[name] > 0 else 0.0
      transfer = re.search(r'_xla_megascale_transfer_type="(\w+)"', instr.attrs)
      if instr.opcode == "send" and transfer:
        buffer = _arrays(instr.type_str)[:1]  # (buffer, u32[], token[])
        share = (slices - 1) / slices if slices > 1 else 1.0
        factor = {"ALL_REDUCE": 2 * share, "ALL_GATHER": share, "REDUCE_SCATTER": share,
                  "ALL_TO_ALL": share}.get(transfer.group(1), 1.0)  # fmt: skip
        dcn += _nbytes(buffer) * factor * mult[name]
        _add_by_dtype(dcn_dtypes, buffer, factor * mult[name])
        continue
      kind = instr.opcode.removesuffix("-start")
      if kind not in COLLECTIVES or instr.opcode.endswith("-done"):
        continue
      arrays = _arrays(instr.type_str)
      if (
        instr.opcode.endswith("-start") and instr.type_str.startswith("(") and kind != "all-reduce"
      ):
        # Async pairs carry (operand(s), result(s), ...): the result is the second half.
        arrays = arrays[len(arrays) // 2 :] if kind != "collective-permute" else arrays[:1]
      size = _nbytes(arrays)
      n = _group_size(instr.attrs, num_devices)
      share = (n - 1) / n if n > 1 else 0.0
      sent = {
        "all-gather": size * share,
        "reduce-scatter": size * n * share,  # the result is 1/n of the input
        "all-reduce": 2 * size * share,
        "all-to-all": size * share,
        "collective-permute": size,
      }[kind]
      collectives[kind]["count"] += mult[name]
      collectives[kind]["bytes"] += sent * mult[name]
      _add_by_dtype(ici_dtypes, arrays, (sent / size if size else 0.0) * mult[name])
  ici = sum(v["bytes"] for v in collectives.values())
  return HloStats(collectives, flops, flops_once, loops, dcn, ici, dcn_dtypes, ici_dtypes)


def _add_by_dtype(totals: dict[str, float], arrays: list, factor: float) -> None:
  """Adds `factor` times the bytes of each array to its element type's total."""
  for dtype, dims in arrays:
    totals[dtype] = totals.get(dtype, 0.0) + factor * _nbytes([(dtype, dims)])


def sharded_bytes(tree: Any, shardings: Any) -> int:
  """Bytes per device of a tree of arrays or ShapeDtypeStructs laid out with `shardings`."""
  total = 0
  for x, s in zip(
    jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(shardings), strict=True
  ):
    shard = s.shard_shape(tuple(x.shape))
    total += int(np.prod(shard)) * np.dtype(x.dtype).itemsize
  return total


@dataclasses.dataclass
class StepStats:
  """Per-device cost of one compiled train step (bytes, FLOPs), as the compiler reports it.

  `argument`, `output`, `alias`, `temp`, `code` are memory_analysis() fields; `total` is what
  the step holds at its peak: arguments + outputs not aliased to donated arguments + temporaries
  + code. `params`, `opt_state`, `batch` split the arguments (from the shardings); `gradients`
  is the size of the parameters' gradients (inside `temp`, an estimate of the split), and
  `activations` the rest of `temp`.
  """

  argument: int
  output: int
  alias: int
  temp: int
  code: int
  params: int
  opt_state: int
  batch: int
  gradients: int
  flops: float  # per device per step, loop-corrected
  flops_xla: float  # cost_analysis() as reported (loop bodies once)
  collectives: dict[str, dict[str, float]]
  loops: list[tuple[str, int | None]]
  dcn_bytes: float = 0.0  # of the collectives' bytes, those sent between slices
  ici_bytes: float = 0.0
  dcn_dtypes: dict[str, float] = dataclasses.field(default_factory=dict)  # dcn_bytes by dtype
  ici_dtypes: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def total(self) -> int:
    return self.argument + self.output - self.alias + self.temp + self.code

  @property
  def activations(self) -> int:
    return max(self.temp - self.gradients, 0)

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out.update(total=self.total, activations=self.activations)
    return out


def _argument_bytes(state, state_shardings, batch) -> tuple[int, int, int]:
  """Bytes per device of the parameters, the optimizer state and the batch."""
  return (
    sharded_bytes(state["params"], state_shardings["params"]),
    sharded_bytes(state["opt_state"], state_shardings["opt_state"]),
    sharded_bytes(batch, jax.tree_util.tree_map(lambda x: x.sharding, batch)),
  )


_REFUSED = re.compile(
  r"memory required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM"
)
# libtpu's later wording gives the whole use instead: "Used 15.93G of 15.75G hbm".
_REFUSED_TOTAL = re.compile(r"Ran out of memory in memory space hbm\. Used ([\d.]+)([KMGT]?) of ")


def temporaries_refused(message: str, arguments: int = 0) -> int | None:
  """The temporaries (bytes) a TPU compiler asked for when it refused a step for lack of HBM:
  as the error names them ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory
  required for HLO temporaries (18.61G) exceeds available HBM (15.48G)"), or the whole use it
  names less `arguments`, the step's arguments' bytes that the use includes ("Ran out of memory
  in memory space hbm. Used 15.93G of 15.75G hbm"). None when `message` is neither."""
  m = _REFUSED.search(message)
  if m:
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " "))
  m = _REFUSED_TOTAL.search(message)
  if m:
    used = int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " "))
    return max(used - int(arguments), 0)
  return None


def argument_bytes(state, state_shardings, batch) -> int:
  """Bytes per device of a step's arguments: parameters, optimizer state and batch."""
  return sum(_argument_bytes(state, state_shardings, batch))


def refused_step_stats(
  state: Mapping[str, Any], state_shardings: Mapping[str, Any], batch: Any, temp: int
) -> StepStats:
  """What is known of a step the compiler refused: `temp` from its error, the arguments from
  the shardings (donated, so outputs alias them), no code size, FLOPs or collectives."""
  params, opt, batch_bytes = _argument_bytes(state, state_shardings, batch)
  argument = params + opt + batch_bytes
  return StepStats(
    argument=argument,
    output=params + opt,
    alias=params + opt,
    temp=temp,
    code=0,
    params=params,
    opt_state=opt,
    batch=batch_bytes,
    gradients=min(params, temp),  # float32 gradients of float32 parameters
    flops=0.0,
    flops_xla=0.0,
    collectives={k: {"count": 0.0, "bytes": 0.0} for k in COLLECTIVES},
    loops=[],
  )


def step_stats(
  compiled: Any, state: Mapping[str, Any], state_shardings: Mapping[str, Any], batch: Any
) -> StepStats:
  """Memory, FLOPs and collectives of a compiled train step (see StepStats).

  Args:
    compiled: `jax.jit(...).lower(...).compile()` of the train step.
    state: the train state (arrays or ShapeDtypeStructs) with 'params' and 'opt_state'.
    state_shardings: its NamedShardings.
    batch: the batch (arrays or ShapeDtypeStructs carrying shardings).
  """
  mem = compiled.memory_analysis()
  params, opt, batch_bytes = _argument_bytes(state, state_shardings, batch)
  # Gradients have the parameters' shapes in float32 (the parameters' dtype here).
  f32 = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, np.float32), state["params"])
  grads = sharded_bytes(f32, state_shardings["params"])
  mesh_devices = list(jax.tree_util.tree_leaves(state_shardings["params"])[0].mesh.devices.flat)
  slices = len({int(getattr(d, "slice_index", 0)) for d in mesh_devices})
  hlo = parse_hlo(compiled.as_text(), len(mesh_devices), slices)
  xla_flops = compiled_flops(compiled) or 0.0
  return StepStats(
    argument=int(mem.argument_size_in_bytes),
    output=int(mem.output_size_in_bytes),
    alias=int(mem.alias_size_in_bytes),
    temp=int(mem.temp_size_in_bytes),
    code=int(mem.generated_code_size_in_bytes),
    params=params,
    opt_state=opt,
    batch=batch_bytes,
    gradients=min(grads, int(mem.temp_size_in_bytes)),
    flops=xla_flops + hlo.matmul_flops - hlo.matmul_flops_once,
    flops_xla=xla_flops,
    collectives=hlo.collectives,
    loops=hlo.loops,
    dcn_bytes=hlo.dcn_bytes,
    ici_bytes=hlo.ici_bytes,
    dcn_dtypes=hlo.dcn_dtypes,
    ici_dtypes=hlo.ici_dtypes,
  )


def log_step_stats(stats: StepStats, device: jax.Device | None = None) -> None:
  """One log line per figure: memory against the device's HBM, FLOPs, collectives."""
  hbm = devices.hbm_bytes_per_device(device)
  logging.info(
    "compiled train step per device: params %.2f GiB, optimizer state %.2f GiB, batch %.2f GiB, "
    "temporaries %.2f GiB (gradients ≈%.2f GiB), total %.2f GiB of %s HBM",
    stats.params / GiB,
    stats.opt_state / GiB,
    stats.batch / GiB,
    stats.temp / GiB,
    stats.gradients / GiB,
    stats.total / GiB,
    f"{hbm / GiB:.0f} GiB" if hbm else "unknown",
  )
  logging.info(
    "compiled train step per device: %.3g FLOPs (XLA cost analysis %.3g); collectives %s",
    stats.flops,
    stats.flops_xla,
    {
      k: f"{v['count']:.0f}× {v['bytes'] / 2**20:.1f} MiB"
      for k, v in stats.collectives.items()
      if v["count"]
    },
  )
