"""experiments/mpp_study.py --quick end to end: every stage runs, the outputs are written, and
its numbers are the committed results' fingerprint (experiments/fingerprint.py)."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from experiments import fingerprint, mpp_study
from tests.helpers import REPO, experiment_run
from vit_jax import inference
from vit_jax.input_pipeline.sources import builtin

COMMITTED = os.path.join(REPO, "experiments/results/mpp_study/results.json")
COMMAND = "python -m experiments.mpp_study"


@pytest.mark.slow  # eight short training runs: ~4 min of CPU time
def test_quick_study_writes_results_table_and_plot(tmp_path):
  args = ["--quick", f"--workdir={tmp_path}", f"--out={tmp_path / 'results'}"]
  experiment_run.run("mpp_study", *args)  # one CPU device, XLA's defaults: as a user runs it
  results = json.loads((tmp_path / "results" / "results.json").read_text())
  for dataset in ("animal_mnist", "mnist_5k"):
    assert set(results["finetune"][dataset]) == {"scratch", "mpp", "supervised"}
    # Each reported accuracy is its workdir's on test[:200] (the split of the baselines too),
    # recomputed through predict (PIL's resize where the evaluator used TensorFlow's: near-ties
    # may flip; 4 of 200 are allowed).
    assert results["baselines"][dataset]["test_examples"] == 200
    images, labels = builtin.get_split(dataset, "test[:200]")
    for init, reported in results["finetune"][dataset].items():
      clf = inference.Classifier(str(tmp_path / f"finetune_{dataset}_{init}"))
      probabilities = clf.probabilities([Image.fromarray(image[..., 0]) for image in images])
      accuracy = np.mean(probabilities.argmax(-1) == labels)
      assert accuracy == pytest.approx(reported, abs=4 / 200), (dataset, init)
    assert 0.5 < results["baselines"][dataset]["knn3"] <= 1.0
  # MPP's accuracy is that of the corrupted patches' 3-bit mean colours (512 classes): chance
  # is 1/512; a few steps learn the commonest colours.
  assert results["pretrain"]["mpp"]["accuracy"] > 2 / 512
  table = (tmp_path / "results" / "table.md").read_text()
  assert "| animal_mnist |" in table and "| mnist_5k |" in table
  assert (tmp_path / "results" / "plot.png").read_bytes()[:4] == b"\x89PNG"
  with open(COMMITTED) as f:
    fingerprint.check(json.load(f), results, COMMAND)


def test_the_committed_results_were_made_with_todays_full_configs():
  today = fingerprint.configs(mpp_study.stage_configs(mpp_study.FULL, mpp_study.WORKDIR))
  with open(COMMITTED) as f:
    fingerprint.check_configs(json.load(f), today, COMMAND)
