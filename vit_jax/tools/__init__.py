"""Command-line tools (`python -m vit_jax.tools.<name>`), one module per command.

Every command of the package, one line each (each module's docstring gives its flags and
examples; what they share, from their flags to their one-line errors and exit statuses:
vit_jax.runtime.cli):

  python -m vit_jax.main --config=configs/<stage>.py --workdir=DIR   runs a stage
  python -m vit_jax.predict --checkpoint=C IMAGE...   classifies (or segments) image files
  python -m vit_jax.analysis --checkpoint=C --images=... --out=DIR   what a ViT learned (§4.5)
  python -m vit_jax.tools.convert   ViT weights between vit_jax `.npz`, Orbax workdirs, timm, HF
  python -m vit_jax.tools.export    a trained checkpoint for serving: SavedModel, LiteRT, ONNX
  python -m vit_jax.tools.transfer  the paper's transfer suite (Table 2): grid, minival, final
  python -m vit_jax.tools.plan      will it fit on the pod: the train step compiled for a TPU slice
  python -m vit_jax.tools.goodput   where a workdir's wall time went, over every run
  python -m vit_jax.tools.make_folder  a bundled dataset written as an image folder of PNG files
  python -m vit_jax.tools.make_shards  a bundled dataset or an image folder as TFRecord shards
"""
