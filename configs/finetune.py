r"""Fine-tuning (ViT paper §3.2, App. B.1.1) from a pretrained checkpoint.

Arguments (`configs/finetune.py:key=value,...`, see configs/common.py):
  dataset    imagenet2012 | cifar10 | cifar100 | oxford_iiit_pet | oxford_flowers102 |
             vtab/<task>, one of VTAB-1k's 19 (vit_jax.input_pipeline.sources.vtab.TASKS, e.g.
             vtab/clevr_count) | animal_mnist, mnist_5k (CPU demo)   default cifar10
  model      a vit_jax.models preset, e.g. B/16, L/16, R50+B/16, or a   default B/16 (demo
             BiT ResNet, e.g. R50x1                                   for the demo's datasets)
  lr         0: the preset's default learning rate (table below)
  holdout    train on the training set minus a held-out minival slice and evaluate on it (the
             learning-rate search); holdout=false trains on the whole training set (final run)
                                                                         default true
  runlocal   shrink to a seconds-long CPU run

The weights come from `--config.model_init=<path>`: a published `.npz` (e.g.
gs://vit_models/imagenet21k/ViT-B_16.npz) or the workdir (or one step directory) of a pretrain
run. The head is replaced by a zero-initialised one for the new classes, the representation
layer is dropped (representation_size None), and position embeddings are resized to the new
resolution (384px: 24×24 patches for /16). Without `model_init` the run stops with an error;
to train from random initialisation (a baseline) say so with `--config.init_from_scratch=true`.

Recipe (App. B.1.1, Table 4): SGD with momentum 0.9, no weight decay, gradient clipping at
global norm 1, batch 512, linear warmup then cosine decay to 0, resolution 384. The learning
rate is picked on a held-out part of the training set ("minival": 1% of ImageNet, 2% of CIFAR,
10% of Pets and Flowers, as the paper), then the final model is trained on the whole training
set with that rate and evaluated on the test split:

  dataset            steps   warmup   minival   lr grid                     default lr
  imagenet2012       20,000  500      1%        0.003, 0.01, 0.03, 0.06     0.03
  cifar10/100        10,000  500      2%        0.001, 0.003, 0.01, 0.03    0.03
  oxford_iiit_pet    500     100      10%       0.001, 0.003, 0.01, 0.03    0.003
  oxford_flowers102  500     100      10%       0.001, 0.003, 0.01, 0.03    0.003

The grid, one command per point (holdout is the default; read `minival/accuracy` from each
workdir's metrics, e.g. TensorBoard or the last "minival/accuracy" log line), then the final run:

  for lr in 0.001 0.003 0.01 0.03; do
    python -m vit_jax.main --config=configs/finetune.py:dataset=cifar10,model=B/16,lr=$lr \
        --config.model_init=gs://vit_models/imagenet21k/ViT-B_16.npz \
        --workdir=gs://$BUCKET/ft_c10_lr$lr
  done
  python -m vit_jax.main --config=configs/finetune.py:dataset=cifar10,model=B/16,lr=<best>,holdout=false \
      --config.model_init=gs://vit_models/imagenet21k/ViT-B_16.npz --workdir=gs://$BUCKET/ft_c10

Multi-host TPU VM: the same lines on every worker (`--worker=all`).

The imagenet2012 preset averages the parameters (Polyak, `ema_decay=0.9999`, the paper's Table 2
setting; the average is what is evaluated and exported) and evaluates ImageNet ReaL (`evals.real`: tfds imagenet2012_real, the
validation images with their sets of ReaL labels, vit_jax/evaluators/real.py) beside the
ordinary validation top-1 (`evals.val`).

Expected top-1 (paper Table 2, JFT-300M pretraining, 384px): ViT-L/16 87.76 ImageNet, 90.54
ReaL, 99.42 CIFAR-10, 93.90 CIFAR-100, 97.32 Pets, 99.74 Flowers; ViT-H/14 88.55, 90.72,
99.50, 94.55, 97.56, 99.68. From ImageNet-21k (Table 5), ViT-B/16 reaches 98.95 CIFAR-10 and 83.97 ImageNet.
VTAB-1k (App. B.1.1; the tasks, splits and label transforms of google-research/task_adaptation,
see vit_jax/input_pipeline/sources/vtab.py): every task trains 2,500 steps at batch 512, 384px, lr 0.01
(grid 0.001, 0.003, 0.01, 0.03), 200 warmup steps, no flip; holdout trains on train800 and
evaluates on val200 (the grid), holdout=false trains on train800val200 and evaluates on the
task's test split. Paper Table 2, mean over the 19 tasks: ViT-H/14 JFT 77.63, ViT-L/16 JFT
76.28, ViT-L/16 ImageNet-21k 72.72. `python -m vit_jax.tools.transfer --suite=vtab` runs the
whole protocol (docs/transfer.md).

CPU demo (Animal-MNIST at 32px, from the demo's pretrain run; minival 10%):

  python -m vit_jax.main --config=configs/finetune.py:dataset=animal_mnist \
      --config.model_init=/tmp/vit_pt --workdir=/tmp/vit_ft

(holdout=false: the demo's run on all of Animal-MNIST's labels; experiments/demo.py runs it on
fewer labels too, from scratch as well, beside raw-pixel baselines on the same examples).
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.input_pipeline.sources import vtab

_GRID_LARGE = (0.003, 0.01, 0.03, 0.06)
_GRID_SMALL = (0.001, 0.003, 0.01, 0.03)

# dataset -> image_size, total_steps, warmup steps, default lr, test split, minival percent.
_PRESETS = {
  "imagenet2012": dict(
    image_size=384, total_steps=20_000, warmup=500, lr=0.03, test="validation", minival=1
  ),
  "cifar10": dict(image_size=384, total_steps=10_000, warmup=500, lr=0.03, test="test", minival=2),
  "cifar100": dict(image_size=384, total_steps=10_000, warmup=500, lr=0.03, test="test", minival=2),
  "oxford_iiit_pet": dict(
    image_size=384, total_steps=500, warmup=100, lr=0.003, test="test", minival=10
  ),
  "oxford_flowers102": dict(
    image_size=384, total_steps=500, warmup=100, lr=0.003, test="test", minival=10
  ),
  # The CPU demo: 28px silhouettes at the demo's 32px. 1000 steps of batch 128 (14 epochs): in
  # 600 steps lr 0.1 reached 89.7% where 0.03 reached 84.9% (both still rising).
  "animal_mnist": dict(
    image_size=32, total_steps=1000, warmup=100, lr=0.1, test="test", minival=10
  ),
  # The same budget on the bundled MNIST-5k (28px digits): the offline suite's second dataset.
  "mnist_5k": dict(image_size=32, total_steps=1000, warmup=100, lr=0.1, test="test", minival=10),
}
# The bundled offline datasets (vit_jax.input_pipeline.sources.builtin) with a preset.
BUILTIN = ("animal_mnist", "mnist_5k")
# VTAB-1k (App. B.1.1): every task 2,500 steps at lr 0.01 (the grid is searched on val200);
# the paper gives no warmup, 200 steps is big_vision's transfer setting.
VTAB_PREFIX = "vtab/"
_VTAB = dict(image_size=384, total_steps=2_500, warmup=200, lr=0.01)
LR_GRID = {
  "imagenet2012": _GRID_LARGE,
  "cifar10": _GRID_SMALL,
  "cifar100": _GRID_SMALL,
  "oxford_iiit_pet": _GRID_SMALL,
  "oxford_flowers102": _GRID_SMALL,
  "animal_mnist": (0.03, 0.1, 0.3),
  "mnist_5k": (0.03, 0.1, 0.3),
  **{VTAB_PREFIX + name: _GRID_SMALL for name in vtab.TASKS},
}


def vtab_task(dataset: str) -> vtab.Task | None:
  """The VTAB-1k task of `dataset=vtab/<task>`, or None for the other presets."""
  if not dataset.startswith(VTAB_PREFIX):
    return None
  return vtab.get_task(dataset[len(VTAB_PREFIX) :])


def splits(dataset: str, holdout: bool = True) -> tuple[str, str | None]:
  """(training split, minival split or None) of a preset.

  minival is the training set's tail; for VTAB-1k, train800 / val200 with holdout and
  train800val200 without (as tfds split strings).
  """
  task = vtab_task(dataset)
  if task:
    s = task.splits
    return (s["train800"], s["val200"]) if holdout else (s["train800val200"], None)
  pct = _PRESETS[dataset]["minival"]
  if not holdout:
    return "train", None
  return f"train[:{100 - pct}%]", f"train[{100 - pct}%:]"


def _preset(dataset: str) -> dict:
  if dataset in _PRESETS:
    return _PRESETS[dataset]
  if not dataset.startswith(VTAB_PREFIX) or dataset[len(VTAB_PREFIX) :] not in vtab.TASKS:
    known = [*_PRESETS, *(VTAB_PREFIX + name for name in vtab.TASKS)]
    common.check_choice("finetune", "dataset", dataset, known)
  return dict(_VTAB, test=vtab_task(dataset).test)


def _dataset_fields(dataset: str, preset: dict, train_split: str) -> dict:
  """Source, splits and preprocessing of a preset (vit_jax.input_pipeline.dataset_config)."""
  if dataset in BUILTIN:
    return dict(
      source="builtin",
      train_split=train_split,
      eval_split="test",
      pp_train="decode|resize|flip_lr|value_range(-1, 1)",
      pp_eval="decode|resize|value_range(-1, 1)",
    )
  task = vtab_task(dataset)
  if task:
    # No flip: it would move dSprites' x-position and orientation labels, and KITTI's scenes.
    return dict(
      source="tfds",
      name=task.builder,
      vtab_task=task.name,
      train_split=train_split,
      eval_split=task.test,
      pp_train="decode|resize|value_range(-1, 1)",
      pp_eval="decode|resize|value_range(-1, 1)",
    )
  fields = dict(source="tfds", train_split=train_split, eval_split=preset["test"])
  if dataset != "imagenet2012":
    # Small images (CIFAR's 32px, Pets, Flowers) are resized to the full resolution.
    fields["pp_eval"] = "decode|resize|value_range(-1, 1)"
  return fields


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The fine-tuning config; see the module docstring for arguments and commands."""
  arg = common.parse_arg(arg, dataset="cifar10", model="", lr=0.0, holdout=True, runlocal=False)
  preset = _preset(arg.dataset)
  demo = arg.dataset in BUILTIN
  train_split, minival_split = splits(arg.dataset, arg.holdout)

  config = common.training_config("finetune")
  config.dataset = common.dataset_config(
    **{
      "name": arg.dataset,  # the VTAB tasks name their tfds builder instead
      "image_size": preset["image_size"],
      **_dataset_fields(arg.dataset, preset, train_split),
    }
  )
  config.model = common.model_config(
    arg.model or ("demo" if demo else "B/16"), dtype="float32" if demo else "bfloat16"
  )
  config.init_from_scratch = False
  config.loss = "softmax_xent"
  config.total_steps = preset["total_steps"]
  config.batch_size = 128 if demo else 512
  config.grad_clip_norm = 1.0
  # Table 2's ImageNet numbers average the parameters (Polyak, factor 0.9999; vit_jax.train.ema).
  config.ema_decay = 0.9999 if arg.dataset == "imagenet2012" else 0.0
  config.optimizer = common.sgd_config(momentum=0.9)
  config.schedule = ml_collections.ConfigDict(
    dict(
      name="warmup_cosine",
      base_lr=arg.lr or preset["lr"],
      warmup_steps=preset["warmup"],
      end_lr=0.0,
    )
  )
  config.log_every_steps = 10 if demo else 50
  config.checkpoint = common.checkpoint_config(every_steps=100 if demo else 1000, keep=2)
  config.eval_batch_size = 256 if demo else 512
  # VTAB-1k evaluates once, after the last step (its test splits reach 74k images at 384px).
  every = 100 if demo else 0 if vtab_task(arg.dataset) else 1000
  config.evals = ml_collections.ConfigDict()
  if minival_split:
    # The held-out slice of the training set on which the learning rate is chosen.
    config.evals.minival = dict(
      type="classification", every_steps=every, split=minival_split, loss=config.loss
    )
  # split '': the dataset's eval_split, also when it is overridden on the command line.
  config.evals.val = dict(type="classification", every_steps=every, split="", loss=config.loss)
  if arg.dataset == "imagenet2012":
    # ImageNet ReaL (Table 2): the same 50k validation images with their sets of ReaL labels.
    config.evals.real = dict(
      type="real",
      every_steps=every,
      split="validation",
      dataset=dict(
        name="imagenet2012_real",
        label_key="real_label",
        multi_label=True,
        num_classes=1000,
        train_split="validation",
        eval_split="validation",
      ),
    )
  if arg.runlocal:
    common.runlocal(config)
  return config
