"""experiments/detection.py --quick end to end, as a user runs it: every stage it chains, its
table and figures, its non-learned baseline scored on the runs' own canvases, and its numbers
compared with the committed results' fingerprint (experiments/fingerprint.py)."""

import json

import numpy as np
import pytest

from experiments import detection, fingerprint
from tests.helpers import REPO, experiment_run
from vit_jax import input_pipeline

COMMITTED = REPO / "experiments/results/detection/results.json"
COMMAND = "python -m experiments.detection"


@pytest.mark.slow  # the experiment's quick profile; the detect stage is tested in test_detection_*
def test_quick_detection_experiment(tmp_path):
  printed = experiment_run.run("detection", "--quick", f"--workdir={tmp_path}").stdout
  # Each stage's command is printed before it runs, so that a reader can rerun it.
  assert "python -m vit_jax.main --config=configs/pretrain.py:dataset=fashion_mnist" in printed
  assert "--config=configs/detect.py:dataset=fashion_mnist_det,model=R26x1" in printed
  assert f"--config.model_init={tmp_path / 'pretrain'}" in printed

  out = tmp_path / "results"  # --quick never writes over experiments/results/
  results = json.loads((out / "results.json").read_text())
  assert (out / "table.md").read_text().strip() == detection.table(results)
  for figure in ("detection.png", "examples.png"):
    assert (out / figure).read_bytes()[:4] == b"\x89PNG"
  assert list(results["runs"]) == list(detection.ENCODERS)
  assert results["best_vit"] in ("vit_pretrained", "vit_scratch")

  # Every run and the baseline are scored on the same boxes: those of test[:32] at the
  # profile's resolution, counted here through the input pipeline.
  config = input_pipeline.dataset_config(
    source="det_builtin", name="fashion_mnist_det", image_size=32, pp_eval="", max_boxes=8
  )
  batches = list(input_pipeline.make_eval_iterator(config, "test[:32]", global_batch_size=32))
  labels = np.concatenate([b["label"] for b in batches])
  boxes = int(np.sum(labels[..., 4] >= 0))
  baseline = results["baseline"]
  assert baseline["num_images"] == 32 and baseline["num_boxes"] == boxes
  for run in results["runs"].values():
    assert run["num_boxes"] == boxes and run["num_images"] == 32
  assert -1 <= baseline["threshold"] <= 1
  for key in ("AP", "AP50", "AP75"):
    assert 0 <= baseline[key] <= 1
  # The committed results are what today's code computes: their fingerprint is these numbers.
  fingerprint.check(json.loads(COMMITTED.read_text()), results, COMMAND)


def test_the_baseline_boxes_components_and_votes_by_its_neighbours():
  """Two bright squares on a dark canvas are two boxes (normalised, ends exclusive); a crop
  is classified by its 5 nearest training crops, scored by their share of the vote."""
  grey = np.full((1, 16, 16), -1.0, np.float32)
  grey[0, 2:6, 3:9] = 0.5
  grey[0, 10:16, 12:14] = 0.9
  (boxes,) = detection.components(grey, 0.0)
  np.testing.assert_allclose(boxes, [[2, 3, 6, 9], [10, 12, 16, 14]] / np.float64(16))
  assert detection.components(grey, 0.95)[0].shape == (0, 4)
  crops = detection.crops(grey, [boxes])
  assert crops.shape == (2, detection.CROP**2)
  np.testing.assert_allclose(crops, [[0.5] * detection.CROP**2, [0.9] * detection.CROP**2])

  reference = np.array([[0.0], [0.1], [0.2], [0.3], [5.0], [5.1], [5.2], [5.3]], np.float32)
  classes = np.array([1, 1, 1, 1, 0, 0, 0, 2])
  found, scores = detection.knn(reference, classes, np.array([[0.05], [5.05]], np.float32), 3)
  assert list(found) == [1, 0]  # four 1s and a 0 near 0.05; three 0s, a 2 and a 1 near 5.05
  np.testing.assert_allclose(scores, [0.8, 0.6])


def test_the_committed_results_were_made_with_todays_full_configs():
  today = fingerprint.configs(detection.stage_flags(detection.FULL, detection.WORKDIR))
  fingerprint.check_configs(json.loads(COMMITTED.read_text()), today, COMMAND)
