"""The stage configs, installed with the package as `vit_jax.configs`.

setup.py maps this folder to that package (`package_dir`), in an editable install and in the
wheel alike. They are imported one way only, `from vit_jax.configs import pretrain`, so that
each file is one module (the files build on each other: `pretrain_mpp.py` on `pretrain.py`,
all on `common.py`). `--config=configs/<stage>.py:...` names them on the command line, from a
checkout or from anywhere once the package is installed (vit_jax.runtime.config_files).

  common        what the stage configs share: the argument syntax, `runlocal`, common blocks
  recipes       training recipes as presets: the paper's, AugReg's, the 2022 plain ViT's
  pretrain      pretraining (§4.1, App. B.1): ImageNet-21k, JFT-like shards, ImageNet, the demo
  pretrain_mpp  masked patch prediction pretraining (§4.6, App. B.1.2)
  finetune      fine-tuning (§3.2, App. B.1.1) from a pretrained checkpoint
  linear_probe  a frozen backbone, linear classifiers on its features
  segment       semantic segmentation (§5) from a pretrained encoder's feature maps
  detect        object detection (§5) from a pretrained encoder: simple pyramid + FCOS head
"""

if __name__ != "vit_jax.configs":
  raise ImportError(
    f"import the stage configs as vit_jax.configs, not as {__name__!r} (each file would then "
    "exist as two modules)"
  )
