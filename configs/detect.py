r"""Object detection (the paper's open question, §5) from a plain encoder: ViTDet's simple
feature pyramid on the last feature map and an anchor-free FCOS head (docs/detection.md).

Arguments (`configs/detect.py:key=value,...`, see configs/common.py):
  dataset    fashion_mnist_det | mnist_det | animal_mnist_det (offline synthetic tasks, 64px
             canvases of 1-4 bundled objects at several scales,
             input_pipeline/sources/detection_synthetic.py) |
             folder (your data in COCO format: --config.dataset.data_dir=<dir> holding
             <split>/instances.json and the images it names) |
             shards (TFRecord shards of either, local or gs://, written by
             `python -m vit_jax.tools.make_shards --task=detection`:
             --config.dataset.data_dir=<their out_dir>)
                                                                  default fashion_mnist_det
  model      a vit_jax.models preset (ViT, hybrid or BiT ResNet)  default demo
  setting    demo (the CPU-sized run on a synthetic task) |
             vitdet (Li et al., 2022's COCO setting: ViT-B/16 at 1024x1024, windows of 14x14
             patches with global blocks 2, 5, 8, 11, drop path 0.1, pyramid scales 4, 2, 1,
             1/2 of width 256, large-scale jitter, AdamW at 1e-4 with weight decay 0.1, batch
             64 for 184,375 steps (100 epochs); a cosine schedule where ViTDet steps the rate
             down, and no layer-wise rate decay; what the planner compiles for pods)
                                                                  default demo
  lr         0: the setting's default
  runlocal   shrink to a seconds-long CPU run

The encoder's weights come from `--config.model_init=<path>` (a pretraining workdir, a step
directory or an `.npz`), loaded as fine-tuning loads them: position embeddings resized to the
detection grid, the classifier head and `pre_logits` dropped; the pyramid and the head are new.
Without `model_init` the run stops with an error; to train from random initialisation (a
baseline) set `--config.init_from_scratch=true`.

Loss: FCOS's focal, GIoU and centerness losses (vit_jax/objectives/detection.py). Evaluators:
the COCO protocol (AP, AP50, AP75, AP small/medium/large; pycocotools) on `val` during training
and on `test` after the last step (vit_jax/evaluators/detection.py).

  python -m vit_jax.main --config=configs/pretrain.py:dataset=fashion_mnist --workdir=/tmp/pt
  python -m vit_jax.main --config=configs/detect.py --config.model_init=/tmp/pt \
      --workdir=/tmp/det
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.input_pipeline.sources import detection_synthetic

DATASETS = (*detection_synthetic.SYNTHETIC, "folder", "shards")
SETTINGS = ("demo", "vitdet")
# The sources of the datasets that are not a synthetic task; theirs is 'det_builtin'.
_SOURCES = {"folder": "det_folder", "shards": "det_shards"}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The detection config; see the module docstring for arguments and commands."""
  arg = common.parse_arg(
    arg, dataset="fashion_mnist_det", model="", setting="demo", lr=0.0, runlocal=False
  )
  common.check_choice("detect", "dataset", arg.dataset, DATASETS)
  common.check_choice("detect", "setting", arg.setting, SETTINGS)
  vitdet = arg.setting == "vitdet"
  source = _SOURCES.get(arg.dataset, "det_builtin")

  config = common.training_config("detect")
  config.dataset = common.dataset_config(
    source=source,
    name=arg.dataset,
    image_size=1024 if vitdet else (64 if source == "det_builtin" else 512),
    train_split="train",
    eval_split="val",
    # ViTDet's large-scale jitter (0.1 to 2.0) on COCO; a milder one on the 64px canvases.
    pp_train="scale_jitter(0.1,2.0)|flip_lr" if vitdet else "scale_jitter(0.75,1.25)|flip_lr",
    pp_eval="",
    max_boxes=100 if vitdet or source != "det_builtin" else 8,
  )
  # The classifier's representation layer is not part of a dense model (dropped on load).
  config.model = common.model_config(
    arg.model or ("B/16" if vitdet else "demo"), dtype="bfloat16" if vitdet else "float32"
  )
  if "representation_size" in config.model:
    config.model.representation_size = None
  vit = "patch_size" in config.model
  if vit:  # ViTDet's windows (0: every block attends globally) and drop path
    config.model.window_size = 14 if vitdet else 0
    config.model.global_blocks = (2, 5, 8, 11) if vitdet else ()
    config.model.stochastic_depth = 0.1 if vitdet else 0.0
  config.init_from_scratch = False
  config.loss = "fcos"
  # pyramid_scales: levels relative to the encoder's last map (ViTDet: 4, 2, 1, 1/2 of the
  # stride-16 map: strides 4 to 32; the demo ViT's map has stride 4: strides 4, 8, 16; a BiT's
  # stride 32: strides 8, 16, 32); width: the pyramid's and the head's channels; convs: the
  # head's towers; center_radius: FCOS's centre sampling, in strides; the rest: decoding.
  if vitdet:
    scales = (4.0, 2.0, 1.0, 0.5)
  else:
    scales = (1.0, 0.5, 0.25) if vit else (4.0, 2.0, 1.0)
  config.detection = ml_collections.ConfigDict(
    dict(
      pyramid_scales=scales,
      width=256 if vitdet else 64,
      convs=4 if vitdet else 2,
      center_radius=1.5,
      pre_nms=1000 if vitdet else 300,
      max_detections=100,
      nms_iou=0.6,
      score_threshold=0.05,
    )
  )
  # ViTDet: 100 epochs of COCO's 118k training images at batch 64.
  config.total_steps = 184_375 if vitdet else 1500
  config.batch_size = 64 if vitdet else 32
  config.grad_clip_norm = 1.0
  if vitdet:
    config.optimizer = common.adam_config(weight_decay=0.1)
  else:
    config.optimizer = common.adam_config(weight_decay=1e-4)
  config.schedule = ml_collections.ConfigDict(
    dict(
      name="warmup_cosine",
      base_lr=arg.lr or (1e-4 if vitdet else 1e-3),
      warmup_steps=250 if vitdet else 100,
      end_lr=0.0,
    )
  )
  config.log_every_steps = 100 if vitdet else 25
  config.checkpoint = common.checkpoint_config(every_steps=5000 if vitdet else 250, keep=2)
  config.eval_batch_size = 64 if vitdet else 100
  config.evals = ml_collections.ConfigDict()
  config.evals.val = dict(type="detection", every_steps=5000 if vitdet else 500, split="")
  config.evals.test = dict(type="detection", every_steps=0, split="test")
  if arg.runlocal:
    common.runlocal(config)
  return config
