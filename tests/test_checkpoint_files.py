"""Checkpoint paths that are not what they claim: one line naming the file and what it is not."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import REPO, xla_env
from vit_jax import checkpoint


def _bad_files(tmp_path):
  """name -> (path, what the error must say)."""
  good = tmp_path / "good.npz"
  np.savez(good, a=np.arange(1000.0), b=np.ones((30, 30)))
  data = good.read_bytes()
  (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
  (tmp_path / "text.npz").write_text("hello world\n")
  np.save(tmp_path / "array.npy", np.ones(3))
  (tmp_path / "array.npz").write_bytes((tmp_path / "array.npy").read_bytes())
  (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
  (tmp_path / "model.pth").write_bytes(b"\x80\x04junk")
  (tmp_path / "notes.txt").write_text("not a checkpoint")
  # An Orbax workdir whose only step was never committed (a run killed while saving it).
  os.makedirs(tmp_path / "killed" / "checkpoints" / "5.orbax-checkpoint-tmp-1" / "state")
  return {
    "text": ("text.npz", r"not an \.npz archive \(a zip of arrays\); it starts with b'hello wo'"),
    "truncated": ("truncated.npz", r"truncated or corrupt \.npz: File is not a zip file"),
    "npy": ("array.npz", r"not an \.npz archive .*; it is a single \.npy array"),
    "safetensors": ("bad.safetensors", "not a readable safetensors file"),
    "pickle": ("model.pth", "a pickle, .*never unpickles .*can run arbitrary code.*safetensors"),
    "other file": ("notes.txt", "not a checkpoint; expected an .npz or .safetensors file"),
    "missing": ("nowhere", "no such file or directory"),
    "uncommitted": ("killed", "no committed Orbax checkpoint under"),
  }


def test_each_bad_file_raises_one_line_naming_it(tmp_path):
  bad = _bad_files(tmp_path)
  for name, (file, message) in bad.items():
    path = str(tmp_path / file)
    with pytest.raises((ValueError, FileNotFoundError)) as raised:
      checkpoint.load(path)
    text = str(raised.value)
    assert "\n" not in text and str(tmp_path / file) in text, (name, text)
    assert raised.match(message), (name, text)
  assert set(checkpoint.load(tmp_path / "good.npz")) == {"a", "b"}
  # The trainer's model_init reads a directory through restore_params: the same lines.
  from vit_jax.checkpoint.state import train_state

  for name in ("missing", "uncommitted"):
    file, message = bad[name]
    with pytest.raises((ValueError, FileNotFoundError), match=message):
      train_state.restore_params(tmp_path / file)
  with pytest.raises(ValueError, match="text.npz: not an Orbax checkpoint"):
    train_state.restore_params(tmp_path / "text.npz")


def _run(args):
  env = xla_env.child_env(TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
  return subprocess.run(
    [sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
  )


def test_fine_tune_from_a_text_file_named_npz_ends_in_one_line(tmp_path):
  (tmp_path / "ViT-B_16.npz").write_text("hello world\n")
  out = _run(
    [
      "vit_jax.main",
      "--config=configs/finetune.py:dataset=animal_mnist,runlocal",
      f"--config.model_init={tmp_path / 'ViT-B_16.npz'}",
      f"--workdir={tmp_path / 'ft'}",
    ]
  )
  assert out.returncode == 1
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(
    f"vit_jax: error: ValueError: {tmp_path / 'ViT-B_16.npz'}: not an .npz archive (a zip of "
    "arrays); it starts with b'hello wo'"
  ), out.stderr[-2000:]


@pytest.mark.parametrize("name", ["model.pth", "pytorch_model.bin"])
def test_convert_refuses_a_pickle_by_name(tmp_path, name):
  (tmp_path / name).write_bytes(b"\x80\x04junk")
  given = tmp_path / name if name == "model.pth" else tmp_path  # an HF directory with its .bin
  out = _run(["vit_jax.tools.convert", f"--in={given}", f"--out={tmp_path / 'out'}"])
  assert out.returncode == 1
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(f"convert: error: ValueError: {tmp_path / name}: a pickle, which this")
  assert "export the state dict as safetensors" in last
  assert not (tmp_path / "out").exists()
