r"""Training recipes as presets: the paper's, AugReg's, and "better plain ViT baselines".

`configs/pretrain.py:...,recipe=NAME` applies one to the pretraining config after the dataset's
own settings (`apply`):

  paper      the ViT paper's Table 3 as configs/pretrain.py gives it: class token, learned
             position embeddings, no augmentation beyond the dataset's crop and flip, dropout as
             Table 3 says (the default for the pod datasets)
  augreg     "How to train your ViT?" (Steiner et al. 2021, big_vision's vit_i1k / vit_i21k):
             the paper's model with RandAugment and Mixup of one level (`aug=`; by default the
             paper's choice for the model and dataset, `AUGREG_DEFAULT`), Adam at lr 1e-3 with a
             10k-step warm-up then cosine decay, decoupled weight decay 1e-4, gradient clipping
             at 1, the first moment in bfloat16, no dropout
  plain2022  "Better plain ViT baselines for ImageNet-1k" (Beyer, Zhai & Kolesnikov 2022,
             big_vision's vit_s16_i1k): global average pooling instead of the class token, fixed
             2-D sin-cos position embeddings, RandAugment(2, 10), Mixup 0.2, the optimizer of
             `augreg`, no dropout; on ImageNet-1k batch 1024 for 90 epochs on train[:99%]
             (76.5% top-1 for ViT-S/16, 6-7 h on a TPUv3-8)

Weight decay: big_vision's `wd` is not multiplied by the learning rate (p ← p − s_t·(lr·u + wd·p)
with s_t the schedule's multiplier); ours is (p ← p − lr_t·wd·p, vit_jax.train.optim), so big_vision's
1e-4 at lr 1e-3 is `WEIGHT_DECAY` = 0.1 here, the same update.

AugReg's levels (`AUG_LEVELS`): RandAugment (layers, magnitude) and Mixup's alpha.

  none (no aug)  light1 (2, 0)  light2 (2, 10), 0.2  medium1 (2, 15), 0.2  medium2 (2, 15), 0.5
  strong1 (2, 20), 0.5  strong2 (2, 20), 0.8

Only what a model has is set: a BiT ResNet has no class token, position embedding or dropout,
so a recipe changes its optimizer and data only.

The demo (Fashion-MNIST, 32px grey images on 2 CPU cores) takes `DEMO_RECIPE` of
configs/pretrain.py; what each recipe reaches on slices of it: docs/experiments/small_data.md.
"""

import ml_collections

from vit_jax import models

RECIPES = ("paper", "augreg", "plain2022")

# big_vision's wd 1e-4 at lr 1e-3 in our lr-multiplied convention (see the module docstring).
WEIGHT_DECAY = 0.1
BASE_LR = 1e-3
WARMUP_STEPS = 10_000

# level -> (RandAugment layers and magnitude, or None; Mixup alpha, 0: none).
AUG_LEVELS: dict[str, tuple[tuple[int, int] | None, float]] = {
  "none": (None, 0.0),
  "light1": ((2, 0), 0.0),
  "light2": ((2, 10), 0.2),
  "medium1": ((2, 15), 0.2),
  "medium2": ((2, 15), 0.5),
  "strong1": ((2, 20), 0.5),
  "strong2": ((2, 20), 0.8),
}

# AugReg's recommended level per model (its Fig. 4, as big_vision's configs give it); models not
# listed take 'medium2' on ImageNet-1k and 'light2' on the larger sets.
AUGREG_DEFAULT = {
  "imagenet2012": {
    "ViT-Ti_16": "light1",
    "ViT-S_32": "light2",
    "ViT-S_16": "medium2",
    "ViT-B_32": "medium2",
    "ViT-B_16": "medium2",
    "ViT-L_16": "medium2",
  },
  "imagenet21k": {
    "ViT-Ti_16": "none",
    "ViT-S_32": "none",
    "ViT-S_16": "light1",
    "ViT-B_32": "light2",
    "ViT-B_16": "light2",
    "ViT-L_16": "medium2",
  },
}

# plain2022 on ImageNet-1k: batch 1024, 90 epochs of train[:99%] (1% held out as minival).
PLAIN2022_IMAGENET = dict(batch_size=1024, epochs=90, train_split="train[:99%]")


def aug_level(recipe: str, dataset: str, model_name: str, aug: str) -> str:
  """The augmentation level `recipe` uses: `aug` if given, else the recipe's own for the model.

  Raises:
    ValueError: an unknown level, or `aug=` with the paper's recipe (which has none).
  """
  if aug and aug not in AUG_LEVELS:
    raise ValueError(f"aug={aug!r} is not one of {list(AUG_LEVELS)}")
  if recipe == "paper":
    if aug:
      raise ValueError(f"aug={aug!r} needs recipe=augreg or plain2022 (the paper's has no aug)")
    return "none"
  if aug:
    return aug
  if recipe == "plain2022":
    return "light2"  # RandAugment(2, 10), Mixup 0.2
  table = AUGREG_DEFAULT.get(dataset, {})
  return table.get(
    models.resolve_name(model_name), "medium2" if dataset == "imagenet2012" else "light2"
  )


def with_randaugment(pp_train: str, layers: int, magnitude: int) -> str:
  """`pp_train` with `randaugment(layers, magnitude)` before its `value_range` (RandAugment works
  on uint8 images), or at the end when it has none."""
  op = f"randaugment({layers}, {magnitude})"
  ops = pp_train.split("|")
  at = next((i for i, o in enumerate(ops) if o.startswith("value_range")), len(ops))
  return "|".join([*ops[:at], op, *ops[at:]])


def apply(config: ml_collections.ConfigDict, recipe: str, level: str) -> None:
  """Applies `recipe` with augmentation `level` (`aug_level`) to a pretraining config, in place.

  The dataset's schedule length and batch stay (configs/pretrain.py sets plain2022's ImageNet-1k
  ones); `paper` changes nothing.
  """
  if recipe not in RECIPES:
    raise ValueError(f"recipe={recipe!r} is not one of {list(RECIPES)}")
  if recipe == "paper":
    return
  randaug, mixup = AUG_LEVELS[level]
  if randaug is not None:
    config.dataset.pp_train = with_randaugment(config.dataset.pp_train, *randaug)
  config.dataset.mixup_alpha = mixup
  config.schedule.name = "warmup_cosine"
  config.schedule.base_lr = BASE_LR
  config.optimizer.weight_decay = WEIGHT_DECAY
  config.optimizer.mu_dtype = "bfloat16"
  config.grad_clip_norm = 1.0
  if not models.is_bit(config.model):
    config.model.dropout_rate = 0.0
    if recipe == "plain2022":
      config.model.classifier = "gap"
      config.model.posemb = "sincos2d"
