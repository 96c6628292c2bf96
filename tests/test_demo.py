"""The README's demo end to end (`--quick`), then predict on the workdir it leaves behind."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import xla_env  # tests/
from PIL import Image

from vit_jax import predict
from vit_jax.input_pipeline import builtin

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_demo_then_predict(tmp_path):
  # The demo runs as a user would: one CPU device, XLA's default optimisation (at the suite's
  # level 0 its training steps take longer than their compilation saves: 153 s wall against 105).
  env = xla_env.child_env(optimize=True)
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.demo",
      "--quick",
      f"--workdir={tmp_path}",
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=REPO,
    timeout=900,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "== Results" in out.stdout and "Pretraining on Fashion-MNIST bought" in out.stdout

  # --quick's results go to <workdir>/results/, never over the repository's experiments/results/.
  results = json.loads((tmp_path / "results" / "results.json").read_text())
  # Every stage learned something in its few steps (10 classes: chance is 10%). Regression pins
  # with margins, from a measured run (2 cores, AVX-512): pretrain 22.6%, fine-tune 32.4%, from
  # scratch 24.5%, probe 43.4%.
  assert results["pretrain"]["val/accuracy"] > 0.15
  assert results["finetune"]["val/accuracy"] > 0.2 and results["scratch"]["val/accuracy"] > 0.15
  assert results["probe"]["linear_probe/logreg_accuracy"] > 0.25
  assert results["pretrain"]["step"] == 30 and results["finetune"]["step"] == 20
  assert set(results["pretrain"]) >= {"fewshot_animal_mnist/1shot", "fewshot_mnist_5k/25shot"}
  assert results["probe"]["linear_probe/representation_size"] == 64  # the pre-logits
  # Raw-pixel baselines on the stages' own splits (--quick: the first 2000 / 500 examples).
  assert "pixels logreg / kNN-3" in out.stdout
  base = results["baselines"]
  assert set(base) == {"fashion_mnist", "animal_mnist", "mnist_5k"}
  assert base["animal_mnist"]["train_examples"] == 2000
  assert base["animal_mnist"]["test_examples"] == 500
  # ...which are the splits the ViT stages were evaluated on (a command-line eval_split reaches
  # the 'val' evaluator: it once kept the preset's whole test split).
  for stage in ("pretrain", "finetune", "scratch"):
    assert results[stage]["val/num_examples"] == 500, stage
  assert base["mnist_5k"]["train_examples"] == 256  # the probe's runlocal size
  assert all(0.5 < b["knn3"] <= 1 and 0.5 < b["logreg"] <= 1 for b in base.values())
  gain = 100 * (results["finetune"]["val/accuracy"] - results["scratch"]["val/accuracy"])
  assert results["gain_points"] == pytest.approx(gain)

  # The fine-tuned workdir classifies images with the dataset's class names, and its accuracy on
  # the split the demo evaluated (and computed its baselines on: test[:500]) is the one reported.
  # PIL's resize (predict) and TensorFlow's (the trainer) differ by a rounding, which flips
  # near-ties: 3 of 1,000 images in a measured run; 5 of 500 are allowed.
  images, labels = builtin.get_split("animal_mnist", "test[:500]")
  clf = predict.Classifier(str(tmp_path / "finetune"))
  assert clf.image_size == 32 and clf.num_classes == 10
  assert clf.class_names == list(builtin.ANIMAL_MNIST_CLASSES)
  probabilities = clf.probabilities([Image.fromarray(image[..., 0]) for image in images])
  accuracy = np.mean(probabilities.argmax(-1) == labels)
  assert accuracy == pytest.approx(results["finetune"]["val/accuracy"], abs=0.01)
  np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-4)
  path = str(tmp_path / "animal.png")
  Image.fromarray(images[0][..., 0]).save(path)
  (top,) = clf.top_k([Image.open(path)], k=5)
  assert [index for index, _, _ in top] == list(np.argsort(-probabilities[0])[:5])
  assert [name for _, name, _ in top] == [builtin.ANIMAL_MNIST_CLASSES[i] for i, _, _ in top]
