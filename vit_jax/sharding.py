"""The device mesh and the partition rules for parameters, optimizer state and activations.

Every sharding decision of the trainer is declared here, once: a mesh with three named axes,

  data   pure data parallelism (parameters replicated),
  fsdp   data parallelism with parameters and optimizer state sharded over it (ZeRO-3 style),
  model  tensor parallelism: attention heads and the MLP hidden units are split over it,

optionally over several TPU slices (`make_mesh`), and an ordered list of rules mapping parameter
names (regular expressions on the `/`-joined path) to PartitionSpecs, which shard the optimizer
state too. The batch (and with it every activation, which XLA's sharding propagation derives) is
split over `data` and `fsdp`. A dimension that an axis does not divide is left unsharded, so any
model runs on any mesh; specs are left-padded with None to the leaf's rank, so the same rules
serve a scanned model's stacked blocks.

This file must not import TensorFlow.
"""

import re
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "model")
# The axes whose outer factor may cross slices (mesh.slice_axis); `model` stays inside one.
SLICE_AXES = ("data", "fsdp")
# Devices whose physical axes jax.make_mesh splits between mesh axes (jax/_src/sharding_impls.py).
_SPLITTABLE_KINDS = ("TPU v5 lite", "TPU v5e")
# The batch dimension of inputs and activations.
BATCH_AXES = ("data", "fsdp")

# (name regex, spec) — first match wins; unmatched leaves are replicated. Shapes in the published
# layout: query/key/value kernel [D, heads, D/heads], out kernel [heads, D/heads, D], MLP kernels
# [D, M] and [M, D]; fsdp takes the D ("embed") dimension, model the heads / M dimension.
PARTITION_RULES: tuple[tuple[str, P], ...] = (
  (r"MultiHeadDotProductAttention_\d+/(query|key|value)/kernel$", P("fsdp", "model", None)),
  (r"MultiHeadDotProductAttention_\d+/(query|key|value)/bias$", P("model", None)),
  (r"MultiHeadDotProductAttention_\d+/out/kernel$", P("model", None, "fsdp")),
  (r"MlpBlock_\d+/Dense_0/kernel$", P("fsdp", "model")),
  (r"MlpBlock_\d+/Dense_0/bias$", P("model")),
  (r"MlpBlock_\d+/Dense_1/kernel$", P("model", "fsdp")),
  (r"^embedding/kernel$", P(None, None, None, "fsdp")),
  (r"pos_embedding$", P(None, None, "fsdp")),
  (r"^(pre_logits|head)/kernel$", P("fsdp", None)),
  # BiT's head is a 1x1 conv [1, 1, C, K]: like the ViT head, its input dimension over fsdp.
  (r"^head/conv2d/kernel$", P(None, None, "fsdp", None)),
  # ResNets (the hybrids' stem, BiT's `standardized_conv2d`): output channels over fsdp.
  (r"conv.*/kernel$", P(None, None, None, "fsdp")),
  (r".*", P()),
)


def make_mesh(
  mesh_config: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """Builds the ('data', 'fsdp', 'model') mesh.

  Args:
    mesh_config: sizes `data`, `fsdp`, `model`; one of them may be -1 to take the remaining
      devices (e.g. data=-1, fsdp=1, model=1 is plain data parallelism on any slice). `slices`
      (default 1): the number of TPU slices the devices are in, joined by the data-centre network
      (Multislice). `slice_axis` (default 'data'): the axis whose outer factor, `slices`, crosses
      them, 'data' (gradients reduced across slices) or 'fsdp' (parameters gathered across
      slices too); the other axes and the rest of that one stay inside one slice
      (`slice_devices`).
    devices: defaults to all devices of all processes.

  Returns:
    A Mesh with Auto axis types (XLA propagates shardings between the constraints we set).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(
      f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, sizes, strict=True))}"
    )
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices do not split into mesh {sizes}")
    sizes[sizes.index(-1)] = len(devices) // known
  if int(np.prod(sizes)) != len(devices):
    raise ValueError(
      f"mesh {dict(zip(MESH_AXES, sizes, strict=True))} needs {np.prod(sizes)} devices, have {len(devices)}"
    )
  slices = int(mesh_config.get("slices", 1))
  slice_axis = str(mesh_config.get("slice_axis", "data"))
  if slice_axis not in SLICE_AXES:
    raise ValueError(f"mesh.slice_axis={slice_axis!r}: expected one of {', '.join(SLICE_AXES)}")
  slice_devices(devices, slices)  # checks them; create_hybrid_device_mesh groups them alike
  axis_types = (AxisType.Auto,) * len(MESH_AXES)
  if slices == 1:
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=axis_types, devices=devices)
  crossing = MESH_AXES.index(slice_axis)
  if sizes[crossing] % slices:
    raise ValueError(
      f"mesh.slices={slices} does not divide mesh.{slice_axis}={sizes[crossing]} "
      f"(mesh.slice_axis={slice_axis}: its outer factor spans the slices)"
    )
  inside = list(sizes)
  inside[crossing] //= slices
  across = [1] * len(MESH_AXES)
  across[crossing] = slices
  array = mesh_utils.create_hybrid_device_mesh(
    tuple(inside),
    tuple(across),
    devices,
    process_is_granule=_slice_attribute(devices) == "process_index",
    # As jax.make_mesh does for one slice: v5e's 2D torus may be split (e.g. fsdp=2 × model=2
    # inside a 4x4 slice), other chips' may not.
    allow_split_physical_axes=devices[0].device_kind in _SPLITTABLE_KINDS,
  )
  return Mesh(array, MESH_AXES, axis_types=axis_types)


def _slice_attribute(devices: Sequence[jax.Device]) -> str:
  """The device attribute that says a device's slice: TPUs' `slice_index`; elsewhere (CPU and
  GPU devices, whose `slice_index`, where they have one, is 0 on every process) the process."""
  tpu = devices[0].platform == "tpu" and hasattr(devices[0], "slice_index")
  return "slice_index" if tpu else "process_index"


def slice_devices(devices: Sequence[jax.Device], slices: int) -> list[list[jax.Device]]:
  """`devices` grouped by slice (TPUs' `slice_index`; for other devices, such as CPU devices,
  their process stands in for a slice), after checking that there are `slices` groups of equal
  size; a mismatch is a one-line ValueError naming mesh.slices."""
  if slices < 1:
    raise ValueError(f"mesh.slices={slices}: expected a positive number of slices")
  if len(devices) % slices:
    raise ValueError(f"mesh.slices={slices} does not divide the {len(devices)} devices")
  attribute = _slice_attribute(devices)
  groups: dict[int, list[jax.Device]] = {}
  for d in devices:
    groups.setdefault(int(getattr(d, attribute)), []).append(d)
  if slices > 1 and len(groups) != slices:
    raise ValueError(
      f"mesh.slices={slices}, but the {len(devices)} devices are in {len(groups)} slice(s) "
      f"(by their {attribute})"
    )
  if slices == 1 and attribute == "slice_index" and len(groups) > 1:
    raise ValueError(
      f"mesh.slices=1, but the {len(devices)} devices are in {len(groups)} slices (by their "
      f"slice_index): set mesh.slices={len(groups)}"
    )
  if len({len(g) for g in groups.values()}) > 1:
    raise ValueError(
      f"mesh.slices={slices}: the slices have unequal device counts "
      f"{sorted(len(g) for g in groups.values())}"
    )
  return [groups[k] for k in sorted(groups)]


def path_name(path: Sequence[Any]) -> str:
  """`/`-joined dict keys of a tree path; optax wrappers (tuples, namedtuples) are skipped."""
  keys = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]
  return "/".join(keys)


def spec_for(
  name: str,
  shape: Sequence[int],
  mesh: Mesh,
  rules: Sequence[tuple[str, P]] = PARTITION_RULES,
) -> P:
  """The PartitionSpec of one leaf: first matching rule, fitted to the leaf's rank and sizes."""
  spec = next((s for pattern, s in rules if re.search(pattern, name)), P())
  spec = tuple(spec)
  if len(spec) > len(shape):
    # Scalars and leaves of an unexpected rank (e.g. optimizer counters) are replicated.
    return P()
  spec = (None,) * (len(shape) - len(spec)) + spec  # the scan layer axis stays unsharded
  fitted = []
  for dim, axes in zip(shape, spec, strict=True):
    if axes is None:
      fitted.append(None)
      continue
    size = int(np.prod([mesh.shape[a] for a in (axes if isinstance(axes, tuple) else (axes,))]))
    fitted.append(axes if dim % size == 0 else None)
    if dim % size and size > 1:
      logging.log_first_n(
        logging.INFO,
        "sharding: %s dim %d (size %d) not divisible by %s; unsharded",
        20,
        name,
        len(fitted) - 1,
        dim,
        axes,
      )
  return P(*fitted)


def tree_shardings(tree: Any, mesh: Mesh, rules: Sequence[tuple[str, P]] = PARTITION_RULES) -> Any:
  """NamedShardings for every leaf of a parameter or optimizer-state tree (arrays or shapes)."""

  def leaf(path, x):
    return NamedSharding(mesh, spec_for(path_name(path), np.shape(x), mesh, rules))

  return jax.tree_util.tree_map_with_path(leaf, tree)


def batch_spec(ndim: int) -> P:
  """Spec of an input or activation [batch, ...]: batch over data and fsdp."""
  return P(BATCH_AXES, *([None] * (ndim - 1)))


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
  return NamedSharding(mesh, batch_spec(ndim))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def num_batch_shards(mesh: Mesh) -> int:
  """How many ways the batch is split; global batch sizes must be multiples of it."""
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
