"""AugReg in miniature (experiments/small_data.py): its arms' configs, and `--quick` end to end
(slow), compared with the committed results' fingerprint."""

import json

import pytest

from experiments import fingerprint, small_data
from tests.helpers import REPO, experiment_run
from vit_jax.runtime import config_files


@pytest.mark.parametrize("arm", list(small_data.ARMS))
def test_every_arm_is_a_stage_config_with_the_same_budget(arm):
  profile = small_data.FULL
  config = config_files.from_flags(small_data.pretrain_flags(arm, 600, 1, profile, "/tmp/teacher"))
  assert (config.total_steps, config.batch_size, config.seed) == (1_500, 128, 1)
  assert config.dataset.train_split == "train[:600]"
  assert config.dataset.eval_split == "test"
  vit = arm != "bit"
  assert ("posemb" in config.model) == vit
  if vit:
    assert config.model.posemb == ("learn" if arm == "paper" else "sincos2d")
    assert not config.model.distill_token  # GAP (plain2022) has no class token to pair with
  assert config.distill.teacher == ("/tmp/teacher" if arm == "distill" else "")


@pytest.mark.slow  # eight training stages (a few minutes on 2 shared cores)
def test_quick_study_end_to_end(tmp_path):
  experiment_run.run("small_data", "--quick", f"--workdir={tmp_path}")
  results = json.loads((tmp_path / "results" / "results.json").read_text())
  assert (tmp_path / "results" / "small_data.png").read_bytes()[:4] == b"\x89PNG"
  assert (tmp_path / "results" / "table.md").read_text().strip() == small_data.table(results)
  (row,) = results["fractions"].values()
  assert row["train_examples"] == small_data.QUICK.fractions[0]
  assert list(row["arms"]) == list(small_data.ARMS)
  for arm in row["arms"].values():
    assert 0.0 <= arm["val"] <= 1.0 and 0.0 <= arm["transfer"] <= 1.0
  committed = json.loads((REPO / "experiments/results/small_data/results.json").read_text())
  fingerprint.check(committed, results, "python -m experiments.small_data")


def test_the_committed_results_were_made_with_todays_full_configs():
  committed = json.loads((REPO / "experiments/results/small_data/results.json").read_text())
  seeds = committed["seeds"]
  today = fingerprint.configs(small_data.stage_flags(small_data.FULL, small_data.WORKDIR, seeds))
  fingerprint.check_configs(committed, today, "python -m experiments.small_data")
