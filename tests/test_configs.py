"""Every config file is built, with and without `runlocal`, for every preset it offers."""

import importlib
import pathlib
import re

import ml_collections
import pytest

from configs import common

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"

# config file -> the arguments that select each of its presets. A config file not listed here
# fails test_every_config_file_is_listed.
ARGS = {
  "pretrain": [
    "dataset=imagenet21k",
    "dataset=jft,model=L/16",
    "dataset=fashion_mnist",
    "dataset=imagenet21k,loss=softmax",
  ],
  "finetune": [
    "dataset=imagenet2012",
    "dataset=cifar10",
    "dataset=cifar100,model=L/16",
    "dataset=oxford_iiit_pet",
    "dataset=oxford_flowers102",
    "dataset=vtab,vtab_task=dtd",
    "dataset=animal_mnist",
  ],
  "linear_probe": ["", "dataset=fashion_mnist"],
}
CASES = [(name, arg) for name, args in ARGS.items() for arg in args]

# Top-level fields of a trained stage's config and where each is read (no field nothing reads).
TRAIN_SOURCES = ("vit_jax/train.py", "vit_jax/main.py")


def _config_files():
  return sorted(p.stem for p in CONFIG_DIR.glob("*.py") if p.stem not in ("__init__", "common"))


def _get(name, arg):
  return importlib.import_module(f"configs.{name}").get_config(arg)


def test_every_config_file_is_listed():
  assert _config_files() == sorted(ARGS)


@pytest.mark.parametrize("name,arg", CASES)
@pytest.mark.parametrize("runlocal", [False, True])
def test_config_builds(name, arg, runlocal):
  arg = ",".join(filter(None, [arg, "runlocal" if runlocal else ""]))
  config = _get(name, arg)
  assert config.stage in ("pretrain", "finetune", "linear_probe")
  assert isinstance(config, ml_collections.ConfigDict)
  if runlocal and "model" in config:
    assert config.model.name == "ViT-testing"
  if runlocal and "total_steps" in config:
    assert config.total_steps <= 10
  if config.stage in ("pretrain", "finetune"):
    assert config.batch_size % config.accum_steps == 0
    if not runlocal and arg.startswith("dataset=imagenet21k"):
      assert config.batch_size == 4096
      assert config.optimizer.weight_decay == 0.03
      assert config.schedule.warmup_steps == 10_000
      assert config.model.dropout_rate == 0.1


@pytest.mark.parametrize("name", sorted(ARGS))
def test_docstring_has_command(name):
  doc = importlib.import_module(f"configs.{name}").__doc__
  assert f"python -m vit_jax.main --config=configs/{name}.py" in doc


def test_parse_arg():
  arg = common.parse_arg(
    "model=B/16, steps=3,runlocal,lr=0.5", model="", steps=1, lr=0.1, runlocal=False
  )
  assert arg.to_dict() == dict(model="B/16", steps=3, lr=0.5, runlocal=True)
  with pytest.raises(ValueError, match="unknown config argument 'modle'"):
    common.parse_arg("modle=B/16", model="")
  with pytest.raises(ValueError, match="needs a value"):
    common.parse_arg("model", model="")


def test_unknown_preset_is_an_error():
  with pytest.raises(ValueError, match="dataset"):
    _get("finetune", "dataset=imagenet")


def test_locked_config_rejects_typos():
  config = _get("finetune", "dataset=cifar10")
  config.lock()
  with pytest.raises(AttributeError):
    config.totl_steps = 3
  with pytest.raises(AttributeError):
    config.schedule.base_learning_rate = 0.1


def test_finetune_presets_match_the_paper():
  steps = {
    "imagenet2012": 20_000,
    "cifar10": 10_000,
    "cifar100": 10_000,
    "oxford_iiit_pet": 500,
    "oxford_flowers102": 500,
    "vtab": 2_500,
  }
  for dataset, total in steps.items():
    config = _get("finetune", f"dataset={dataset}")
    assert config.total_steps == total, dataset
    assert config.batch_size == 512
    assert config.optimizer.to_dict() == dict(name="sgd", momentum=0.9, weight_decay=0.0)
    assert config.grad_clip_norm == 1.0
    assert config.schedule.name == "warmup_cosine"
    assert config.model.representation_size is None


def test_pretrain_sigmoid_head_bias():
  assert _get("pretrain", "dataset=jft").model.head_bias_init == -10.0
  assert _get("pretrain", "dataset=jft,loss=softmax").model.head_bias_init == 0.0
  config = _get("pretrain", "dataset=jft")
  assert config.optimizer.weight_decay == 0.1
  assert config.model.representation_size == config.model.hidden_size


@pytest.mark.parametrize("name", ["pretrain", "finetune"])
def test_every_top_level_field_is_read(name):
  root = CONFIG_DIR.parent
  source = "\n".join((root / f).read_text() for f in TRAIN_SOURCES)
  for field in _get(name, "runlocal"):
    assert re.search(rf"config\.{field}\b", source), f"config.{field} is read nowhere"
