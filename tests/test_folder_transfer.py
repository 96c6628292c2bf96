"""experiments/folder_transfer.py: the bundled digits as an image folder, its pixel baselines
read back from the files, and (slow) the fine-tuning stages end to end."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import folder_transfer
from tests.helpers import REPO, xla_env
from vit_jax.input_pipeline.sources import builtin, indexed
from vit_jax.runtime import cli
from vit_jax.tools import make_folder


def test_digits_folder_reads_back_as_the_builtin_split(tmp_path):
  root = make_folder.write_classification("digits", str(tmp_path / "digits"))
  assert indexed.folder_class_names(root) == list(builtin.DIGIT_CLASSES)
  for split in ("train", "test"):
    images, labels = folder_transfer.read_folder(root, split, image_size=32)
    want_images, want_labels = builtin.get_split("digits", split)
    # Same examples (the folder lists them by class, then by file name), pixels unchanged.
    order = np.argsort(want_labels, kind="stable")
    np.testing.assert_array_equal(labels, want_labels[order])
    assert images.shape == (len(want_labels), 8, 8, 3)  # as stored: no resize (one size)
    np.testing.assert_array_equal(images, np.repeat(want_images[order], 3, axis=-1))


def test_images_of_different_sizes_are_resized_to_the_model_resolution(tmp_path):
  from PIL import Image

  for i, size in enumerate((10, 20)):
    os.makedirs(tmp_path / "train" / "a", exist_ok=True)
    Image.new("RGB", (size, size), (255, 0, 0)).save(tmp_path / "train" / "a" / f"{i}.png")
  images, labels = folder_transfer.read_folder(str(tmp_path), "train", image_size=16)
  assert images.shape == (2, 16, 16, 3) and labels.tolist() == [0, 0]
  assert (images[..., 0] == 255).all() and (images[..., 1:] == 0).all()


def test_an_unreadable_image_is_skipped_with_one_warning(tmp_path, caplog):
  from PIL import Image

  os.makedirs(tmp_path / "train" / "a")
  os.makedirs(tmp_path / "train" / "b")
  Image.new("RGB", (8, 8), (0, 255, 0)).save(tmp_path / "train" / "b" / "0.png")
  (tmp_path / "train" / "a" / "0.png").write_bytes(b"\x89PNG truncated")
  images, labels = folder_transfer.read_folder(str(tmp_path), "train", image_size=8)
  assert images.shape == (1, 8, 8, 3) and labels.tolist() == [1]
  (warning,) = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
  assert warning.startswith(
    f"skipped 1 of 2 images that could not be read: {tmp_path}/train/a/0.png"
  )
  (tmp_path / "train" / "b" / "0.png").write_text("gone")
  with pytest.raises(SystemExit, match="none of the 2 images could be read"):
    folder_transfer.read_folder(str(tmp_path), "train", image_size=8)


def test_missing_pretrained_workdir_is_one_clear_line(tmp_path):
  with pytest.raises(SystemExit, match="--pretrained=.*nowhere is not a pretrain workdir"):
    cli.call(folder_transfer, [f"--pretrained={tmp_path / 'nowhere'}", f"--workdir={tmp_path}"])
  assert not os.listdir(tmp_path)  # nothing written


@pytest.mark.slow  # a pretraining stage and two fine-tuning stages (~2 min on 2 cores)
def test_quick_folder_transfer_end_to_end(tmp_path):
  env = xla_env.child_env(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
  # A seconds-long pretraining run (the 'testing' ViT: folder_transfer fine-tunes the
  # architecture of its --pretrained workdir).
  pretrain = subprocess.run(
    [sys.executable, "-m", "vit_jax.main"]
    + ["--config=configs/pretrain.py:dataset=fashion_mnist,runlocal"]
    + [f"--workdir={tmp_path / 'pre'}"],
    capture_output=True,
    text=True,
    env=env,
    cwd=REPO,
    timeout=600,
  )
  assert pretrain.returncode == 0, pretrain.stderr[-3000:]
  out = subprocess.run(
    [sys.executable, "-m", "experiments.folder_transfer", "--quick"]
    + [f"--pretrained={tmp_path / 'pre'}", f"--workdir={tmp_path / 'ft'}"]
    + [f"--out={tmp_path / 'out'}"],
    capture_output=True,
    text=True,
    env=env,
    cwd=REPO,
    timeout=900,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert out.stdout.count("python -m vit_jax.main") == 2
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  assert set(results["runs"]) == {"pretrained", "scratch"}
  # Each reported accuracy is its workdir's on the folder's test images, recomputed here with
  # predict (PIL's resize where the trainer used TensorFlow's: a rounding apart, which can flip
  # near-ties; 5 of the 179 images are allowed).
  from PIL import Image

  from vit_jax import inference

  images, labels = folder_transfer.read_folder(str(tmp_path / "ft" / "digits"), "test", 32)
  for kind, run in results["runs"].items():
    assert run["step"] == 20
    probabilities = inference.Classifier(str(tmp_path / "ft" / kind)).probabilities(
      [Image.fromarray(image) for image in images]
    )
    accuracy = np.mean(probabilities.argmax(-1) == labels)
    assert accuracy == pytest.approx(run["test_accuracy"], abs=5 / 179), kind
  base = results["baselines"]
  assert base["train_examples"] == 1618 and base["test_examples"] == 179
  assert 0.9 < base["knn3"] <= 1 and 0.9 < base["logreg"] <= 1
