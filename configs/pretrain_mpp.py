r"""Masked patch prediction pretraining (ViT paper §4.6, App. B.1.2): self-supervised, no labels.

Arguments (`configs/pretrain_mpp.py:key=value,...`, see configs/common.py):
  dataset   jft | fashion_mnist (demo)                              default jft
  model     a ViT preset (no hybrids), e.g. B/16                    default B/16 (testing for
            the demo)
  target    mean_color | downsample4x4 | l2                         default mean_color
  steps     0: the recipe's (1M on JFT, 1000 for the demo)
  lr        0: the recipe's base learning rate (2e-4 on JFT)
  runlocal  shrink to a seconds-long CPU run

The paper's recipe (App. B.1.2): corrupt 50% of the patch embeddings, of those 80% replaced by a
learnable [mask] embedding, 10% by a random other patch's embedding (here: of the same image),
10% kept; predict the 3-bit mean colour (512 classes) of every corrupted patch from its output
token with a softmax. ViT-B/16, 1M steps (ca. 14 epochs) at batch 4096 on JFT, Adam, base
learning rate 2e-4, 10k warmup steps, cosine decay. The other targets the appendix compares are
`target=downsample4x4` (a 4×4 downsized patch, 16 predictions of 512 colours) and `target=l2`
(regression of the full patch). The appendix gives no weight decay or dropout for this run: we
use JFT pretraining's 0.1 decoupled weight decay and no dropout; no representation layer.

Training "accuracy" is the fraction of corrupted patches whose colour is predicted right. The
few-shot evaluators (ImageNet, CIFAR-100, Pets; Animal-MNIST and MNIST-5k for the demo) read the
mean of the patch tokens (the class token's output is not trained by this objective).

Expected (paper §4.6): fine-tuned on ImageNet, ViT-B/16 reaches 79.9% top-1, 2% better than
training from scratch and 4% behind supervised pretraining on JFT.

Commands (TPU VM; on a multi-host slice run the same line on every worker):

  python -m vit_jax.main --config=configs/pretrain_mpp.py:dataset=jft,model=B/16 \
      --config.dataset.data_dir=gs://$BUCKET/jft_shards --workdir=gs://$BUCKET/vit_b16_mpp
  python -m vit_jax.main --config=configs/finetune.py:dataset=imagenet2012,model=B/16 \
      --config.model_init=gs://$BUCKET/vit_b16_mpp --workdir=gs://$BUCKET/vit_b16_mpp_i1k

CPU demo on the offline Fashion-MNIST (grey images: only the 8 grey levels of the 512 colours
occur), then fine-tuning on Animal-MNIST:

  python -m vit_jax.main --config=configs/pretrain_mpp.py:dataset=fashion_mnist \
      --workdir=/tmp/vit_mpp
  python -m vit_jax.main --config=configs/finetune.py:dataset=animal_mnist,model=testing \
      --config.model_init=/tmp/vit_mpp --workdir=/tmp/vit_mpp_finetune

experiments/mpp_study.py compares scratch, MPP and supervised pretraining at that scale.
"""

import ml_collections

from vit_jax.configs import common, pretrain
from vit_jax.models import mpp

# dataset -> (total steps, base lr, warmup steps, batch size, weight decay).
RECIPES = {
  "jft": (1_000_000, 2e-4, 10_000, 4096, 0.1),
  "fashion_mnist": (1_000, 1e-3, 100, 128, 0.1),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The MPP pretraining config; see the module docstring for arguments and commands."""
  arg = common.parse_arg(
    arg, dataset="jft", model="", target="mean_color", steps=0, lr=0.0, runlocal=False
  )
  common.check_choice("pretrain_mpp", "dataset", arg.dataset, RECIPES)
  common.check_choice("pretrain_mpp", "target", arg.target, mpp.TARGETS)
  demo = arg.dataset == "fashion_mnist"
  steps, lr, warmup, batch, weight_decay = RECIPES[arg.dataset]
  if demo:
    dataset, downstream = pretrain._DEMO["dataset"], pretrain._DEMO_DOWNSTREAM
  else:
    dataset, downstream = pretrain._DATASET_RECIPES["jft"]["dataset"], pretrain._FEWSHOT_DOWNSTREAM

  config = common.training_config("pretrain")
  config.dataset = common.dataset_config(**dataset)
  config.model = common.model_config(
    arg.model or ("testing" if demo else "B/16"),
    dropout_rate=0.0,
    dtype="float32" if demo else "bfloat16",
  )
  if config.model.resnet is not None:
    raise ValueError(f"pretrain_mpp model={arg.model!r}: hybrids have no image patches to predict")
  config.loss = "mpp"
  config.mpp = mpp.mpp_config(target=arg.target)
  config.total_steps = arg.steps or steps
  config.batch_size = batch
  config.grad_clip_norm = 1.0 if demo else 0.0
  config.optimizer = common.adam_config(weight_decay=weight_decay)
  config.schedule = ml_collections.ConfigDict(
    dict(name="warmup_cosine", base_lr=arg.lr or lr, warmup_steps=warmup, end_lr=0.0)
  )
  config.log_every_steps = 10 if demo else 100
  config.checkpoint = common.checkpoint_config(every_steps=200 if demo else 2000, keep=3)
  config.eval_batch_size = 256 if demo else 1024
  every = 200 if demo else 10_000
  config.evals = ml_collections.ConfigDict()
  pretrain.add_fewshot_evals(config, downstream, every)
  if arg.runlocal:
    common.runlocal(config)
  return config
