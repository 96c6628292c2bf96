"""Every config file is built, with and without `runlocal`, for every preset it offers."""

import importlib
import pathlib
import re

import ml_collections
import pytest

from vit_jax import models, stages
from vit_jax.configs import common, pretrain
from vit_jax.train import model_init

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"

# config file -> the arguments that select each of its presets. A config file not listed here
# fails test_every_config_file_is_listed.
ARGS = {
  "pretrain": [
    "dataset=imagenet21k",
    "dataset=jft,model=L/16",
    "dataset=jft,model=H/14",
    "dataset=imagenet21k,model=L/32,epochs=30",
    "dataset=imagenet2012,model=B/32",
    "dataset=fashion_mnist",
    "dataset=imagenet21k,loss=softmax",
    "dataset=imagenet2012,model=S/16,recipe=plain2022",
    "dataset=imagenet21k,model=B/16,recipe=augreg",
    "dataset=jft,model=R50x1,recipe=plain2022",
    "dataset=fashion_mnist,recipe=augreg,aug=light2",
  ],
  "finetune": [
    "dataset=imagenet2012",
    "dataset=cifar10",
    "dataset=cifar100,model=L/16",
    "dataset=oxford_iiit_pet",
    "dataset=oxford_flowers102",
    "dataset=cifar10,holdout=false,lr=0.01",
    "dataset=vtab/clevr_count",
    "dataset=vtab/kitti_dist,holdout=false",
    "dataset=animal_mnist",
    "dataset=mnist_5k",
  ],
  "linear_probe": ["", "dataset=fashion_mnist"],
  "segment": [
    "",
    "dataset=fashion_mnist_seg,head=progressive",
    "dataset=mnist_seg,model=R26x1",
    "dataset=folder,model=B/16,lr=0.01",
  ],
  "detect": [
    "",
    "dataset=animal_mnist_det,model=R26x1",
    "dataset=folder,setting=vitdet",
    "dataset=shards,model=L/16,setting=vitdet,lr=0.0002",
  ],
  "pretrain_mpp": [
    "dataset=jft",
    "dataset=jft,model=L/16,target=downsample4x4",
    "dataset=fashion_mnist",
    "dataset=fashion_mnist,target=l2",
  ],
}
CASES = [(name, arg) for name, args in ARGS.items() for arg in args]

# Top-level fields of a trained stage's config and where each is read (no field nothing reads).
TRAIN_SOURCES = (
  "vit_jax/train/step.py",
  "vit_jax/train/saver.py",
  "vit_jax/train/loop.py",
  "vit_jax/main.py",
  "vit_jax/train/model_init.py",
  "vit_jax/objectives/__init__.py",
)


def _config_files():
  return sorted(
    p.stem for p in CONFIG_DIR.glob("*.py") if p.stem not in ("__init__", "common", "recipes")
  )


def _get(name, arg):
  return importlib.import_module(f"vit_jax.configs.{name}").get_config(arg)


def test_every_config_file_is_listed():
  assert _config_files() == sorted(ARGS)


@pytest.mark.parametrize("name,arg", CASES)
@pytest.mark.parametrize("runlocal", [False, True])
def test_config_builds(name, arg, runlocal):
  arg = ",".join(filter(None, [arg, "runlocal" if runlocal else ""]))
  config = _get(name, arg)
  assert config.stage in stages.STAGES
  assert isinstance(config, ml_collections.ConfigDict)
  if runlocal and "model" in config:
    bit = "R26x1" in arg or "R50x1" in arg  # runlocal shrinks a BiT to the smallest one
    assert config.model.name == ("BiT-R26x1" if bit else "ViT-testing")
  if runlocal and "total_steps" in config:
    assert config.total_steps <= 10
  if config.stage != "linear_probe":
    assert config.batch_size % config.accum_steps == 0
    if not runlocal and arg.startswith("dataset=imagenet21k") and "recipe" not in arg:
      assert config.batch_size == 4096
      assert config.optimizer.weight_decay == 0.03
      assert config.schedule.warmup_steps == 10_000
      assert config.model.dropout_rate == 0.1


@pytest.mark.parametrize("name", sorted(ARGS))
def test_docstring_has_command(name):
  doc = importlib.import_module(f"vit_jax.configs.{name}").__doc__
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
  }
  # The paper's development sets: 1% of ImageNet, 2% of CIFAR, 10% of Pets and Flowers.
  minival = {"imagenet2012": 1, "cifar10": 2, "cifar100": 2, "oxford_iiit_pet": 10}
  minival["oxford_flowers102"] = 10
  for dataset, total in steps.items():
    config = _get("finetune", f"dataset={dataset}")
    assert config.total_steps == total, dataset
    assert config.batch_size == 512
    assert config.optimizer.name == "sgd" and config.optimizer.momentum == 0.9
    assert config.optimizer.weight_decay == 0.0
    assert config.grad_clip_norm == 1.0
    assert config.schedule.name == "warmup_cosine"
    assert config.model.representation_size is None
    pct = minival[dataset]
    assert config.dataset.train_split == f"train[:{100 - pct}%]"
    assert config.evals.minival.split == f"train[{100 - pct}%:]"
    assert not config.init_from_scratch and not config.model_init
    final = _get("finetune", f"dataset={dataset},holdout=false,lr=0.01")
    assert final.dataset.train_split == "train" and "minival" not in final.evals
    assert final.schedule.base_lr == 0.01


# The paper's Table 3: (dataset, model) -> epochs, base lr, decay, weight decay, dropout.
TABLE_3 = {
  ("jft", "B/16"): (7, 8e-4, "linear", 0.1, 0.0),
  ("jft", "B/32"): (7, 8e-4, "linear", 0.1, 0.0),
  ("jft", "L/32"): (7, 6e-4, "linear", 0.1, 0.0),
  ("jft", "L/16"): (14, 4e-4, "linear", 0.1, 0.0),
  ("jft", "H/14"): (14, 3e-4, "linear", 0.1, 0.0),
  ("jft", "R50+B/16"): (7, 8e-4, "linear", 0.1, 0.0),
  ("jft", "R50+L/32"): (7, 2e-4, "linear", 0.1, 0.0),
  ("jft", "R50x1"): (7, 1e-3, "linear", 0.1, None),  # BiT ResNets: no dropout in the model
  ("jft", "R101x1"): (7, 8e-4, "linear", 0.1, None),
  ("jft", "R152x2"): (7, 6e-4, "linear", 0.1, None),
  ("imagenet21k", "B/16"): (90, 1e-3, "linear", 0.03, 0.1),
  ("imagenet21k", "B/32"): (90, 1e-3, "linear", 0.03, 0.1),
  ("imagenet21k", "L/16"): (90, 1e-3, "linear", 0.03, 0.1),
  ("imagenet21k", "L/32"): (90, 1e-3, "linear", 0.03, 0.1),
  ("imagenet2012", "B/16"): (300, 3e-3, "cosine", 0.3, 0.1),
  ("imagenet2012", "L/16"): (300, 3e-3, "cosine", 0.3, 0.1),
}
IMAGES = {"jft": 303_000_000, "imagenet21k": 14_197_122, "imagenet2012": 1_281_167}


@pytest.mark.parametrize("dataset,model", sorted(TABLE_3))
def test_pretrain_recipes_are_the_papers_table_3(dataset, model):
  epochs, lr, decay, wd, dropout = TABLE_3[(dataset, model)]
  config = _get("pretrain", f"dataset={dataset},model={model}")
  assert config.total_steps == round(epochs * IMAGES[dataset] / 4096)
  assert config.schedule.base_lr == lr
  assert config.schedule.name == f"warmup_{decay}"
  assert config.schedule.warmup_steps == 10_000 and config.schedule.end_lr == 0.0
  assert config.batch_size == 4096
  assert config.optimizer.name == "adam" and (config.optimizer.b1, config.optimizer.b2) == (
    0.9,
    0.999,
  )
  assert config.optimizer.weight_decay == wd
  assert config.model.get("dropout_rate") == dropout
  # "For ImageNet we found it beneficial to additionally apply gradient clipping at global norm 1"
  assert config.grad_clip_norm == (1.0 if dataset == "imagenet2012" else 0.0)


def test_every_table_3_entry_names_a_preset():
  for dataset, entries in pretrain.RECIPES.items():
    for name in entries:
      assert models.resolve_name(name) == name, (dataset, name)


def test_pretrain_other_lengths_and_missing_entries():
  # Table 3's second length for L/16 on JFT (7 of "7/14") and L on ImageNet-21k (30 of "30/90").
  assert _get("pretrain", "dataset=jft,model=L/16,epochs=7").total_steps == 517_822
  assert _get("pretrain", "dataset=imagenet21k,model=L/16,epochs=30").total_steps == 103_983
  with pytest.raises(ValueError, match="not 3"):
    _get("pretrain", "dataset=jft,model=B/16,epochs=3")
  with pytest.raises(ValueError, match="no imagenet21k recipe for ViT-H_14"):
    _get("pretrain", "dataset=imagenet21k,model=H/14")
  config = _get("pretrain", "dataset=imagenet21k,model=H/14,epochs=90,lr=1e-3")
  assert config.total_steps == 311_948 and config.schedule.base_lr == 1e-3


def test_pretrain_fewshot_runs_on_downstream_datasets():
  for arg, names in (
    ("dataset=jft", {"imagenet2012", "cifar100", "oxford_iiit_pet"}),
    ("dataset=fashion_mnist", {"animal_mnist", "mnist_5k"}),
  ):
    config = _get("pretrain", arg)
    fewshot = [e for e in config.evals.values() if e.type == "fewshot"]
    assert {e.dataset.name for e in fewshot} == names
    assert config.dataset.name not in names
    config.dataset.image_size = 48  # the downstream images follow the pretraining resolution
    assert all(e.dataset.image_size == 48 for e in fewshot)


def test_pretrain_sigmoid_head_bias():
  assert _get("pretrain", "dataset=jft").model.head_bias_init == -10.0
  assert _get("pretrain", "dataset=jft,loss=softmax").model.head_bias_init == 0.0
  config = _get("pretrain", "dataset=jft")
  assert config.optimizer.weight_decay == 0.1
  assert config.model.representation_size == config.model.hidden_size


@pytest.mark.parametrize("name", ["pretrain", "finetune", "pretrain_mpp", "segment"])
def test_every_top_level_field_is_read(name):
  root = CONFIG_DIR.parent
  source = "\n".join((root / f).read_text() for f in TRAIN_SOURCES)
  for field in _get(name, "runlocal"):
    assert re.search(rf"config\.{field}\b", source), f"config.{field} is read nowhere"


def test_pretrain_mpp_is_the_papers_recipe():
  # App. B.1.2: 1M steps at batch 4096, Adam, base lr 2e-4, 10k warmup, cosine decay; 50% of
  # the patches corrupted, 80% [mask] / 10% random / 10% kept, 3-bit mean colour.
  config = _get("pretrain_mpp", "dataset=jft")
  assert config.loss == "mpp" and config.model.name == "ViT-B_16"
  assert (config.total_steps, config.batch_size) == (1_000_000, 4096)
  assert config.optimizer.name == "adam" and config.schedule.base_lr == 2e-4
  assert config.schedule.warmup_steps == 10_000 and config.schedule.name == "warmup_cosine"
  assert config.mpp.to_dict() == dict(
    target="mean_color", corrupt_rate=0.5, mask_rate=0.8, random_rate=0.1
  )
  assert all(e.type == "fewshot" for e in config.evals.values())
  with pytest.raises(ValueError, match="hybrids"):
    _get("pretrain_mpp", "dataset=jft,model=R50+B/16")
  with pytest.raises(ValueError, match="target='rgb'"):
    _get("pretrain_mpp", "target=rgb")


def test_runlocal_keeps_the_architecture_of_model_init(tmp_path):
  """A runlocal fine-tune from a real checkpoint runs on that checkpoint's architecture (the
  'testing' ViT would not fit it), with the stage's own dropout and head."""
  import jax
  import jax.numpy as jnp

  from vit_jax import checkpoint

  demo = models.get_model_config("demo")
  model = models.get_model(demo, num_classes=10)
  params = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)["params"]
  checkpoint.save(params, tmp_path / "demo.npz")
  config = _get("finetune", "dataset=animal_mnist,runlocal")
  assert config.model.name == "ViT-testing" and config.model_from_init
  config.model_init = str(tmp_path / "demo.npz")
  config.model.dropout_rate = 0.25
  got = model_init.with_init_architecture(config)
  for key in ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers", "classifier"):
    assert got.model[key] == demo[key], key
  assert got.model.dropout_rate == 0.25
  assert got.model.representation_size is None  # fine-tuning drops the representation layer
  assert config.model.name == "ViT-testing"  # the caller's config is left as it was
  assert not _get("finetune", "dataset=animal_mnist").model_from_init


def test_the_vitdet_setting_is_the_papers():
  # Li et al. (2022), ViTDet's ViT-B on COCO: 1024px, 14x14 windows with global blocks 2, 5, 8,
  # 11, a pyramid of strides 4 to 32 from the stride-16 map, AdamW with weight decay 0.1.
  config = _get("detect", "dataset=folder,setting=vitdet")
  assert config.dataset.image_size == 1024 and config.model.name == "ViT-B_16"
  assert config.model.window_size == 14 and tuple(config.model.global_blocks) == (2, 5, 8, 11)
  assert config.model.stochastic_depth == 0.1 and config.total_steps == 184_375
  assert tuple(config.detection.pyramid_scales) == (4.0, 2.0, 1.0, 0.5)
  assert config.optimizer.weight_decay == 0.1 and config.schedule.base_lr == 1e-4
  assert config.dataset.pp_train.startswith("scale_jitter(0.1,2.0)")
