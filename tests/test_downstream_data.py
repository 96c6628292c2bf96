"""Downstream evaluators read their own datasets from their own `data_dir`, never from the
pretraining shards' directory: the JFT-style pretraining preset on make_shards shards."""

import json
import subprocess
import sys

import pytest

# Imported at collection, while the process has one thread (see tests/test_input_sources.py).
from tensorflow_datasets.testing import mocking as tfds_mocking

from tests.helpers import REPO, xla_env
from vit_jax import evaluators
from vit_jax.input_pipeline.sources import base as source
from vit_jax.input_pipeline.sources import tfds_source
from vit_jax.tools import make_shards

DOWNSTREAM = {"imagenet2012", "cifar100", "oxford_iiit_pet"}


def _jft_shards(directory) -> str:
  for split in ("train", "test"):
    make_shards.shard_builtin("digits", split, str(directory), 2, name="jft")
  return str(directory)


def _config(shards: str):
  from vit_jax.configs import pretrain

  config = pretrain.get_config("dataset=jft,runlocal")
  config.dataset.data_dir = shards
  config.dataset.eval_split = "test"
  return config


def test_fewshot_evaluators_take_their_own_data_dir(tmp_path):
  config = _config(str(tmp_path / "shards"))
  entries = {k: e for k, e in config.evals.items() if e.type == "fewshot"}
  assert {e.dataset.name for e in entries.values()} == DOWNSTREAM
  for entry in entries.values():
    assert evaluators.downstream_dataset(config.dataset, entry.dataset)["data_dir"] is None
  config.evals.fewshot_cifar100.dataset.data_dir = "gs://bucket/tfds"
  cifar = evaluators.downstream_dataset(config.dataset, config.evals.fewshot_cifar100.dataset)
  assert cifar["data_dir"] == "gs://bucket/tfds"
  # The stage's own evaluator, and an entry of the same dataset, keep the shards' directory.
  assert evaluators.downstream_dataset(config.dataset, None)["data_dir"] == str(tmp_path / "shards")
  same = evaluators.downstream_dataset(config.dataset, {"name": "jft", "eval_split": "train"})
  assert same["data_dir"] == str(tmp_path / "shards")
  # An entry a user adds without a data_dir does not inherit the shards' directory either.
  assert evaluators.downstream_dataset(config.dataset, {"name": "cifar10"}).get("data_dir") is None


@pytest.mark.slow  # three tfds builders under mock data, CIFAR-100 read (~25 s on 2 cores)
def test_pretraining_evaluators_read_downstream_sets_from_tfds(tmp_path, monkeypatch):
  import jax
  import jax.numpy as jnp

  from vit_jax import models

  config = _config(_jft_shards(tmp_path / "shards"))
  opened = []
  builder = tfds_source.tfds_builder

  def spy(dataset):
    opened.append((dataset.name, dataset.data_dir))
    return builder(dataset)

  monkeypatch.setattr(tfds_source, "tfds_builder", spy)
  model = models.get_model(config.model, 10)
  size = config.dataset.image_size
  params = model.init(jax.random.key(0), jnp.zeros((1, size, size, 3)), train=False)["params"]
  with tfds_mocking.mock_data(num_examples=8, policy=tfds_mocking.MockPolicy.USE_CODE):
    built = {
      e.name: e
      for e in evaluators.build(config.evals, model=model, dataset=config.dataset, batch_size=8)
    }
    assert set(built) == {"val", "fewshot_imagenet", "fewshot_cifar100", "fewshot_pets"}
    # Building asked each downstream set's tfds builder for its classes; CIFAR-100 is read too.
    metrics = built["fewshot_cifar100"].run(params)
  assert {name for name, _ in opened} == DOWNSTREAM
  assert {data_dir for _, data_dir in opened} == {None}  # tfds's default, not the shards'
  assert {"fewshot_cifar100/1shot", "fewshot_cifar100/2shot"} <= set(metrics)
  assert (
    built["val"].run(params)["val/num_examples"] == 64
  )  # runlocal's max_examples, from the shards


def _main(tmp_path, config: str, *flags: str) -> tuple[subprocess.CompletedProcess, str]:
  """vit_jax.main with `config` on digits shards named jft (train and test splits)."""
  shards = _jft_shards(tmp_path / "shards")
  env = xla_env.child_env(TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
  out = subprocess.run(
    [sys.executable, "-m", "vit_jax.main", f"--config=configs/pretrain.py:{config}"]
    + [f"--config.dataset.data_dir={shards}", "--config.dataset.eval_split=test", *flags]
    + [f"--workdir={tmp_path / 'pt'}"],
    capture_output=True,
    text=True,
    env=env,
    cwd=REPO,
    timeout=300,
  )
  return out, shards


def test_command_line_points_an_evaluator_elsewhere(tmp_path):
  # The README's JFT command on a laptop, without runlocal: its downstream sets are not there.
  tfds_dir = tmp_path / "tfds"
  flags = [
    f"--config.evals.fewshot_{n}.dataset.data_dir={tfds_dir}"
    for n in ("imagenet", "cifar100", "pets")
  ]
  out, shards = _main(tmp_path, "dataset=jft,model=testing,epochs=1,lr=0.001", *flags)
  # No tfds data there (no network): the run stops at startup in one line naming the first
  # evaluator without data, the others, the directory it was given and both ways out.
  assert out.returncode == 1
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(
    "vit_jax: error: MissingDataError: evals.fewshot_cifar100 has no data (so have "
    "evals.fewshot_imagenet, evals.fewshot_pets): Cannot read split 'train' of tfds dataset "
    f"'cifar100' (data_dir='{tfds_dir}')"
  ), last
  assert (
    "; give it its data (--config.evals.fewshot_cifar100.dataset.data_dir=<dir>) or switch it "
    "off (--config.evals.fewshot_cifar100.every_steps=-1) (full log: "
  ) in last, last
  assert shards not in last
  saved = json.loads((tmp_path / "pt" / "config.json").read_text())
  assert saved["evals"]["fewshot_pets"]["dataset"]["data_dir"] == str(tfds_dir)


def _build(config, caplog) -> list[str]:
  """The names of the evaluators `config.evals` builds (nothing is run)."""
  from vit_jax import models

  model = models.get_model(config.model, 10)
  with caplog.at_level("WARNING"):
    return [e.name for e in evaluators.build(config.evals, model=model, dataset=config.dataset)]


def test_runlocal_leaves_out_downstream_sets_that_are_not_there(tmp_path, caplog):
  config = _config(_jft_shards(tmp_path / "shards"))
  for entry in config.evals.values():
    if entry.type == "fewshot":
      entry.dataset.data_dir = str(tmp_path / "tfds")  # empty: none of them is there
  assert _build(config, caplog) == ["val"]
  lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert len(lines) == 3 and all("\n" not in line for line in lines), lines
  assert lines[0].startswith(
    "runlocal: evals.fewshot_cifar100 left out, its data is not there: Cannot read split "
    f"'train' of tfds dataset 'cifar100' (data_dir='{tmp_path / 'tfds'}')"
  ), lines[0]
  assert [line.split()[1] for line in lines] == [
    "evals.fewshot_cifar100",
    "evals.fewshot_imagenet",
    "evals.fewshot_pets",
  ]
  # Without runlocal's mark the run stops; switched off, an evaluator's data is never opened.
  caplog.clear()
  config.evals.fewshot_pets.skip_if_missing = False
  with pytest.raises(source.MissingDataError, match=r"^evals\.fewshot_pets has no data: "):
    _build(config, caplog)
  config.evals.fewshot_pets.every_steps = -1
  assert _build(config, caplog) == ["val"]
  assert "fewshot_pets" not in caplog.text
  # The stage's own evaluator is never left out: its split not there is the stage's mistake.
  config.dataset.eval_split = "val"
  with pytest.raises(source.MissingDataError, match=r"--config\.dataset\.eval_split / data_dir"):
    _build(config, caplog)


@pytest.mark.slow  # 6 steps and the evaluators of the stage's own data: 26-35 s on 2 cores
def test_the_readme_jft_command_runs_locally_without_the_downstream_sets(tmp_path):
  out, _ = _main(tmp_path, "dataset=jft,model=testing,epochs=1,lr=0.001,runlocal")
  lines = (out.stdout + out.stderr).splitlines()
  assert out.returncode == 0, "\n".join(lines[-20:])
  left_out = [line for line in lines if "runlocal: evals." in line]
  assert len(left_out) == 3 and all(" WARNING runlocal: " in line for line in left_out), left_out
  metrics = json.loads((tmp_path / "pt" / "final_metrics.json").read_text())
  assert "val/accuracy" in metrics and not [k for k in metrics if k.startswith("fewshot_")]
