"""A trained checkpoint as a serving artifact: SavedModel, LiteRT (fp32, float16, int8) or ONNX.

`load` reads a checkpoint as `predict` does (architecture, resolution, evaluation preprocessing
and class names from the workdir's `config.json`; `model`, `image_size`, `class_names` for a
bare `.npz`); `export` writes one format into a new directory, with `export.json` beside it
saying what the artifact takes and returns. The formats, their signatures and quantizations are
described in docs/export.md: a SavedModel (jax2tf, symbolic batch size) with the evaluation
preprocessing inside the graph, LiteRT (`tflite_bytes`; int8 is dynamic-range, int8_full
calibrates on the training split) and ONNX (vit_jax.export.jax_to_onnx). A `detect` stage
checkpoint exports as a SavedModel whose signatures return `boxes`, `scores`, `classes` and
`class_names` (the model's own decoding: vit_jax.models.detection).

Errors a user can cause raise a one-line ValueError; nothing is written until the conversion
succeeded.
"""

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from vit_jax import checkpoint as checkpoint_lib
from vit_jax import models
from vit_jax.inference import DEFAULT_PP, dataset_class_names, native_image_size
from vit_jax.models import mpp

FORMATS = ("saved_model", "tflite", "onnx")
QUANTIZATIONS = ("none", "float16", "int8", "int8_full")
FILES = {"tflite": "model.tflite", "onnx": "model.onnx"}
METADATA_FILE = "export.json"
# Examples of the training split that calibrate int8 activations (LiteRT's guidance: ~100-500).
CALIBRATION_EXAMPLES = 256


@dataclasses.dataclass
class Exportable:
  """A checkpoint's model with everything serving needs."""

  checkpoint: str
  model: Any  # the Flax module, XLA kernels only (jax2tf cannot carry the C++ kernels)
  params: dict[str, Any]
  image_size: int
  pp: str  # the evaluation preprocessing spec
  class_names: list[str] | None
  num_classes: int | None  # None: headless, the model returns its representation
  sigmoid: bool  # a head trained with sigmoid cross-entropy: probabilities are sigmoids
  dataset: ml_collections.ConfigDict | None  # the training's dataset config, if saved
  note: str = ""  # a line for the user about what was exported (an MPP checkpoint's encoder)
  detection: bool = False  # a detect stage checkpoint: `apply` gives its detections

  def apply(self, images: Any) -> Any:
    """Logits [batch, K] (a headless model's: its representation) of preprocessed float32
    images, or a detector's `out['detections']`; nothing else the model computes is traced
    into the export."""
    logits, out = self.model.apply({"params": self.params}, images, train=False)
    return out["detections"] if self.detection else logits

  def names(self) -> list[str]:
    """Class names, or `class i` where the checkpoint carries none."""
    return self.class_names or [f"class {i}" for i in range(self.num_classes or 0)]

  def metadata(self) -> dict[str, Any]:
    s = self.image_size
    out = {
      "checkpoint": self.checkpoint,
      "image_size": s,
      "preprocessing": self.pp,
      "input": f"float32 [batch, {s}, {s}, 3] after the preprocessing",
      "num_classes": self.num_classes,
      "class_names": self.names() if self.num_classes else None,
      "probabilities": "sigmoid" if self.sigmoid else "softmax",
    }
    if self.detection:
      del out["probabilities"]
      out["outputs"] = (
        "boxes float32 [batch, D, 4] (ymin, xmin, ymax, xmax in [0, 1] of the image), scores "
        "[batch, D] (0: no detection), classes int32 [batch, D], class_names string [batch, D]"
      )
    if self.note:
      out["note"] = self.note
    return out


def load(
  checkpoint: str,
  *,
  model: str | None = None,
  image_size: int = 0,
  class_names: Sequence[str] | None = None,
) -> Exportable:
  """Reads a checkpoint (workdir, step directory, `.npz`, `gs://...`) for export.

  `model`: a preset for an `.npz` without `config.json` (else inferred from the shapes);
  `image_size` 0: the training's, else the position embeddings'. A path without a model or an
  architecture it cannot infer raises a one-line ValueError.
  """
  model_config = models.get_model_config(model) if model else None
  try:
    model_config, params, saved = checkpoint_lib.load_backbone(checkpoint, model_config)
  except (FileNotFoundError, KeyError) as e:
    raise ValueError(f"{checkpoint}: no model to export ({_first_line(e)})") from None
  if saved is not None and saved.get("stage") == "detect":
    return _detector(checkpoint, model_config, params, saved, class_names)
  note = ""
  if any(k in params for k in mpp.PARAMS):
    note = (
      f"{checkpoint} is a masked-patch-prediction checkpoint: exporting its encoder (output "
      "'representation'), not the patch-prediction head"
    )
  params = {k: v for k, v in params.items() if k not in mpp.PARAMS}
  head = params.get("head")
  num_classes = None
  if head is not None:
    num_classes = int(np.shape(jax.tree_util.tree_leaves(head)[0])[-1])
  elif not note:
    note = f"{checkpoint} has no classification head: exporting the encoder's representation"
  overrides = dict(dropout_rate=0.0, attention_kernel="xla", layer_norm_kernel="xla")
  rep = params["pre_logits"]["kernel"].shape[-1] if "pre_logits" in params else None
  overrides["representation_size"] = rep
  net = models.get_model(
    model_config, num_classes, **models.known_overrides(model_config, **overrides)
  )
  dataset = saved.get("dataset") if saved is not None else None
  if not image_size:
    if dataset and dataset.get("image_size"):
      image_size = int(dataset.image_size)
    elif models.is_bit(model_config):
      raise ValueError(f"{checkpoint}: a BiT ResNet carries no resolution; give --image_size")
    else:
      image_size = native_image_size(params, net)
  if not models.is_bit(model_config):
    params = checkpoint_lib.fit_posemb(params, net, model_config, image_size)
  names = list(class_names) if class_names else None
  if names is None and num_classes:
    names = dataset_class_names(dataset)
  if names and num_classes and len(names) != num_classes:
    raise ValueError(f"{len(names)} class names for a {num_classes}-class head")
  return Exportable(
    checkpoint=checkpoint,
    model=net,
    params=jax.tree.map(np.asarray, params),
    image_size=image_size,
    pp=(dataset.get("pp_eval") if dataset else None) or DEFAULT_PP,
    class_names=names,
    num_classes=num_classes,
    sigmoid=saved is not None and saved.get("loss") == "sigmoid_xent",
    dataset=dataset,
    note=note,
  )


def _first_line(e: BaseException) -> str:
  return str(e).splitlines()[0] if str(e) else type(e).__name__


# ---------------------------------------------------------------------------------------------
# Calibration data for int8.


def calibration_images(source: Exportable, num_examples: int = CALIBRATION_EXAMPLES) -> np.ndarray:
  """The first `num_examples` of the training split, preprocessed for evaluation.

  Raises:
    ValueError: the checkpoint names no dataset (a bare `.npz`), or its data cannot be read.
  """
  dataset = source.dataset
  if not dataset or not dataset.get("name"):
    raise ValueError(
      f"int8_full needs data to calibrate on, and {source.checkpoint} names no training "
      "dataset (a workdir's config.json does); use --quantize=int8, or export the workdir"
    )
  from vit_jax import input_pipeline  # TensorFlow

  config = input_pipeline.dataset_config(**dict(dataset.to_dict(), image_size=source.image_size))
  config.pp_eval = source.pp
  try:
    batches = input_pipeline.make_eval_iterator(
      config,
      split=config.train_split,
      global_batch_size=min(num_examples, 64),
      mesh=None,
      process_index=0,
      process_count=1,
    )
    images = []
    for batch in batches:
      images.append(batch["image"][batch["mask"] > 0])
      if sum(len(x) for x in images) >= num_examples:
        break
  except ValueError as e:
    raise ValueError(f"int8_full calibration data ({config.name}): {_first_line(e)}") from None
  return np.concatenate(images)[:num_examples].astype(np.float32)


# ---------------------------------------------------------------------------------------------
# TensorFlow: jax2tf, SavedModel, LiteRT.


def _detector(checkpoint, model_config, params, saved, class_names) -> Exportable:
  """A `detect` stage checkpoint for export: its model with the XLA kernels, at its size."""
  from vit_jax.models import detection  # noqa: PLC0415

  num_classes = int(np.shape(params["head"]["dense"]["classifier"]["bias"])[0])
  model_config = ml_collections.ConfigDict(model_config.to_dict())
  model_config.update(
    models.known_overrides(model_config, attention_kernel="xla", layer_norm_kernel="xla")
  )
  net = detection.get_model(model_config, num_classes, saved.detection).clone(top_k_by_sort=True)
  names = list(class_names) if class_names else dataset_class_names(saved.dataset)
  if names and len(names) != num_classes:
    raise ValueError(f"{len(names)} class names for a {num_classes}-class detector")
  return Exportable(
    checkpoint=checkpoint,
    model=net,
    params=jax.tree.map(np.asarray, params),
    image_size=int(saved.dataset.image_size),
    pp=DEFAULT_PP,  # the evaluation's resize (ops/detection.py), in TensorFlow's bilinear
    class_names=names,
    num_classes=num_classes,
    sigmoid=True,
    dataset=saved.dataset,
    detection=True,
  )


def _tf_model(source: Exportable, batch_size: int = 0):
  """The model as a TF function of float32 [batch, S, S, 3]; batch_size 0: a symbolic batch."""
  from jax.experimental import jax2tf

  s = source.image_size
  shapes = None if batch_size else [f"(b, {s}, {s}, 3)"]
  return jax2tf.convert(source.apply, polymorphic_shapes=shapes, with_gradient=False)


def _outputs(source: Exportable, model_fn, images, top_k: int):
  import tensorflow as tf

  out = model_fn(images)
  if source.detection:
    return {**out, "class_names": tf.gather(tf.constant(source.names()), out["classes"])}
  if not source.num_classes:
    return {"representation": out}
  probs = tf.sigmoid(out) if source.sigmoid else tf.nn.softmax(out, axis=-1)
  top = tf.math.top_k(probs, k=min(top_k, source.num_classes))
  names = tf.constant(source.names())
  return {
    "logits": out,
    "probabilities": probs,
    "top_k_indices": top.indices,
    "top_k_probabilities": top.values,
    "top_k_names": tf.gather(names, top.indices),
  }


def build_tf_module(source: Exportable, top_k: int = 5):
  """A tf.Module with the three serving functions (see the module docstring)."""
  import tensorflow as tf

  from vit_jax.input_pipeline.ops import preprocess

  s = source.image_size
  try:
    preprocess_fn = preprocess.get_preprocess_fn(source.pp, s)
  except ValueError as e:
    raise ValueError(f"evaluation preprocessing {source.pp!r}: {_first_line(e)}") from None
  random_ops = {"inception_crop", "random_crop", "flip_lr", "randaugment"}
  used = {op for op, _, _ in preprocess.parse_spec(source.pp)}
  if used & random_ops:
    raise ValueError(
      f"evaluation preprocessing {source.pp!r} has random ops {sorted(used & random_ops)}"
    )
  # One tf.function with a fixed signature: traced (and the model lowered) once for all three.
  model_fn = tf.function(
    _tf_model(source),
    autograph=False,
    input_signature=[tf.TensorSpec([None, s, s, 3], tf.float32)],
  )
  seed = tf.zeros([2], tf.int64)  # the evaluation ops are deterministic

  def preprocess_batch(images):
    return tf.map_fn(
      lambda image: preprocess_fn(image, seed),
      images,
      fn_output_signature=tf.TensorSpec([s, s, 3], tf.float32),
    )

  module = tf.Module()

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
  def serve_bytes(image_bytes):
    return _outputs(source, model_fn, preprocess_batch(image_bytes), top_k)

  @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8, name="pixels")])
  def serve_pixels(pixels):
    return _outputs(source, model_fn, preprocess_batch(pixels), top_k)

  @tf.function(input_signature=[tf.TensorSpec([None, s, s, 3], tf.float32, name="images")])
  def serve_preprocessed(images):
    return _outputs(source, model_fn, images, top_k)

  module.serve_bytes, module.serve_pixels = serve_bytes, serve_pixels
  module.serve_preprocessed = serve_preprocessed
  return module


def write_saved_model(source: Exportable, out_dir: str, top_k: int = 5) -> None:
  import tensorflow as tf

  module = build_tf_module(source, top_k)
  signatures = {
    "serving_default": module.serve_bytes,
    "pixels": module.serve_pixels,
    "preprocessed": module.serve_preprocessed,
  }
  tf.saved_model.save(module, out_dir, signatures=signatures)


def tflite_bytes(
  source: Exportable,
  quantize: str = "none",
  calibration: np.ndarray | None = None,
  batch_size: int = 1,
) -> bytes:
  """The LiteRT flatbuffer of the model (see the module docstring) for batches of
  `batch_size`; 0: any batch (resizable input, but the symbolic batch's shape computations
  split the graph for XNNPACK: 15-60x slower on the demo's model, docs/export.md)."""
  import tensorflow as tf

  s = source.image_size
  fn = tf.function(_tf_model(source, batch_size), autograph=False)
  batch = batch_size or None
  concrete = fn.get_concrete_function(tf.TensorSpec([batch, s, s, 3], tf.float32, name="images"))
  converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], fn)
  if quantize == "float16":
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
  elif quantize == "int8":
    converter.optimizations = [tf.lite.Optimize.DEFAULT]  # no representative data: dynamic range
  elif quantize == "int8_full":
    if calibration is None or not len(calibration):
      raise ValueError("int8_full needs calibration images")

    def representative() -> Iterator[list[np.ndarray]]:
      n = batch_size or 1
      for start in range(0, len(calibration) - n + 1, n):
        yield [calibration[start : start + n]]

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
  return converter.convert()


# ---------------------------------------------------------------------------------------------
# ONNX.


def onnx_model(source: Exportable):
  from vit_jax.export import jax_to_onnx

  def fn(images):
    out = source.apply(images)
    if not source.num_classes:
      return (out,)
    probs = jax.nn.sigmoid(out) if source.sigmoid else jax.nn.softmax(out, axis=-1)
    return out, probs

  names = ["logits", "probabilities"] if source.num_classes else ["representation"]
  meta = {k: json.dumps(v) for k, v in source.metadata().items()}
  return jax_to_onnx.convert(
    fn,
    (1, source.image_size, source.image_size, 3),
    output_names=names,
    doc=f"vit_jax export of {source.checkpoint}",
    metadata=meta,
  )


# ---------------------------------------------------------------------------------------------
# One artifact.


def export(
  source: Exportable,
  fmt: str,
  out_dir: str,
  *,
  quantize: str = "none",
  calibration: np.ndarray | None = None,
  top_k: int = 5,
  batch_size: int = 1,
) -> dict[str, Any]:
  """Writes `source` in format `fmt` into the new directory `out_dir`; returns its metadata.

  Args:
    source: from `load`.
    fmt: one of FORMATS.
    out_dir: must not exist, or be empty; written only once the conversion succeeded.
    quantize: one of QUANTIZATIONS (float16 and int8: LiteRT only).
    calibration: float32 [N, S, S, 3] preprocessed images for int8_full; None reads
      `calibration_images(source)`.
    top_k: the SavedModel's number of top classes.
    batch_size: LiteRT's batch size; 0: any (see `tflite_bytes`). The other formats take any.
  """
  if fmt not in FORMATS:
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
  if quantize not in QUANTIZATIONS:
    raise ValueError(
      f"unknown quantization {quantize!r}; expected one of {', '.join(QUANTIZATIONS)}"
    )
  if quantize != "none" and fmt != "tflite":
    raise ValueError(f"--quantize={quantize} is for --format=tflite; {fmt} is exported in float32")
  if source.detection and fmt != "saved_model":
    raise ValueError(f"{source.checkpoint} is a detector: it exports as saved_model, not {fmt}")
  if "://" in out_dir:
    raise ValueError(
      f"--out={out_dir}: write to a local directory, then copy it (gcloud storage cp -r)"
    )
  if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
    raise ValueError(f"{out_dir} exists and is not an empty directory; choose a new --out")
  if source.note:
    logging.warning("%s", source.note)
  meta = dict(format=fmt, quantize=quantize, **source.metadata())
  parent = os.path.dirname(os.path.abspath(out_dir))
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
  try:
    if fmt == "saved_model":
      write_saved_model(source, staging, top_k)
      meta["signatures"] = {
        "serving_default": "image_bytes: string [batch] (encoded JPEG/PNG)",
        "pixels": "pixels: uint8 [batch, height, width, 3]",
        "preprocessed": meta["input"],
      }
    elif fmt == "tflite":
      if quantize == "int8_full":
        if calibration is None:
          calibration = calibration_images(source)
        meta["calibration_examples"] = int(len(calibration))
      meta["batch_size"] = batch_size or "any (resizable)"
      meta["input"] = meta["input"].replace("[batch,", f"[{batch_size or 'batch'},")
      with open(os.path.join(staging, FILES[fmt]), "wb") as f:
        f.write(tflite_bytes(source, quantize, calibration, batch_size))
    else:
      with open(os.path.join(staging, FILES[fmt]), "wb") as f:
        f.write(onnx_model(source).SerializeToString())
    with open(os.path.join(staging, METADATA_FILE), "w") as f:
      json.dump(meta, f, indent=2)
    os.chmod(staging, 0o755)  # mkdtemp's is 0o700
    if os.path.isdir(out_dir):
      os.rmdir(out_dir)
    os.replace(staging, out_dir)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return meta


def summary(meta: dict[str, Any], out_dir: str) -> str:
  """One line naming what was written."""
  what = meta["format"] + ("" if meta["quantize"] == "none" else f" ({meta['quantize']})")
  classes = f"{meta['num_classes']} classes" if meta["num_classes"] else "encoder"
  return f"wrote {what} to {out_dir}: {classes}, {meta['image_size']}px, preprocessing {meta['preprocessing']!r}"


def apply_fn(source: Exportable) -> Callable[[np.ndarray], np.ndarray]:
  """The JAX model on preprocessed images, jitted: the reference the exports are held to."""
  fn = jax.jit(source.apply)
  return lambda images: np.asarray(fn(images))
