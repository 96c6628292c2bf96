"""An image folder through the stages as the README runs it: the fine-tuning preset with its
held-out minival slice of the folder, and the linear probe with its default `train[:99%]`."""

import json
import re
import shlex
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import REPO, synthetic_data, xla_env
from vit_jax import checkpoint, models

CLASSES = ["daisy", "rose", "tulip"]


@pytest.fixture(scope="module")
def flowers(tmp_path_factory):
  """(a folder `train/` 3 x 20, `val/` 3 x 4 of PNG and JPEG, a 'testing' ViT `.npz`)."""
  root = tmp_path_factory.mktemp("flowers")
  synthetic_data.write_image_folder(str(root), "train", CLASSES, per_class=20)
  synthetic_data.write_image_folder(str(root), "val", CLASSES, per_class=4, seed=1)
  model = models.get_model("testing", 10)
  params = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)["params"]
  path = root.parent / "ViT-B_16.npz"
  checkpoint.save(jax.tree.map(np.asarray, params), str(path))
  return root, path


def _run(args):
  env = xla_env.child_env(TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
  return subprocess.run(
    [sys.executable, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
  )


def _readme_folder_command() -> list[str]:
  text = (REPO / "README.md").read_text()
  (line,) = [
    c
    for c in re.sub(r"\\\n\s*", " ", text).splitlines()
    if "vit_jax.main" in c and "source=folder" in c
  ]
  return shlex.split(line)[1:]  # without `python`


@pytest.mark.slow  # six steps, two evaluations (~40 s on 2 cores)
def test_readme_folder_example_trains_and_evaluates_minival(flowers, tmp_path):
  root, npz = flowers
  args = [
    a.replace("/data/flowers", str(root))
    .replace("/tmp/flowers", str(tmp_path / "ft"))
    .replace("ViT-B_16.npz", str(npz))
    for a in _readme_folder_command()
  ]
  args = [a + ",runlocal" if a.startswith("--config=") else a for a in args]
  out = _run(args)
  assert out.returncode == 0, out.stderr[-3000:]
  metrics = json.loads((tmp_path / "ft" / "final_metrics.json").read_text())
  # 2% of the folder's 60 training images held out, the `val` folder's 12 as the test set.
  assert metrics["minival/num_examples"] == 1 and metrics["val/num_examples"] == 12
  config = json.loads((tmp_path / "ft" / "config.json").read_text())
  assert config["dataset"]["train_split"] == "train[:98%]"


def test_linear_probe_on_a_folder(flowers, tmp_path):
  root, npz = flowers
  out = _run(
    [
      "-m",
      "vit_jax.main",
      f"--config=configs/linear_probe.py:dataset=flowers,source=folder,data_dir={root},runlocal",
      "--config.dataset.eval_split=val",
      f"--config.model_init={npz}",
      f"--workdir={tmp_path / 'probe'}",
    ]
  )
  assert out.returncode == 0, out.stderr[-3000:]
  results = json.loads((tmp_path / "probe" / "linear_probe.json").read_text())
  # The default `train[:99%]` of the folder's 60 training images (round(59.4)), the `val`
  # folder's 12 as the test set. The images are noise, so no accuracy is meaningful beyond it
  # being scored on exactly those 12: a whole number of them right.
  assert results["linear_probe/num_train"] == 59 and results["linear_probe/num_test"] == 12
  for probe in ("ridge", "logreg"):
    right = results[f"linear_probe/{probe}_accuracy"] * 12
    assert abs(right - round(right)) < 1e-6, (probe, right)
