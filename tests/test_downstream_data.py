"""Downstream evaluators read their own datasets from their own `data_dir`, never from the
pretraining shards' directory: the JFT-style pretraining preset on make_shards shards."""

import json
import os
import subprocess
import sys

import pytest

# Imported at collection, while the process has one thread (see tests/test_input_sources.py).
from tensorflow_datasets.testing import mocking as tfds_mocking

from vit_jax import evaluators
from vit_jax.input_pipeline import sources
from vit_jax.tools import make_shards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
  builder = sources._tfds_builder

  def spy(dataset):
    opened.append((dataset.name, dataset.data_dir))
    return builder(dataset)

  monkeypatch.setattr(sources, "_tfds_builder", spy)
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


def test_command_line_points_an_evaluator_elsewhere(tmp_path):
  shards = _jft_shards(tmp_path / "shards")
  tfds_dir = tmp_path / "tfds"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  flags = [
    f"--config.evals.fewshot_{n}.dataset.data_dir={tfds_dir}"
    for n in ("imagenet", "cifar100", "pets")
  ]
  out = subprocess.run(
    [sys.executable, "-m", "vit_jax.main", "--config=configs/pretrain.py:dataset=jft,runlocal"]
    + [f"--config.dataset.data_dir={shards}", "--config.dataset.eval_split=test"]
    + flags
    + [f"--workdir={tmp_path / 'pt'}"],
    capture_output=True,
    text=True,
    env=env,
    cwd=REPO,
    timeout=300,
  )
  # No tfds data there (no network): the run stops at startup naming the directory it was given.
  assert out.returncode == 1
  last = out.stderr.strip().splitlines()[-1]
  assert f"(data_dir='{tfds_dir}')" in last and shards not in last, last
  saved = json.loads((tmp_path / "pt" / "config.json").read_text())
  assert saved["evals"]["fewshot_pets"]["dataset"]["data_dir"] == str(tfds_dir)
