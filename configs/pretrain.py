r"""Pretraining (ViT paper §4.1, App. B.1): ImageNet-21k, JFT-like shards, ImageNet, or the CPU demo.

Arguments (`configs/pretrain.py:key=value,...`, see configs/common.py):
  dataset   imagenet21k | jft | imagenet2012 | fashion_mnist (demo)     default imagenet21k
  model     a vit_jax.models preset, e.g. B/16, L/16, H/14, or a     default B/16 (demo for the demo)
            BiT ResNet, e.g. R50x1
  epochs    0: the paper's (Table 3); or e.g. 7 / 14 (JFT), 30 / 90 (ImageNet-21k)
  lr        0: the paper's base learning rate for this model and dataset (Table 3)
  loss      sigmoid | softmax                                        default sigmoid (softmax for
            imagenet2012 and the demo)
  recipe    paper | augreg | plain2022 (configs/recipes.py)          default paper (the demo:
            DEMO_RECIPE)
  aug       augreg / plain2022's augmentation level: none, light1, light2, medium1, medium2,
            strong1, strong2                                         default the recipe's own
  runlocal  shrink to a seconds-long CPU run

Recipe, exactly the paper's Table 3 (`RECIPES` below; all: Adam β1=0.9, β2=0.999, batch 4096,
10k steps of linear warmup, decoupled weight decay on kernels, training resolution 224):

  model               dataset        epochs   base lr   decay    weight decay   dropout
  ViT-B/{16,32}       JFT-300M       7        8e-4      linear   0.1            0.0
  ViT-L/32            JFT-300M       7        6e-4      linear   0.1            0.0
  ViT-L/16            JFT-300M       7/14     4e-4      linear   0.1            0.0
  ViT-H/14            JFT-300M       14       3e-4      linear   0.1            0.0
  R50x1 (BiT)         JFT-300M       7        1e-3      linear   0.1            0.0
  R101x1 (BiT)        JFT-300M       7        8e-4      linear   0.1            0.0
  R152x{1,2} (BiT)    JFT-300M       7        6e-4      linear   0.1            0.0
  R50+ViT-B/16        JFT-300M       7        8e-4      linear   0.1            0.0
  R50+ViT-L/32        JFT-300M       7        2e-4      linear   0.1            0.0
  ViT-B/{16,32}       ImageNet-21k   90       1e-3      linear   0.03           0.1
  ViT-L/{16,32}       ImageNet-21k   30/90    1e-3      linear   0.03           0.1
  ViT-* (and hybrids) ImageNet       300      3e-3      cosine   0.3            0.1

Where the table gives two lengths the default is the longer (the one of the paper's Table 2
models); `epochs=` picks the other. Hybrids train with their ViT counterpart's setup (App. B.1).
Gradients are clipped at global norm 1 for ImageNet only ("For ImageNet we found it beneficial to
additionally apply gradient clipping", Table 3); not for JFT and ImageNet-21k. A model with no
entry for the dataset (e.g. ViT-H/14 on ImageNet-21k, ViT-Ti) is an error unless both `lr=` and
`epochs=` are given. Epochs become steps with the datasets' sizes (JFT-300M 303M images,
ImageNet-21k 14,197,122, ImageNet 1,281,167): ViT-B/16 on ImageNet-21k takes 311,948 steps.
The head: a Dense+tanh representation layer of the hidden width, then sigmoid cross-entropy with
the head bias initialised to −10 (JFT and ImageNet-21k are multi-label) or softmax with bias 0.

Evaluation during pretraining: validation top-1 on the pretraining set's held-out split, and the
paper's few-shot linear evaluation (Fig. 3-4: 1, 5, 10, 25 shots, closed-form ridge on the frozen
pre-logits) on *downstream* datasets, one evaluator each (`evals.fewshot_<name>`): ImageNet,
CIFAR-100 and Oxford-IIIT Pets (tfds) for the pod presets, Animal-MNIST and MNIST-5k for the demo.
Each evaluator reads its downstream training split once and keeps only the few-shot sample, from
its own `data_dir`, never the pretraining shards' directory: tfds's default
(`~/tensorflow_datasets` or `$TFDS_DATA_DIR`) unless set, e.g.
`--config.evals.fewshot_cifar100.dataset.data_dir=gs://$BUCKET/tfds` (likewise
`fewshot_imagenet`, `fewshot_pets`).

Commands (TPU VM; on a multi-host slice run the same line on every worker, e.g.
`gcloud compute tpus tpu-vm ssh $TPU --worker=all --command="cd vit_jax && ..."`):

  python -m vit_jax.main --config=configs/pretrain.py:dataset=imagenet21k,model=B/16 \
      --workdir=gs://$BUCKET/vit_b16_i21k
  python -m vit_jax.main --config=configs/pretrain.py:dataset=jft,model=L/16,epochs=7 \
      --config.dataset.data_dir=gs://$BUCKET/jft_shards --workdir=gs://$BUCKET/vit_l16_jft \
      --config.evals.fewshot_imagenet.dataset.data_dir=gs://$BUCKET/tfds \
      --config.evals.fewshot_cifar100.dataset.data_dir=gs://$BUCKET/tfds \
      --config.evals.fewshot_pets.dataset.data_dir=gs://$BUCKET/tfds
  python -m vit_jax.main --config=configs/pretrain.py:dataset=imagenet2012,model=B/16 \
      --workdir=gs://$BUCKET/vit_b16_i1k

Expected (paper Tables 2 and 5, after fine-tuning at 384px): ViT-B/16 from ImageNet-21k
83.97% ImageNet top-1 and 98.95% CIFAR-10; ViT-L/16 from JFT-300M (14 epochs) 87.76% ImageNet;
ViT-B/16 from ImageNet alone 77.91%.

CPU demo on the offline Fashion-MNIST (the `builtin` source reads the Debian package's files;
not a paper recipe: the 'demo' ViT, softmax, 32px, batch 128, 6,000 steps (12.8 epochs) of Adam at
lr 1e-3 with a cosine decay; what it reaches: experiments/results/demo/):

  python -m vit_jax.main --config=configs/pretrain.py:dataset=fashion_mnist \
      --workdir=/tmp/vit_pt

is the pretraining stage of experiments/demo.py, which prints what it reaches beside raw-pixel
baselines on the same splits.
"""

import ml_collections
from ml_collections import config_dict

from vit_jax import models
from vit_jax.configs import common, recipes

# Images per epoch of each pretraining set (the paper's sizes).
EPOCH_SIZES = {"jft": 303_000_000, "imagenet21k": 14_197_122, "imagenet2012": 1_281_167}

# The paper's Table 3: dataset -> preset name -> (epochs (default first), base_lr). The other
# columns are per dataset (_DATASET_RECIPES). Hybrids use their ViT counterpart's row.
RECIPES: dict[str, dict[str, tuple[tuple[int, ...], float]]] = {
  "jft": {
    "ViT-B_16": ((7,), 8e-4),
    "ViT-B_32": ((7,), 8e-4),
    "ViT-L_32": ((7,), 6e-4),
    "ViT-L_16": ((14, 7), 4e-4),
    "ViT-H_14": ((14,), 3e-4),
    "BiT-R50x1": ((7,), 1e-3),
    "BiT-R101x1": ((7,), 8e-4),
    "BiT-R152x2": ((7,), 6e-4),
    "R50+ViT-B_16": ((7,), 8e-4),
    "R50+ViT-L_32": ((7,), 2e-4),
  },
  "imagenet21k": {
    "ViT-B_16": ((90,), 1e-3),
    "ViT-B_32": ((90,), 1e-3),
    "ViT-L_16": ((90, 30), 1e-3),
    "ViT-L_32": ((90, 30), 1e-3),
    "R50+ViT-B_16": ((90,), 1e-3),
    "R50+ViT-L_32": ((90, 30), 1e-3),
  },
  "imagenet2012": {
    name: ((300,), 3e-3)
    for name in (
      "ViT-B_16",
      "ViT-B_32",
      "ViT-L_16",
      "ViT-L_32",
      "ViT-H_14",
      "R50+ViT-B_16",
      "R50+ViT-L_32",
    )
  },
}

# Columns of Table 3 shared by every model of a dataset, and each dataset's data fields.
_DATASET_RECIPES = {
  "jft": dict(
    # Multi-label TFRecord shards `<data_dir>/jft-{train,val}.tfrecord*`.
    dataset=dict(
      source="tfrecord", name="jft", train_split="train", eval_split="val", multi_label=True
    ),
    schedule="warmup_linear",
    weight_decay=0.1,
    dropout=0.0,
    grad_clip_norm=0.0,
    loss="sigmoid",
  ),
  "imagenet21k": dict(
    # TFRecord shards `<data_dir>/imagenet21k-{train,val}.tfrecord*` (10k images per class
    # held out as `val`); set --config.dataset.data_dir.
    dataset=dict(source="tfrecord", name="imagenet21k", train_split="train", eval_split="val"),
    schedule="warmup_linear",
    weight_decay=0.03,
    dropout=0.1,
    grad_clip_norm=0.0,
    loss="sigmoid",
  ),
  "imagenet2012": dict(
    dataset=dict(source="tfds", name="imagenet2012", train_split="train", eval_split="validation"),
    schedule="warmup_cosine",
    weight_decay=0.3,
    dropout=0.1,
    grad_clip_norm=1.0,
    loss="softmax",
  ),
}

# Downstream few-shot sets during pod pretraining (tfds; paper Fig. 3-4 and §4.1 "Metrics").
_FEWSHOT_DOWNSTREAM = {
  "imagenet": dict(
    source="tfds", name="imagenet2012", train_split="train", eval_split="validation"
  ),
  "cifar100": dict(
    source="tfds",
    name="cifar100",
    train_split="train",
    eval_split="test",
    pp_eval="decode|resize|value_range(-1, 1)",
  ),
  "pets": dict(
    source="tfds",
    name="oxford_iiit_pet",
    train_split="train",
    eval_split="test",
    pp_eval="decode|resize|value_range(-1, 1)",
  ),
}

# The CPU demo: 28px Fashion-MNIST at 32px, few-shot on the two offline downstream sets.
_DEMO_PP = "decode|resize|value_range(-1, 1)"
_DEMO = dict(
  dataset=dict(
    source="builtin",
    name="fashion_mnist",
    image_size=32,
    train_split="train",
    eval_split="test",
    pp_train="decode|resize|flip_lr|value_range(-1, 1)",
    pp_eval=_DEMO_PP,
  ),
  total_steps=6_000,
  base_lr=1e-3,
  schedule="warmup_cosine",
  weight_decay=0.1,
  dropout=0.0,
  batch_size=128,
  warmup_steps=100,
)
# The demo's recipe (configs/recipes.py): the paper's. On Fashion-MNIST at these budgets the 2022
# recipe's RandAugment and Mixup leave the small ViT underfitting (experiments/small_data.py,
# docs/experiments/small_data.md); the paper's recipe, trained longer, learns most.
DEMO_RECIPE = "paper"
_DEMO_DOWNSTREAM = {
  name: dict(source="builtin", name=name, train_split="train", eval_split="test", pp_eval=_DEMO_PP)
  for name in ("animal_mnist", "mnist_5k")
}


def add_fewshot_evals(
  config: ml_collections.ConfigDict, downstream: dict[str, dict], every_steps: int
) -> None:
  """Adds `evals.fewshot_<name>` per downstream dataset (dataset_config fields), in place.

  Each reads its dataset from its own `dataset.data_dir` (None: tfds's default), never from the
  pretraining set's directory; `--config.evals.fewshot_<name>.dataset.data_dir=...` moves it.
  """
  for name, fields in downstream.items():
    entry = common.fewshot_eval(config, fields, every_steps=every_steps)
    entry.dataset.data_dir = config_dict.placeholder(str)  # a fresh one: a str, overridable
    config.evals[f"fewshot_{name}"] = entry


def recipe(dataset: str, model: str, epochs: int = 0, lr: float = 0.0) -> dict:
  """Table 3's settings for `model` on `dataset` (epochs / lr > 0 override the table).

  Returns:
    dict(epochs, total_steps, base_lr, schedule, weight_decay, dropout, grad_clip_norm, loss).

  Raises:
    ValueError: the table has no entry and `epochs` and `lr` were not both given.
  """
  name = models.resolve_name(model)
  entry = RECIPES[dataset].get(name)
  if entry is None and not (epochs and lr):
    known = ", ".join(sorted(RECIPES[dataset]))
    raise ValueError(
      f"the paper's Table 3 has no {dataset} recipe for {name}; give both epochs= and lr= "
      f"(Table 3 lists: {known})"
    )
  if entry is not None and epochs and epochs not in entry[0] and not lr:
    raise ValueError(
      f"Table 3 trains {name} on {dataset} for {entry[0]} epochs, not {epochs}; give lr= too"
    )
  epochs = epochs or entry[0][0]
  base = {k: v for k, v in _DATASET_RECIPES[dataset].items() if k != "dataset"}
  return dict(
    base,
    epochs=epochs,
    total_steps=round(epochs * EPOCH_SIZES[dataset] / 4096),
    base_lr=lr or entry[1],
  )


def _later_recipe(dataset: str, model: str, name: str, epochs: int, lr: float) -> dict:
  """The schedule of the augreg / plain2022 recipes on a pod dataset (configs/recipes.py sets
  the rest): Table 3's length where it has one for `model` (else `epochs=` is needed), batch
  4096; plain2022 on ImageNet-1k: 90 epochs of batch 1024 on train[:99%]."""
  table = RECIPES[dataset].get(models.resolve_name(model))
  base = dict(_DATASET_RECIPES[dataset])
  batch = 4096
  dataset_fields = dict(base.pop("dataset"))
  if name == "plain2022" and dataset == "imagenet2012":
    batch = recipes.PLAIN2022_IMAGENET["batch_size"]
    epochs = epochs or recipes.PLAIN2022_IMAGENET["epochs"]
    dataset_fields["train_split"] = recipes.PLAIN2022_IMAGENET["train_split"]
  epochs = epochs or (table[0][0] if table else 0)
  if not epochs:
    raise ValueError(
      f"recipe={name} on {dataset} has no length for {models.resolve_name(model)}; give epochs="
    )
  images = EPOCH_SIZES[dataset] * (0.99 if dataset_fields["train_split"] == "train[:99%]" else 1)
  return dict(
    base,
    dataset=dataset_fields,
    epochs=epochs,
    total_steps=round(epochs * images / batch),
    base_lr=lr or recipes.BASE_LR,
    batch_size=batch,
    warmup_steps=recipes.WARMUP_STEPS,
  )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The pretraining config; see the module docstring for arguments and commands."""
  arg = common.parse_arg(
    arg,
    dataset="imagenet21k",
    model="",
    epochs=0,
    lr=0.0,
    loss="",
    recipe="",
    aug="",
    runlocal=False,
  )
  common.check_choice("pretrain", "dataset", arg.dataset, (*RECIPES, "fashion_mnist"))
  demo = arg.dataset == "fashion_mnist"
  recipe_name = arg.recipe or (DEMO_RECIPE if demo else "paper")
  common.check_choice("pretrain", "recipe", recipe_name, recipes.RECIPES)
  model_name = arg.model or ("demo" if demo else "B/16")
  level = recipes.aug_level(recipe_name, arg.dataset, model_name, arg.aug)
  if demo:
    r = dict(_DEMO, grad_clip_norm=1.0, loss="softmax")
    downstream = _DEMO_DOWNSTREAM
  elif recipe_name == "paper":
    r = dict(
      recipe(arg.dataset, model_name, arg.epochs, arg.lr),
      dataset=_DATASET_RECIPES[arg.dataset]["dataset"],
      batch_size=4096,
      warmup_steps=10_000,
    )
    downstream = _FEWSHOT_DOWNSTREAM
  else:
    r = _later_recipe(arg.dataset, model_name, recipe_name, arg.epochs, arg.lr)
    downstream = _FEWSHOT_DOWNSTREAM
  loss = arg.loss or r["loss"]
  if loss not in ("sigmoid", "softmax"):
    raise ValueError(f"loss={loss!r}; expected sigmoid or softmax")

  config = common.training_config("pretrain")
  config.dataset = common.dataset_config(**r["dataset"])
  config.model = common.model_config(
    model_name,
    head_bias_init=-10.0 if loss == "sigmoid" else 0.0,
    dtype="float32" if demo else "bfloat16",
  )
  if not models.is_bit(config.model):  # BiT ResNets have no dropout and no pre-logits layer
    config.model.dropout_rate = r["dropout"]
    # A reference: --config.model.hidden_size=... also resizes the representation layer.
    config.model.representation_size = config.model.get_ref("hidden_size")
  config.loss = f"{loss}_xent"
  config.total_steps = r["total_steps"]
  config.batch_size = r["batch_size"]
  config.grad_clip_norm = r["grad_clip_norm"]
  config.optimizer = common.adam_config(weight_decay=r["weight_decay"])
  config.schedule = ml_collections.ConfigDict(
    dict(name=r["schedule"], base_lr=r["base_lr"], warmup_steps=r["warmup_steps"], end_lr=0.0)
  )
  config.log_every_steps = 10 if demo else 100
  config.checkpoint = common.checkpoint_config(every_steps=200 if demo else 2000, keep=3)
  config.eval_batch_size = 256 if demo else 1024
  every = 500 if demo else 10_000
  config.evals = ml_collections.ConfigDict(
    dict(
      val=dict(
        type="classification",
        every_steps=every,
        split="",  # the dataset's eval_split, also when it is overridden on the command line
        loss=config.loss,
      )
    )
  )
  add_fewshot_evals(config, downstream, every)
  recipes.apply(config, recipe_name, level)
  if arg.lr:  # an explicit learning rate wins over the recipe's
    config.schedule.base_lr = arg.lr
  if arg.runlocal:
    common.runlocal(config)
  return config
