"""Two processes over 127.0.0.1 (4 CPU devices each) train like one process with 8 devices.

Each process runs the real entry point (`python -m vit_jax.main` with a coordinator address) and
reads its own half of every batch; the global batch holds the same examples as in the
one-process run (in another row order), so with no dropout and no random augmentation the final
parameters agree up to summation order.
"""

import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np

from configs import pretrain
from vit_jax import train, train_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[1]
PP_TRAIN = "decode|resize|value_range(-1, 1)"
MESH = dict(data=2, fsdp=2, model=2)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_match_one(tmp_path):
  port = _free_port()
  overrides = [f"--config.mesh.{k}={v}" for k, v in MESH.items()] + [
    f"--config.dataset.pp_train={PP_TRAIN}",
    "--config.evals.val.every_steps=0",  # evaluators (over both hosts) at the end only
    "--config.evals.fewshot_animal_mnist.every_steps=0",
    "--config.evals.fewshot_mnist_5k.every_steps=0",
  ]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        "-m",
        "vit_jax.main",
        "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
        f"--workdir={tmp_path / 'two'}",
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
        f"--process_id={i}",
        *overrides,
      ],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outputs = [p.communicate(timeout=600)[0] for p in procs]
  for i, (p, out) in enumerate(zip(procs, outputs, strict=True)):
    assert p.returncode == 0, f"process {i}:\n{out[-4000:]}"
  assert "process 1 of 2" in outputs[1]

  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  config.mesh.update(MESH)
  config.dataset.pp_train = PP_TRAIN
  config.evals = {}
  train.run(config, str(tmp_path / "one"))

  two = train_checkpoint.restore_params(tmp_path / "two")
  one = train_checkpoint.restore_params(tmp_path / "one")
  for (path, x), (_, y) in zip(
    jax.tree_util.tree_leaves_with_path(two), jax.tree_util.tree_leaves_with_path(one), strict=True
  ):
    np.testing.assert_allclose(x, y, atol=1e-5, rtol=0, err_msg=jax.tree_util.keystr(path))
  # Only process 0 writes TensorBoard event files.
  assert len(list((tmp_path / "two").glob("events.out.tfevents.*"))) == 1
