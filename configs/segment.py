r"""Semantic segmentation (the paper's open question, §5) from a pretrained encoder's feature maps.

Arguments (`configs/segment.py:key=value,...`, see configs/common.py):
  dataset    animal_mnist_seg | fashion_mnist_seg | mnist_seg (offline synthetic tasks, 48px
             canvases of 1-3 bundled objects, input_pipeline/sources/segmentation_synthetic.py) |
             folder (your data: --config.dataset.data_dir=<dir> holding
             <split>/images/*.png|jpg, <split>/masks/*.png and classes.txt) |
             shards (TFRecord shards of either, local or gs://, written by
             `python -m vit_jax.tools.make_shards --task=segmentation`:
             --config.dataset.data_dir=<their out_dir>)
                                                                  default animal_mnist_seg
  model      a vit_jax.models preset (ViT, hybrid or BiT ResNet)  default demo
  head       linear (SETR-naive: per-token linear classifier, upsampled bilinearly) |
             progressive (several blocks' maps fused, conv + ×2 upsampling to the pixels)
                                                                  default linear
  lr         0: the default (Adam, 0.001)
  runlocal   shrink to a seconds-long CPU run

The encoder's weights come from `--config.model_init=<path>` (a pretraining workdir, a step
directory or an `.npz`), loaded as fine-tuning loads them: position embeddings resized to the
segmentation grid (48px with 4px patches: 12×12), the classifier head and `pre_logits` dropped;
the segmentation head is new. Without `model_init` the run stops with an error; to train from
random initialisation (a baseline) set `--config.init_from_scratch=true`.

Loss: per-pixel softmax cross-entropy, pixels labelled 255 ignored (vit_jax/objectives/
segmentation.py). Evaluators: mean IoU and pixel accuracy, per class too, on `val` during
training and on `test` after the last step (vit_jax/evaluators/segmentation.py).

  python -m vit_jax.main --config=configs/pretrain.py:dataset=fashion_mnist --workdir=/tmp/pt
  python -m vit_jax.main --config=configs/segment.py:dataset=animal_mnist_seg,head=progressive \
      --config.model_init=/tmp/pt --workdir=/tmp/seg

What these reach on 2 CPU cores, beside a BiT ResNet, from scratch and a pixel threshold:
docs/segmentation.md (experiments/segmentation.py).
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.input_pipeline.sources import segmentation_synthetic
from vit_jax.models import segmentation as seg_models

DATASETS = (*segmentation_synthetic.SYNTHETIC, "folder", "shards")
# The sources of the datasets that are not a synthetic task; theirs is 'seg_builtin'.
_SOURCES = {"folder": "seg_folder", "shards": "seg_shards"}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The segmentation config; see the module docstring for arguments and commands."""
  arg = common.parse_arg(
    arg, dataset="animal_mnist_seg", model="demo", head="linear", lr=0.0, runlocal=False
  )
  common.check_choice("segment", "dataset", arg.dataset, DATASETS)
  common.check_choice("segment", "head", arg.head, seg_models.HEADS)
  source = _SOURCES.get(arg.dataset, "seg_builtin")

  config = common.training_config("segment")
  config.dataset = common.dataset_config(
    source=source,
    name=arg.dataset,
    image_size=48 if source == "seg_builtin" else 224,
    train_split="train",
    eval_split="val",
    pp_train="random_crop(0.5)|flip_lr",
    pp_eval="",
  )
  # The classifier's representation layer is not part of a dense model (dropped on load).
  config.model = common.model_config(arg.model, dtype="float32")
  if "representation_size" in config.model:
    config.model.representation_size = None
  config.init_from_scratch = False
  config.loss = "seg_softmax_xent"
  # width: channels of the progressive head (32 keeps its full-resolution conv cheap on a CPU).
  config.segmentation = ml_collections.ConfigDict(dict(head=arg.head, layers=(), width=32))
  config.total_steps = 1000
  config.batch_size = 32
  config.grad_clip_norm = 1.0
  config.optimizer = common.adam_config(weight_decay=1e-4)
  config.schedule = ml_collections.ConfigDict(
    dict(name="warmup_cosine", base_lr=arg.lr or 1e-3, warmup_steps=50, end_lr=0.0)
  )
  config.log_every_steps = 25
  config.checkpoint = common.checkpoint_config(every_steps=250, keep=2)
  config.eval_batch_size = 100
  config.evals = ml_collections.ConfigDict()
  config.evals.val = dict(type="segmentation", every_steps=250, split="")
  config.evals.test = dict(type="segmentation", every_steps=0, split="test")
  if arg.runlocal:
    common.runlocal(config)
  return config
