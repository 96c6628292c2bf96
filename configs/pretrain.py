r"""Pretraining (ViT paper §4.1, App. B.1): ImageNet-21k, JFT-like shards, or the CPU demo.

Arguments (`configs/pretrain.py:key=value,...`, see configs/common.py):
  dataset   imagenet21k | jft | fashion_mnist (demo)           default imagenet21k
  model     a vit_jax.models preset, e.g. B/16, L/16, H/14, or a  default B/16 (testing for the demo)
            BiT ResNet, e.g. R50x1
  loss      sigmoid | softmax                                   default sigmoid (softmax for the demo)
  runlocal  shrink to a seconds-long CPU run

Recipe (paper Table 3 and App. B.1): Adam β1=0.9, β2=0.999, lr 1e-3 (8e-4 for L and H on
ImageNet-21k... the paper's Table 3 lists 1e-3 for B, L, H alike on ImageNet-21k and 8e-4 for
L on JFT, 4e-4 for H on JFT), decoupled weight decay 0.03 (ImageNet-21k) / 0.1 (JFT), gradient
clipping at global norm 1, batch 4096, 10k steps of linear warmup then linear decay to 0,
dropout 0.1 (ImageNet-21k) / 0 (JFT), a Dense+tanh representation layer of the hidden width,
sigmoid cross-entropy with the head bias initialised to −10 (or softmax, bias 0).
Periodic validation top-1 and few-shot linear evaluation (1, 5, 10, 25 shots) on frozen
pre-logits.

Commands (TPU VM; on a multi-host slice run the same line on every worker, e.g.
`gcloud compute tpus tpu-vm ssh $TPU --worker=all --command="cd vit_jax && ..."`):

  python -m vit_jax.main --config=configs/pretrain.py:dataset=imagenet21k,model=B/16 \
      --workdir=gs://$BUCKET/vit_b16_i21k
  python -m vit_jax.main --config=configs/pretrain.py:dataset=jft,model=L/16 \
      --config.dataset.data_dir=gs://$BUCKET/jft_shards --workdir=gs://$BUCKET/vit_l16_jft

Expected (paper Table 2 / 5, after fine-tuning at 384px): ViT-B/16 from ImageNet-21k reaches
about 84% ImageNet top-1 (and about 98.9% CIFAR-10); ViT-L/16 from JFT-300M 87.76% ImageNet.
ViT-B/16 on ImageNet-21k takes about 312k steps (90 epochs × 14.2M images / 4096).

CPU demo on the offline Fashion-MNIST (the `builtin` source reads the Debian package's files):

  python -m vit_jax.main --config=configs/pretrain.py:dataset=fashion_mnist \
      --workdir=/tmp/vit_demo_pretrain

reaches about 70% validation top-1 on Fashion-MNIST (10-shot linear: about 71%) after its
1,000 steps, in 5-10 minutes on 2 cores (half of it in the evaluators).
"""

import ml_collections

from configs import common
from vit_jax import models

# Per-dataset recipe: (dataset overrides, total_steps, base_lr, weight_decay, dropout).
_PRESETS = {
  # 90 epochs × 14,197,122 images / 4096 ≈ 312k steps.
  "imagenet21k": dict(
    # TFRecord shards `<data_dir>/imagenet21k-{train,val}.tfrecord*` (10k images per class
    # held out as `val`); set --config.dataset.data_dir.
    dataset=dict(source="tfrecord", name="imagenet21k", train_split="train", eval_split="val"),
    total_steps=312_000,
    base_lr=1e-3,
    weight_decay=0.03,
    dropout=0.1,
    batch_size=4096,
    warmup_steps=10_000,
  ),
  # 7 epochs × 303M images / 4096 ≈ 518k steps.
  "jft": dict(
    # Multi-label TFRecord shards `<data_dir>/jft-{train,val}.tfrecord*`.
    dataset=dict(
      source="tfrecord", name="jft", train_split="train", eval_split="val", multi_label=True
    ),
    total_steps=518_000,
    base_lr=1e-3,
    weight_decay=0.1,
    dropout=0.0,
    batch_size=4096,
    warmup_steps=10_000,
  ),
  # The CPU demo: 28px Fashion-MNIST resized to 32px, the 'testing' model widened a little.
  "fashion_mnist": dict(
    dataset=dict(
      source="builtin",
      name="fashion_mnist",
      image_size=32,
      train_split="train",
      eval_split="test",
      pp_train="decode|resize|flip_lr|value_range(-1, 1)",
      pp_eval="decode|resize|value_range(-1, 1)",
    ),
    total_steps=1_000,
    base_lr=1e-3,
    weight_decay=0.1,
    dropout=0.0,
    batch_size=128,
    warmup_steps=100,
  ),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The pretraining config; see the module docstring for arguments and commands."""
  arg = common.parse_arg(arg, dataset="imagenet21k", model="", loss="", runlocal=False)
  if arg.dataset not in _PRESETS:
    raise ValueError(f"pretrain dataset={arg.dataset!r}; expected one of {sorted(_PRESETS)}")
  # The demo's 1,000 steps are too few for a sigmoid head starting at bias −10.
  arg.loss = arg.loss or ("softmax" if arg.dataset == "fashion_mnist" else "sigmoid")
  if arg.loss not in ("sigmoid", "softmax"):
    raise ValueError(f"loss={arg.loss!r}; expected sigmoid or softmax")
  preset = _PRESETS[arg.dataset]
  demo = arg.dataset == "fashion_mnist"
  model_name = arg.model or ("testing" if demo else "B/16")

  config = common.training_config("pretrain")
  config.dataset = common.dataset_config(**preset["dataset"])
  config.model = common.model_config(
    model_name,
    head_bias_init=-10.0 if arg.loss == "sigmoid" else 0.0,
    dtype="float32" if demo else "bfloat16",
  )
  if not models.is_bit(config.model):  # BiT ResNets have no dropout and no pre-logits layer
    config.model.dropout_rate = preset["dropout"]
    # A reference: --config.model.hidden_size=... also resizes the representation layer.
    config.model.representation_size = config.model.get_ref("hidden_size")
  config.loss = f"{arg.loss}_xent"
  config.total_steps = preset["total_steps"]
  config.batch_size = preset["batch_size"]
  config.grad_clip_norm = 1.0
  config.optimizer = ml_collections.ConfigDict(
    dict(name="adam", b1=0.9, b2=0.999, weight_decay=preset["weight_decay"])
  )
  config.schedule = ml_collections.ConfigDict(
    dict(
      name="warmup_linear",
      base_lr=preset["base_lr"],
      warmup_steps=preset["warmup_steps"],
      end_lr=0.0,
    )
  )
  config.log_every_steps = 10 if demo else 100
  config.checkpoint = common.checkpoint_config(every_steps=200 if demo else 2000, keep=3)
  config.eval_batch_size = 256 if demo else 1024
  every = 200 if demo else 10_000
  config.evals = ml_collections.ConfigDict(
    dict(
      val=dict(
        type="classification",
        every_steps=every,
        split=config.dataset.eval_split,
        loss=config.loss,
      ),
      fewshot=dict(
        type="fewshot",
        every_steps=every,
        train_split=config.dataset.train_split,
        test_split=config.dataset.eval_split,
        shots=(1, 5, 10, 25),
      ),
    )
  )
  if arg.runlocal:
    common.runlocal(config)
  return config
