"""Several TPU slices (Multislice): the mesh's `slices`, ordered by the devices' slice_index.

`mesh.slices` = N makes the outer factor N of the `data` axis (or, with `mesh.slice_axis=fsdp`,
of the `fsdp` axis) cross slices, while the other axes and the rest of that one stay inside one
(vit_jax.sharding.make_mesh); each slice's hosts supply their own rows of the global batch, as
on one slice. The devices of several slices come from libtpu's topology descriptions
(`num_slices`), so those tests run in a process of their own (tests/helpers/libtpu_process.py); the
one-line errors for CPU devices run everywhere.
"""

import jax
import numpy as np
import pytest

from tests.helpers import this_thread
from tests.helpers.libtpu_process import libtpu_test
from vit_jax import sharding
from vit_jax.configs import common
from vit_jax.input_pipeline import layout


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


def test_a_slice_axis_other_than_data_or_fsdp_is_one_line():
  with pytest.raises(ValueError, match=r"^mesh.slice_axis='model': expected one of data, fsdp$"):
    sharding.make_mesh(common.mesh_config(slice_axis="model"), jax.devices()[:8])


@pytest.mark.parametrize(
  "env, connects",
  [
    ({}, False),  # one process: nothing to connect
    ({"TPU_WORKER_HOSTNAMES": "10.0.0.2"}, False),  # a one-host slice
    ({"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"}, True),  # a slice of two hosts
    ({"TPU_WORKER_HOSTNAMES": "10.0.0.2", "MEGASCALE_NUM_SLICES": "2"}, True),  # 2 one-host slices
    ({"TPU_WORKER_HOSTNAMES": "10.0.0.2", "MEGASCALE_NUM_SLICES": "1"}, False),
  ],
)
def test_distributed_auto_connects_the_workers_of_several_hosts_or_slices(
  monkeypatch, env, connects
):
  from vit_jax.runtime import distributed

  for name in ("TPU_WORKER_HOSTNAMES", "MEGASCALE_NUM_SLICES"):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  # The log line after the (faked) connect; another test's Orbax thread asks the real count.
  monkeypatch.setattr(jax, "process_count", this_thread.only(lambda: 1, jax.process_count))
  distributed.initialize("auto")
  assert bool(calls) == connects


def test_one_slice_is_the_mesh_of_before():
  devices = jax.devices()[:8]
  config = common.mesh_config(fsdp=2)
  assert config.slices == 1
  mesh = sharding.make_mesh(config, devices)
  del config.slices, config.slice_axis  # a config.json written before the fields: one slice
  assert (sharding.make_mesh(config, devices).devices == mesh.devices).all()
  assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "model": 1}


@libtpu_test
def test_data_spans_the_slices_in_slice_index_order(monkeypatch):
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
  # The per-slice split of the data is the per-host split: each of the 8 hosts (4 per slice)
  # supplies its own rows of a global batch of 64 (the rows jax.make_array_from_process_local_data
  # gives its devices), together all of them once, and slice s's hosts the s-th half.
  monkeypatch.setattr(jax, "process_count", this_thread.only(lambda *_: 8, jax.process_count))
  slice_of = {d.process_index: d.slice_index for d in devices}
  assert sorted(slice_of) == list(range(8))
  rows = {h: layout.host_rows(mesh, sharding.BATCH_AXES, 64, h, 8) for h in range(8)}
  assert sorted(np.concatenate(list(rows.values()))) == list(range(64))
  for h, r in rows.items():
    assert len(r) == 8 and set(r // 32) == {slice_of[h]}, (h, r)
  # One-line errors: the slice count the devices contradict, and data not spanning the slices.
  with pytest.raises(ValueError, match=r"^mesh.slices=1, but the 32 devices are in 2 slices"):
    sharding.make_mesh(common.mesh_config(), devices)
  with pytest.raises(ValueError, match=r"^mesh.slices=4, but the 32 devices are in 2 slice\(s\)"):
    sharding.make_mesh(common.mesh_config(slices=4), devices)
  with pytest.raises(ValueError, match=r"^mesh.slices=2 does not divide mesh.data=1 "):
    sharding.make_mesh(common.mesh_config(data=1, fsdp=32, slices=2), devices)


@libtpu_test
def test_fsdp_can_span_the_slices_instead():
  """mesh.slice_axis=fsdp: each fsdp group has the same number of devices in every slice (its
  outer factor crosses them, in slice_index order), each data group and model group is inside
  one slice."""
  from jax.experimental import topologies

  devices = list(topologies.get_topology_desc("v5e:4x4", "tpu", num_slices=2).devices)
  mesh = sharding.make_mesh(
    common.mesh_config(fsdp=4, model=2, slice_axis="fsdp", slices=2), devices
  )
  assert dict(mesh.shape) == {"data": 4, "fsdp": 4, "model": 2}
  index = np.vectorize(lambda d: d.slice_index)(mesh.devices)
  assert (index == np.array([0, 0, 1, 1])[None, :, None]).all(), index[:, :, 0]
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)
  for group in (index[:, f, m] for f in range(4) for m in range(2)):
    assert len(set(group)) == 1
  with pytest.raises(
    ValueError,
    match=r"^mesh.slices=2 does not divide mesh.fsdp=1 \(mesh.slice_axis=fsdp: its outer factor "
    r"spans the slices\)$",
  ):
    sharding.make_mesh(common.mesh_config(slice_axis="fsdp", slices=2), devices)


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
  assert "across 2 slices (data across them):" in planner.format_plan(two)
  # FSDP over the slices instead: parameters gathered and gradients reduce-scattered across them.
  config.mesh.fsdp = 2
  fsdp = planner.plan(config, "v5e:4x4", slices=2, slice_axis="fsdp")
  assert (fsdp.slice_axis, fsdp.mesh) == ("fsdp", {"data": 16, "fsdp": 2, "model": 1})
  assert "across 2 slices (fsdp across them):" in planner.format_plan(fsdp)
  assert fsdp.stats.dcn_bytes > two.stats.dcn_bytes
