"""A trained checkpoint for serving: SavedModel, LiteRT/TFLite (fp32, float16, int8) and ONNX.

`formats.py`: the checkpoint as `predict` reads it (`load`), and the files of each format
(`export`); `jax_to_onnx.py`: the model's jaxpr as an ONNX graph. The command is
`python -m vit_jax.tools.export` (docs/export.md).
"""
