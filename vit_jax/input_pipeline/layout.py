"""How a global batch is laid out over hosts and devices: which of its rows each host supplies,
and the host-local rows made into global jax.Arrays. One layout for every iterator (the
TensorFlow pipeline's and the in-memory segmentation data's), so row r of global batch b is
stream position b·B + r on any number of hosts and any mesh.

This file must not import TensorFlow.
"""

from typing import Any

import jax
import numpy as np


def hosts(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if not 0 <= index < count:
    raise ValueError(f"process_index={index} outside [0, process_count={count}).")
  return index, count


def local_batch_size(global_batch_size: int, process_count: int) -> int:
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise ValueError(
      f"global_batch_size={global_batch_size} must be a positive multiple of the number of "
      f"hosts ({process_count})."
    )
  return global_batch_size // process_count


def host_rows(mesh, data_axes, global_batch_size: int, process_index: int, process_count: int):
  """The rows of the global batch that this host's local rows become, in order: int64 [L].

  jax.make_array_from_process_local_data gives a process the rows of its devices' shards in
  increasing order. Without a mesh, or with hosts simulated in one process, host h's rows are
  the h-th block of L = global_batch_size / process_count.
  """
  local = global_batch_size // process_count
  if mesh is None or jax.process_count() == 1:
    return np.arange(process_index * local, (process_index + 1) * local, dtype=np.int64)
  axes = (data_axes,) if isinstance(data_axes, str) else tuple(data_axes)
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(axes))
  devices = sharding.devices_indices_map((global_batch_size,)).items()
  own = [index[0] for device, index in devices if device.process_index == process_index]
  shards = sorted({s.indices(global_batch_size)[:2] for s in own})
  rows = np.concatenate([np.arange(start, stop, dtype=np.int64) for start, stop in shards])
  if len(rows) != local:
    raise ValueError(
      f"process {process_index}'s devices hold {len(rows)} rows of the global batch over "
      f"data_axes {axes}, not global_batch_size / process_count = {local}."
    )
  return rows


def to_global(batch: dict[str, np.ndarray], mesh, data_axes) -> dict[str, Any]:
  """Host-local numpy batch → global jax.Arrays sharded on dim 0 over `data_axes` (or numpy)."""
  if mesh is None:
    return batch
  axes = (data_axes,) if isinstance(data_axes, str) else tuple(data_axes)
  unknown = [a for a in axes if a not in mesh.axis_names]
  if unknown:
    raise ValueError(f"data_axes {unknown} are not axes of the mesh {mesh.axis_names}.")
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(axes))
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
