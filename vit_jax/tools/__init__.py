"""Command-line tools (`python -m vit_jax.tools.<name>`).

One module per command:

  convert      ViT weights between vit_jax `.npz`, Orbax workdirs, timm and Hugging Face
  export       a trained checkpoint for serving: SavedModel, LiteRT/TFLite, ONNX
  transfer     the paper's transfer suite (Table 2): grid, choice on minival, final run, table
  plan         will it fit on the pod: the trainer's step compiled for a TPU topology
  goodput      where a workdir's wall time went, over every run
  make_folder  a bundled offline dataset written as an image folder of PNG files
  make_shards  a bundled dataset or an image folder written as TFRecord shards
"""
