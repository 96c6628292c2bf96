"""Two real JAX processes (jax.distributed, gloo over 127.0.0.1) build global batches together."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from vit_jax.input_pipeline import testing

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


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_global_batches(tmp_path):
  testing.write_shards(str(tmp_path), "toy-train", testing.id_records(30), 4)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
  env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
  port = _free_port()
  outs = [tmp_path / f"out{i}.json" for i in range(2)]
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", _WORKER, str(port), str(i), str(tmp_path), str(outs[i])], env=env
    )
    for i in range(2)
  ]
  for p in procs:
    assert p.wait(timeout=300) == 0
  results = [json.loads(o.read_text()) for o in outs]
  assert results[0]["train"] == results[1]["train"] and len(results[0]["train"]) == 8
  assert sorted(results[0]["eval"]) == list(range(30))  # Each example once over both hosts.
  assert results[0]["state"]["num_records"] == 4  # Per host: 8 global / 2 processes.
