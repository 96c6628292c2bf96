"""The ViT-vs-BiT scale study (experiments/scale_study.py): its protocol pieces, and `--quick`
end to end (slow), including a rerun that skips every finished run, compared with the committed
results' fingerprint (experiments/fingerprint.py)."""

import json

import numpy as np
import pytest
from PIL import Image

from experiments import fingerprint, scale_study
from tests.helpers import REPO, experiment_run
from vit_jax import inference
from vit_jax.input_pipeline.sources import builtin
from vit_jax.runtime import config_files

COMMITTED = REPO / "experiments/results/scale_study/results.json"
COMMAND = "python -m experiments.scale_study"


def test_learning_rate_is_picked_on_the_held_out_split():
  assert scale_study.select_learning_rate({0.01: 0.80, 0.03: 0.85, 0.1: 0.70}) == 0.03
  assert scale_study.select_learning_rate({0.03: 0.5, 0.01: 0.5}) == 0.01  # ties: the smaller
  with pytest.raises(ValueError, match="no fine-tuning run"):
    scale_study.select_learning_rate({})


def test_stage_flags_follow_the_protocol():
  profile = scale_study.FULL
  vit = scale_study.pretrain_args("ViT", 16, profile)
  assert "--config.dataset.train_split=train[:3750]" in vit
  bit = scale_study.pretrain_args("BiT", 1, profile)
  assert bit[0].endswith("model=R26x1") and "--config.dataset.train_split=train" in bit
  # Same recipe and steps for both families and every subset.
  strip = lambda args: [a for a in args if "model" not in a and "train_split" not in a]  # noqa: E731
  assert strip(vit) == strip(bit)
  ft = scale_study.finetune_args("BiT", "/w/pre", "mnist_5k", 0.03, profile)
  assert "--config.dataset.train_split=train[:98%]" in ft
  assert "--config.evals.val.split=train[98%:]" in ft  # the learning rate's held-out split
  assert "--config.dataset.name=mnist_5k" in ft and "--config.model_init=/w/pre" in ft


def _config_of(args: list[str]):
  """The stage config that `python -m vit_jax.main ARGS` builds, every override applied; a flag
  naming a field the config lacks raises KeyError (as the stage would fail at startup)."""
  path, _, arg = args[0].removeprefix("--config=").partition(":")
  module = config_files.load(path)
  config = module.get_config(arg)
  for flag in args[1:]:
    key, _, value = flag.removeprefix("--config.").partition("=")
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    if leaf not in node:
      raise KeyError(f"{flag}: the config has no field {key}")
    node[leaf] = type(node[leaf])(value) if node[leaf] is not None else value
  return config


@pytest.mark.parametrize("profile", ["FULL", "QUICK"])
@pytest.mark.parametrize("family", ["ViT", "BiT"])
def test_stage_flags_name_fields_the_configs_have(family, profile):
  """Every override the study passes exists in the stage config (a renamed field fails here,
  not an hour into the full run)."""
  profile = getattr(scale_study, profile)
  config = _config_of(scale_study.pretrain_args(family, 4, profile))
  assert config.total_steps == profile.pretrain_steps
  assert config.dataset.train_split == "train[:15000]"
  if family == "ViT":  # the demo's ViT (runlocal narrows it), pre-logits as wide as its blocks
    width = 64 if profile is scale_study.FULL else config.model.hidden_size
    assert (config.model.hidden_size, config.model.representation_size) == (width, width)
  assert all(e.every_steps == 0 for k, e in config.evals.items() if k.startswith("fewshot_"))
  ft = _config_of(scale_study.finetune_args(family, "/w/pre", "mnist_5k", 0.1, profile))
  assert ft.schedule.base_lr == 0.1 and ft.dataset.name == "mnist_5k"
  assert ft.total_steps == profile.finetune_steps


@pytest.mark.slow  # four training stages (minutes on 2 shared cores)
def test_quick_study_end_to_end_and_resume(tmp_path):
  args = ["--quick", f"--workdir={tmp_path}", f"--out={tmp_path / 'out'}"]
  out = experiment_run.run("scale_study", *args, timeout=1800)  # as a user runs it
  assert out.stdout.count("python -m vit_jax.main") == 4  # 2 pretrain + 2 fine-tune, printed

  results = json.loads((tmp_path / "out" / "results.json").read_text())
  # The outputs are the study's state in the workdir, which a rerun resumes from, with the
  # provenance of the run that wrote them (experiments/common.py write_results).
  provenance = results.pop("provenance")
  assert provenance["commit"] and provenance["machine"]["cores"] >= 1
  assert json.loads((tmp_path / "results.json").read_text()) == results
  runs = results["runs"]
  assert set(runs) == {"ViT/1of16", "BiT/1of16"}  # 3,750 pretraining images
  for key, run in runs.items():
    assert run["pretrain_flops"] > 0
    # The upstream top-1 is the stage's own val evaluation: runlocal stops it after the batch
    # holding its first 64 rows (configs/common.py), i.e. one eval batch of Fashion-MNIST's test
    # split (250 images), of which a whole number are right.
    family, fraction = key.split("/")
    stage = json.loads((tmp_path / "pretrain" / family / fraction / "metrics.json").read_text())
    n = scale_study.QUICK.eval_batch_size
    assert stage["val/num_examples"] == n == 250
    assert run["upstream_val_accuracy"] == stage["val/accuracy"]
    assert run["upstream_val_accuracy"] * n == pytest.approx(
      round(run["upstream_val_accuracy"] * n)
    )
    assert set(run["fewshot"]) == {"animal_mnist", "mnist_5k"}
    assert run["finetune"]["animal_mnist"]["learning_rate"] == 0.01
  assert runs["BiT/1of16"]["pretrain_examples"] == 3750
  # Each reported test accuracy is its chosen workdir's on the whole test split, recomputed
  # here through predict (PIL's resize where the evaluator used TensorFlow's: a rounding apart,
  # which can flip near-ties; 10 of the 1,000 images are allowed).
  images, labels = builtin.get_split("animal_mnist", "test")
  for key, run in runs.items():
    family, fraction = key.split("/")
    chosen = run["finetune"]["animal_mnist"]
    workdir = (
      tmp_path / "finetune" / family / fraction / "animal_mnist" / str(chosen["learning_rate"])
    )
    probabilities = inference.Classifier(str(workdir)).probabilities(
      [Image.fromarray(image[..., 0]) for image in images]
    )
    accuracy = np.mean(probabilities.argmax(-1) == labels)
    assert accuracy == pytest.approx(chosen["test_accuracy"], abs=0.01), key
  # The compute curve: checkpoints at steps 3 and 6, the last one the run's own result.
  bit = runs["BiT/1of16"]
  curve = bit["fewshot_curve"]
  assert [c["step"] for c in curve] == [3, 6] and curve[-1]["fewshot"] == bit["fewshot"]
  assert curve[0]["flops"] * 2 == curve[1]["flops"] == bit["pretrain_flops"]
  baselines = results["baselines"]
  assert baselines["animal_mnist"]["2shot"]["train_examples"] == 20  # the evaluator's 2 per class
  assert baselines["animal_mnist"]["finetune"]["train_examples"] == 8820  # train[:98%]
  assert 0.5 < baselines["animal_mnist"]["finetune"]["knn3"] <= 1
  table = (tmp_path / "out" / "results.md").read_text()
  assert table.count("\n| ViT |") == 2 and table.count("\n| BiT |") == 2  # 2 downstream sets
  for name in ("accuracy_vs_data.png", "accuracy_vs_compute.png"):
    assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

  again = experiment_run.run("scale_study", *args, timeout=600)
  assert "python -m vit_jax.main" not in again.stdout
  assert again.stdout.count("finished earlier") == 4
  assert json.loads((tmp_path / "out" / "results.json").read_text())["runs"] == runs
  # The committed results are what today's code computes: their fingerprint is these numbers.
  fingerprint.check(json.loads(COMMITTED.read_text()), results, COMMAND)


def test_the_committed_results_were_made_with_todays_full_configs():
  today = fingerprint.configs(scale_study.stage_flags(scale_study.FULL, scale_study.WORKDIR))
  fingerprint.check_configs(json.loads(COMMITTED.read_text()), today, COMMAND)
