"""experiments/segmentation.py --quick end to end, as a user runs it: every stage it chains, its
table and plot, and its numbers compared with the committed results' fingerprint
(experiments/fingerprint.py)."""

import json

import numpy as np
import pytest

from experiments import fingerprint, segmentation
from tests.helpers import REPO, experiment_run
from vit_jax import input_pipeline

COMMITTED = REPO / "experiments/results/segmentation/results.json"
COMMAND = "python -m experiments.segmentation"


@pytest.mark.slow  # the experiment's quick profile; the segment stage is tested in test_segmentation
def test_quick_segmentation_experiment(tmp_path):
  printed = experiment_run.run("segmentation", "--quick", f"--workdir={tmp_path}").stdout
  # Each stage's command is printed before it runs, so that a reader can rerun it.
  assert "python -m vit_jax.main --config=configs/pretrain.py:dataset=fashion_mnist" in printed
  assert "--config=configs/segment.py:dataset=animal_mnist_seg,model=R26x1,head=linear" in printed
  assert f"--config.model_init={tmp_path / 'pretrain'}" in printed

  out = tmp_path / "results"  # --quick never writes over experiments/results/
  results = json.loads((out / "results.json").read_text())
  assert (out / "table.md").read_text().strip() == segmentation.table(results)
  assert (out / "segmentation.png").read_bytes()[:4] == b"\x89PNG"
  assert list(results["runs"]) == [f"{e}_{h}" for e, h in segmentation.QUICK.runs]
  # The committed results are what today's code computes: their fingerprint is these numbers.
  fingerprint.check(json.loads(COMMITTED.read_text()), results, COMMAND)

  # Every run and the baselines are scored on the same pixels: the counted ones of test[:32]
  # at the profile's resolution, counted here through the input pipeline.
  config = input_pipeline.dataset_config(
    source="seg_builtin", name="animal_mnist_seg", image_size=16, pp_eval=""
  )
  labels = np.concatenate(
    [
      b["label"]
      for b in input_pipeline.make_eval_iterator(config, "test[:32]", global_batch_size=32)
    ]
  )
  counted = labels != 255
  for run in [
    *results["runs"].values(),
    *(results["baselines"][k] for k in ("background", "threshold")),
  ]:
    assert run["num_pixels"] == counted.sum()
  background = np.mean(labels[counted] == 0)
  assert results["baselines"]["background"]["pixel_accuracy"] == pytest.approx(background)
  # All background: only the background has an IoU, its pixel share, over the classes present.
  present = len(np.unique(labels[counted]))
  assert results["baselines"]["background"]["miou"] == pytest.approx(background / present)


def test_the_committed_results_were_made_with_todays_full_configs():
  today = fingerprint.configs(segmentation.stage_flags(segmentation.FULL, segmentation.WORKDIR))
  fingerprint.check_configs(json.loads(COMMITTED.read_text()), today, COMMAND)
