"""Two real JAX processes (jax.distributed, gloo over 127.0.0.1) build global batches together."""

import json
import os
import sys
import textwrap

import pytest

from tests.helpers import REPO, local_cluster, synthetic_data, xla_env

_WORKER = textwrap.dedent(
  """
  import json, sys
  import jax, numpy as np
  from jax.experimental import multihost_utils
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  port, pid, data_dir, out = sys.argv[1:]
  jax.distributed.initialize(f'127.0.0.1:{port}', num_processes=2, process_id=int(pid))
  from vit_jax import input_pipeline
  config = input_pipeline.dataset_config(
      source='tfrecord', name='toy', data_dir=data_dir, train_split='train', eval_split='train',
      num_classes=30, image_size=8, shuffle_buffer=8)
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ('data',))  # 2 processes x 2 devices.
  it = input_pipeline.make_train_iterator(config, global_batch_size=8, mesh=mesh, data_axes='data')
  batch = next(it)
  assert batch['image'].shape == (8, 8, 8, 3), batch['image'].shape
  train = multihost_utils.process_allgather(batch['label'], tiled=True).tolist()
  seen = []
  for b in input_pipeline.make_eval_iterator(config, global_batch_size=8, mesh=mesh,
                                             data_axes='data'):
    labels = multihost_utils.process_allgather(b['label'], tiled=True)
    mask = multihost_utils.process_allgather(b['mask'], tiled=True)
    seen.extend(labels[mask > 0].tolist())
  it.close()
  json.dump({'train': train, 'eval': seen, 'state': it.get_state()}, open(out, 'w'))
  """
)


@pytest.mark.slow
def test_two_processes_global_batches(tmp_path):
  synthetic_data.write_shards(str(tmp_path), "toy-train", synthetic_data.id_records(30), 4)
  env = xla_env.child_env(2)
  env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
  outs = [tmp_path / f"out{i}.json" for i in range(2)]
  results = local_cluster.launch(
    lambda port, i: [sys.executable, "-c", _WORKER, str(port), str(i), str(tmp_path), str(outs[i])],
    env=env,
    timeout=300,
    cwd=REPO,
  )
  for i, (code, out) in enumerate(results):
    assert code == 0, f"process {i}:\n{out[-4000:]}"
  results = [json.loads(o.read_text()) for o in outs]
  assert results[0]["train"] == results[1]["train"] and len(results[0]["train"]) == 8
  assert sorted(results[0]["eval"]) == list(range(30))  # Each example once over both hosts.
  assert results[0]["state"]["num_records"] == 4  # Per host: 8 global / 2 processes.


def test_launch_retries_on_another_port_when_the_coordinator_cannot_bind(tmp_path):
  """Process 0 of the first attempt reports jax's bind failure: the launch starts over on a new
  port (and stops process 1, which would wait for the coordinator)."""
  worker = textwrap.dedent(
    """
    import pathlib, sys, time
    port, pid, marker = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
    if pid == 1:
      if not marker.exists():
        time.sleep(600)  # waits for a coordinator that never comes
      sys.exit(0)
    if not marker.exists():
      marker.write_text(port)
      sys.exit('jax.errors.JaxRuntimeError: UNKNOWN: Failed to start RPC server')
    print('coordinator on', port)
    """
  )
  marker = tmp_path / "first_port"
  results = local_cluster.launch(
    lambda port, i: [sys.executable, "-c", worker, str(port), str(i), str(marker)],
    grace=1,
    cwd=tmp_path,
  )
  assert [code for code, _ in results] == [0, 0]
  first, second = int(marker.read_text()), int(results[0][1].split()[-1])
  assert first != second
