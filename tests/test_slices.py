"""Several TPU slices (Multislice): the mesh's `slices`, ordered by the devices' slice_index.

`mesh.slices` = N makes the outer factor N of the `data` axis cross slices, while fsdp, model
and the rest of data stay inside one (vit_jax.sharding.make_mesh). The devices of several slices
come from libtpu's topology descriptions (`num_slices`), so those tests run in a process of
their own (tests/libtpu_process.py); the one-line errors for CPU devices run everywhere.
"""

import jax
import pytest
from libtpu_process import libtpu_test  # tests/

from vit_jax import sharding
from vit_jax.configs import common


@pytest.mark.parametrize(
  "slices,message",
  [
    (0, "mesh.slices=0: expected a positive number of slices"),
    (3, "mesh.slices=3 does not divide the 8 devices"),
    # One process: its CPU devices are one slice (a process stands in for a slice).
    (2, r"mesh.slices=2, but the 8 devices are in 1 slice\(s\) \(by their process_index\)"),
  ],
)
def test_slice_errors_on_cpu_devices_are_one_line(slices, message):
  with pytest.raises(ValueError, match=f"^{message}$"):
    sharding.make_mesh(common.mesh_config(slices=slices), jax.devices()[:8])


def test_one_slice_is_the_mesh_of_before():
  devices = jax.devices()[:8]
  config = common.mesh_config(fsdp=2)
  assert config.slices == 1
  mesh = sharding.make_mesh(config, devices)
  del config.slices  # a config.json written before the field: one slice
  assert (sharding.make_mesh(config, devices).devices == mesh.devices).all()
  assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "model": 1}


@libtpu_test
def test_data_spans_the_slices_in_slice_index_order():
  from jax.experimental import topologies

  devices = list(topologies.get_topology_desc("v5e:4x4", "tpu", num_slices=2).devices)
  assert len(devices) == 32 and {d.slice_index for d in devices} == {0, 1}
  mesh = sharding.make_mesh(common.mesh_config(slices=2), devices)
  assert dict(mesh.shape) == {"data": 32, "fsdp": 1, "model": 1}
  assert [d.slice_index for d in mesh.devices[:, 0, 0]] == [0] * 16 + [1] * 16
  # FSDP inside a slice: each fsdp group is within one slice, data's outer factor crosses them.
  mesh = sharding.make_mesh(common.mesh_config(fsdp=4, slices=2), devices)
  assert dict(mesh.shape) == {"data": 8, "fsdp": 4, "model": 1}
  for row in mesh.devices[:, :, 0]:
    assert len({d.slice_index for d in row}) == 1
  assert [row[0].slice_index for row in mesh.devices[:, :, 0]] == [0] * 4 + [1] * 4
  # One-line errors: the slice count the devices contradict, and data not spanning the slices.
  with pytest.raises(ValueError, match=r"^mesh.slices=1, but the 32 devices are in 2 slices"):
    sharding.make_mesh(common.mesh_config(), devices)
  with pytest.raises(ValueError, match=r"^mesh.slices=4, but the 32 devices are in 2 slice\(s\)"):
    sharding.make_mesh(common.mesh_config(slices=4), devices)
  with pytest.raises(ValueError, match=r"^mesh.slices=2 does not divide mesh.data=1"):
    sharding.make_mesh(common.mesh_config(data=1, fsdp=32, slices=2), devices)


@libtpu_test
def test_the_planner_counts_the_bytes_between_slices():
  """The trainer's step on 2 slices of a v5e:4x4: the gradient all-reduce crosses the slices
  (host transfers: DCN bytes), on one slice nothing does."""
  from vit_jax.configs import pretrain
  from vit_jax.tools import plan as planner

  config = pretrain.get_config("dataset=jft,model=testing,epochs=7,lr=1e-3")
  config.dataset.image_size, config.batch_size = 32, 64
  one = planner.plan(config, "v5e:4x4")
  two = planner.plan(config, "v5e:4x4", slices=2, dcn_gbps=100)
  assert one.stats.dcn_bytes == 0 and one.dcn_seconds is None
  assert (two.num_devices, two.slices, two.mesh["data"]) == (32, 2, 32)
  assert 0 < two.stats.dcn_bytes < two.stats.ici_bytes
  assert two.dcn_seconds == two.stats.dcn_bytes * two.devices_per_host / (100e9 / 8)
  assert "across 2 slices:" in planner.format_plan(two)
