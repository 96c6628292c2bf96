"""The pretraining run of tests/test_topology_invariance.py, by name for `python -m vit_jax.main`.

`--config=tests/helpers/invariance_config.py:<variant>` (run from the repository root):
  supervised  the Fashion-MNIST demo (`runlocal`: the 'testing' ViT, 16px, batch 16), softmax
  mpp_fsdp    masked patch prediction (configs/pretrain_mpp.py), mesh fsdp=2

Both with 20 steps, dropout and attention dropout 0.1, inception crop, flips and mixup, Polyak
averaging (decay 0.9), synchronous checkpoints at steps 10 and 20 (both kept), no evaluators,
and the mesh's data axis taking the remaining devices.
"""

import ml_collections

from vit_jax.configs import pretrain, pretrain_mpp

STEPS = 20
CHECKPOINT_STEP = 10


def get_config(variant: str = "supervised") -> ml_collections.ConfigDict:
  if variant == "supervised":
    config = pretrain.get_config("dataset=fashion_mnist,runlocal")
    config.mesh.update(data=-1, fsdp=1, model=1)
  elif variant == "mpp_fsdp":
    config = pretrain_mpp.get_config("dataset=fashion_mnist,runlocal")
    config.mesh.update(data=-1, fsdp=2, model=1)
  else:
    raise ValueError(f"variant {variant!r}; expected supervised or mpp_fsdp")
  config.total_steps = STEPS
  config.log_every_steps = CHECKPOINT_STEP
  config.model.dropout_rate = 0.1
  config.model.attention_dropout_rate = 0.1
  config.dataset.pp_train = "decode|inception_crop|flip_lr|value_range(-1, 1)"
  config.dataset.mixup_alpha = 0.4
  config.ema_decay = 0.9
  config.checkpoint.update(every_steps=CHECKPOINT_STEP, keep=2, asynchronous=False)
  config.evals = ml_collections.ConfigDict()
  return config


def supervised() -> ml_collections.ConfigDict:
  """`get_config('supervised')`, by name for tests/helpers/float64_reference.py."""
  return get_config("supervised")


def mpp_fsdp() -> ml_collections.ConfigDict:
  """`get_config('mpp_fsdp')`, by name for tests/helpers/float64_reference.py."""
  return get_config("mpp_fsdp")
