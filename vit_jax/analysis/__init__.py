"""Inside the ViT (paper §4.5, Fig. 6–7): embedding filters, position embeddings, attention.

  python -m vit_jax.analysis --checkpoint=<workdir | step dir | .npz> --images=<files, folders> \
      --out=<dir>

`metrics` holds the numbers (pure functions), `capture` loads a checkpoint and reduces its sown
attention weights on the devices, `plots` draws, `report.analyze` ties them together, and
`__main__` is the command line. Nothing here imports TensorFlow.
"""
