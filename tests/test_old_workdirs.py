"""A workdir written before the package's redesign still serves every reader of today's code.

tests/data/workdir_207fca1/ is the demo's pretraining in miniature
(`python -m vit_jax.main --config=configs/pretrain.py:dataset=fashion_mnist,runlocal`, 6 steps)
as vit_jax wrote it at 207fca1, before the trainer became a package, the checkpoint and input
pipeline folders were split and the models' outputs became `(logits, out)`: its config.json,
goodput ledger, final metrics and the Orbax checkpoint of step 6 (step 3, the TensorBoard events
and the log file left out). Today's code predicts from it, resumes it and fine-tunes from it.
"""

import json
import shutil

import numpy as np
from PIL import Image

from tests.helpers import REPO
from vit_jax import checkpoint, inference, train
from vit_jax.checkpoint.state import train_state
from vit_jax.configs import finetune, pretrain

OLD = REPO / "tests" / "data" / "workdir_207fca1"


def test_an_old_workdir_predicts_with_its_saved_architecture_and_classes():
  classifier = inference.Classifier(str(OLD))
  assert (classifier.num_classes, classifier.image_size) == (10, 16)
  assert classifier.class_names[0] == "T-shirt/top"
  images = [Image.fromarray(np.full((28, 28), v, np.uint8)) for v in (0, 200)]
  for top in classifier.top_k(images, k=3):
    probabilities = [p for _, _, p in top]
    assert probabilities == sorted(probabilities, reverse=True) and 0 < sum(probabilities) <= 1


def test_an_old_workdir_resumes_at_its_last_step(tmp_path, trainer_on_one_device):
  workdir = tmp_path / "run"
  shutil.copytree(OLD, workdir)
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  config.total_steps = 8  # two steps more than it was trained for
  config.evals = {}
  metrics = train.run(config, str(workdir))
  assert train_state.committed_steps(workdir) == [6, 8] and np.isfinite(metrics["loss"])
  attempts = json.loads((workdir / "goodput.json").read_text())["attempts"]
  assert [a["start_step"] for a in attempts] == [0, 6]  # restored at 6, nothing trained again


def test_fine_tuning_starts_from_an_old_workdir(tmp_path, trainer_on_one_device):
  config = finetune.get_config("dataset=animal_mnist,runlocal")
  config.model_init = str(OLD)
  config.total_steps = 2
  config.evals = {}
  metrics = train.run(config, str(tmp_path / "ft"))
  assert np.isfinite(metrics["loss"])
  pretrained = checkpoint.load(str(OLD))
  tuned = checkpoint.load(str(tmp_path / "ft"))
  moved = _mlp_kernel(tuned) - _mlp_kernel(pretrained)
  print(f"fine-tuning moved the first MLP kernel by at most {np.abs(moved).max():.2e}")
  # The encoder came from the old workdir: two steps moved it far less than its own scale.
  assert np.abs(moved).max() < 0.1 * np.abs(_mlp_kernel(pretrained)).max()


def _mlp_kernel(params) -> np.ndarray:
  return np.asarray(params["Transformer"]["encoderblock_0"]["MlpBlock_3"]["Dense_0"]["kernel"])
