"""experiments/mpp_study.py --quick end to end: every stage runs and the outputs are written."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # eight short training runs: ~4 min of CPU time
def test_quick_study_writes_results_table_and_plot(tmp_path):
  env = dict(os.environ, PYTHONPATH=REPO)
  env.pop("XLA_FLAGS", None)  # one CPU device, as a user runs it
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.mpp_study",
      "--quick",
      f"--workdir={tmp_path}",
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=REPO,
    timeout=1200,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  results = json.loads((tmp_path / "results" / "results.json").read_text())
  for dataset in ("animal_mnist", "mnist_5k"):
    assert set(results["finetune"][dataset]) == {"scratch", "mpp", "supervised"}
    assert all(0.0 <= v <= 1.0 for v in results["finetune"][dataset].values())
    assert 0.5 < results["baselines"][dataset]["knn3"] <= 1.0
  assert 0.0 <= results["pretrain"]["mpp"]["accuracy"] <= 1.0
  table = (tmp_path / "results" / "table.md").read_text()
  assert "| animal_mnist |" in table and "| mnist_5k |" in table
  assert (tmp_path / "results" / "plot.png").read_bytes()[:4] == b"\x89PNG"
