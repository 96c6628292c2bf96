r"""Linear probe (vit_jax/linear_probe.py): frozen backbone, linear classifiers on its features.

Arguments (`configs/linear_probe.py:key=value,...`, see configs/common.py):
  dataset         a dataset of vit_jax.input_pipeline (e.g. mnist_5k, cifar10)  default mnist_5k
  source          builtin | tfrecord | tfds | folder; '' = builtin for the bundled
                  datasets (fashion_mnist, animal_mnist, mnist_5k, digits), else tfds
  data_dir        the shards' directory (tfrecord), tfds data_dir or folder root
  image_size      input resolution; 0: the backbone's (its config.json), else 224  default 0
  model           a vit_jax.models preset; '' reads the architecture from the
                  checkpoint's config.json (or its parameter shapes)            default ''
  representation  pre_logits (falls back to the pooled token) | pooled |       default pre_logits
                  blocks (every block's output averaged over the patches, the
                  averages concatenated: depth x width features)
  runlocal        shrink to a seconds-long CPU run

The backbone is `--config.model_init=<path>`: the workdir (or a step directory) of a pretrain or
fine-tune run, or an `.npz`. Features of the whole training split (`dataset.train_split`) and
of the test split (`dataset.eval_split`) are extracted once; two probes are fitted on the training features, each regulariser chosen on a
held-out 10% of the training split: closed-form ridge regression to {-1, +1}^K (the paper's
few-shot solver on all the data) and L-BFGS softmax regression. Results go to
`<workdir>/linear_probe.json` and TensorBoard.

Commands:

  python -m vit_jax.main --config=configs/linear_probe.py:dataset=cifar10 \
      --config.model_init=gs://vit_models/imagenet21k/ViT-B_16.npz --workdir=/tmp/lp_c10
  python -m vit_jax.main --config=configs/linear_probe.py:dataset=mnist_5k \
      --config.model_init=/tmp/vit_pt --workdir=/tmp/vit_probe

Expected: ImageNet-21k ViT-B/16 pre-logits at 224px reach about 95% on CIFAR-10 with the
logistic probe. The CPU demo (the Fashion-MNIST-pretrained 'demo' model) reaches the
accuracies in the demo's table (docs/demo.md) in well under a minute.
"""

import ml_collections

from vit_jax.configs import common

# Datasets bundled with the code (vit_jax.input_pipeline.sources.builtin); others default to tfds.
_BUILTIN = ("fashion_mnist", "animal_mnist", "mnist_5k", "digits")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The linear-probe config; see the module docstring for arguments and commands."""
  arg = common.parse_arg(
    arg,
    dataset="mnist_5k",
    source="",
    data_dir="",
    image_size=0,
    model="",
    representation="pre_logits",
    runlocal=False,
  )
  config = ml_collections.ConfigDict()
  config.stage = "linear_probe"
  config.seed = 0
  config.model_init = ""
  if arg.model:
    config.model = common.model_config(arg.model)
  # image_size 0: taken from the backbone's saved config when the stage runs (else 224).
  source = arg.source or ("builtin" if arg.dataset in _BUILTIN else "tfds")
  dataset = dict(name=arg.dataset, source=source, image_size=arg.image_size or 224)
  if source in ("builtin", "tfrecord"):
    dataset.update(train_split="train", eval_split="test")
  if arg.data_dir:
    dataset["data_dir"] = arg.data_dir
  config.dataset = common.dataset_config(**dataset)
  config.image_size_from_checkpoint = arg.image_size == 0
  config.representation = arg.representation
  config.batch_size = 256  # global batch of the feature extraction
  config.mesh = common.mesh_config()
  config.probe = ml_collections.ConfigDict(
    dict(
      probes=("ridge", "logreg"),
      ridge_l2_regs=(1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0),
      logreg_l2_regs=(1e-6, 1e-5, 1e-4, 1e-3, 1e-2),
      val_fraction=0.1,
      max_examples=0,  # 0: whole splits
    )
  )
  if arg.runlocal:
    common.runlocal(config)
    config.probe.max_examples = 256
    config.probe.ridge_l2_regs = (1.0,)
    config.probe.logreg_l2_regs = (1e-4,)
  return config
