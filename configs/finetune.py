r"""Fine-tuning (ViT paper §3.2, App. B.1.1) from a pretrained checkpoint.

Arguments (`configs/finetune.py:key=value,...`, see configs/common.py):
  dataset    imagenet2012 | cifar10 | cifar100 | oxford_iiit_pet | oxford_flowers102 | vtab |
             animal_mnist (CPU demo)                                  default cifar10
  vtab_task  the VTAB-1k task's tfds name when dataset=vtab            default caltech101
  model      a vit_jax.models preset, e.g. B/16, L/16, R50+B/16, or a   default B/16 (testing
             BiT ResNet, e.g. R50x1                                   for the demo)
  runlocal   shrink to a seconds-long CPU run

The weights come from `--config.model_init=<path>`: a published `.npz` (e.g.
gs://vit_models/imagenet21k/ViT-B_16.npz) or the workdir (or one step directory) of a pretrain
run. The head is replaced by a zero-initialised one for the new classes, the representation
layer is dropped (representation_size None), and position embeddings are resized to the new
resolution (384px: 24×24 patches for /16).

Recipe (App. B.1.1, Table 4): SGD with momentum 0.9, no weight decay, gradient clipping at
global norm 1, batch 512, linear warmup then cosine decay to 0, resolution 384. Steps and the
learning-rate grid (pick the best on a held-out 2% of the training set, as the paper does):

  dataset            steps   warmup   lr grid                     default lr
  imagenet2012       20,000  500      0.003, 0.01, 0.03, 0.06     0.03
  cifar10/100        10,000  500      0.001, 0.003, 0.01, 0.03    0.03
  oxford_iiit_pet    500     100      0.001, 0.003, 0.01, 0.03    0.003
  oxford_flowers102  500     100      0.001, 0.003, 0.01, 0.03    0.003
  vtab (each task)   2,500   200      0.01                        0.01

Commands (TPU VM; multi-host: the same line on every worker, `--worker=all`):

  python -m vit_jax.main --config=configs/finetune.py:dataset=cifar10,model=B/16 \
      --config.model_init=gs://vit_models/imagenet21k/ViT-B_16.npz --workdir=gs://$BUCKET/ft_c10
  python -m vit_jax.main --config=configs/finetune.py:dataset=imagenet2012,model=L/16 \
      --config.model_init=gs://$BUCKET/vit_l16_jft --config.schedule.base_lr=0.01 \
      --workdir=gs://$BUCKET/ft_i1k

Expected top-1 (paper Table 2, JFT-300M pretraining, 384px): ViT-L/16 87.76 ImageNet,
99.42 CIFAR-10, 93.90 CIFAR-100, 97.32 Pets, 99.74 Flowers, 76.28 VTAB (19 tasks);
ViT-H/14 88.55, 99.50, 94.55, 97.56, 99.68, 77.63. From ImageNet-21k, ViT-B/16 reaches about
98.9 CIFAR-10 and 84 ImageNet.

CPU demo, from the demo pretrain run (configs/pretrain.py:dataset=fashion_mnist) at 48px:

  python -m vit_jax.main --config=configs/finetune.py:dataset=animal_mnist \
      --config.model_init=/tmp/vit_demo_pretrain --workdir=/tmp/vit_demo_finetune

reaches about 63% validation top-1 on Animal-MNIST after its 300 steps (about 4 minutes on
2 cores).
"""

import ml_collections

from configs import common

_GRID_LARGE = (0.003, 0.01, 0.03, 0.06)
_GRID_SMALL = (0.001, 0.003, 0.01, 0.03)

# dataset -> (tfds/shard name, image_size, total_steps, warmup_steps, base_lr, test split).
_PRESETS = {
  "imagenet2012": dict(image_size=384, total_steps=20_000, warmup=500, lr=0.03, test="validation"),
  "cifar10": dict(image_size=384, total_steps=10_000, warmup=500, lr=0.03, test="test"),
  "cifar100": dict(image_size=384, total_steps=10_000, warmup=500, lr=0.03, test="test"),
  "oxford_iiit_pet": dict(image_size=384, total_steps=500, warmup=100, lr=0.003, test="test"),
  "oxford_flowers102": dict(image_size=384, total_steps=500, warmup=100, lr=0.003, test="test"),
  "vtab": dict(image_size=384, total_steps=2_500, warmup=200, lr=0.01, test="test"),
  # The CPU demo: 28px silhouettes at 48px (position embeddings resized from the 32px demo).
  "animal_mnist": dict(image_size=48, total_steps=300, warmup=30, lr=0.01, test="test"),
}
LR_GRID = {
  "imagenet2012": _GRID_LARGE,
  "cifar10": _GRID_SMALL,
  "cifar100": _GRID_SMALL,
  "oxford_iiit_pet": _GRID_SMALL,
  "oxford_flowers102": _GRID_SMALL,
  "vtab": (0.01,),
  "animal_mnist": (0.003, 0.01, 0.03),
}


def _dataset_fields(dataset: str, preset: dict) -> dict:
  """Source, splits and preprocessing of a preset (vit_jax.input_pipeline.dataset_config)."""
  if dataset == "animal_mnist":
    return dict(
      source="builtin",
      train_split="train",
      eval_split="test",
      pp_train="decode|resize|flip_lr|value_range(-1, 1)",
      pp_eval="decode|resize|value_range(-1, 1)",
    )
  fields = dict(source="tfds", eval_split=preset["test"])
  if dataset == "vtab":
    # VTAB-1k: 800 training + 200 validation examples.
    fields["train_split"] = "train[:800]+validation[:200]"
  else:
    # The paper holds out 2% of the training set to pick the learning rate.
    fields["train_split"] = "train[:98%]"
  if dataset != "imagenet2012":
    # Small images (CIFAR's 32px, Pets, Flowers) are resized to the full resolution.
    fields["pp_eval"] = "decode|resize|value_range(-1, 1)"
  return fields


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The fine-tuning config; see the module docstring for arguments and commands."""
  arg = common.parse_arg(arg, dataset="cifar10", vtab_task="caltech101", model="", runlocal=False)
  if arg.dataset not in _PRESETS:
    raise ValueError(f"finetune dataset={arg.dataset!r}; expected one of {sorted(_PRESETS)}")
  preset = _PRESETS[arg.dataset]
  demo = arg.dataset == "animal_mnist"
  name = arg.vtab_task if arg.dataset == "vtab" else arg.dataset

  config = common.training_config("finetune")
  config.dataset = common.dataset_config(
    name=name, image_size=preset["image_size"], **_dataset_fields(arg.dataset, preset)
  )
  config.model = common.model_config(
    arg.model or ("testing" if demo else "B/16"), dtype="float32" if demo else "bfloat16"
  )
  config.model_init = ""
  config.loss = "softmax_xent"
  config.total_steps = preset["total_steps"]
  config.batch_size = 128 if demo else 512
  config.grad_clip_norm = 1.0
  config.optimizer = ml_collections.ConfigDict(dict(name="sgd", momentum=0.9, weight_decay=0.0))
  config.schedule = ml_collections.ConfigDict(
    dict(name="warmup_cosine", base_lr=preset["lr"], warmup_steps=preset["warmup"], end_lr=0.0)
  )
  config.log_every_steps = 10 if demo else 50
  config.checkpoint = common.checkpoint_config(every_steps=100 if demo else 1000, keep=2)
  config.eval_batch_size = 256 if demo else 512
  config.evals = ml_collections.ConfigDict(
    dict(
      val=dict(
        type="classification",
        every_steps=100 if demo else 1000,
        split=preset["test"],
        loss=config.loss,
      )
    )
  )
  if arg.runlocal:
    common.runlocal(config)
  return config
