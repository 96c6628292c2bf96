"""A trained checkpoint as an image classifier, without TensorFlow: reading image files, the
evaluation preprocessing in PIL and numpy, the model's token grid, and `Classifier`.

The library behind `python -m vit_jax.predict` and vit_jax.analysis. Images are preprocessed as
in evaluation: the saved `pp_eval` spec (vit_jax.input_pipeline.ops.pil), or a resize to the
model's size. TensorFlow is imported only to look up a dataset's class names when no other
source has them; this file must not import it otherwise.
"""

import math
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from PIL import Image

from vit_jax import checkpoint as checkpoint_lib
from vit_jax import models
from vit_jax.input_pipeline.ops import pil as pil_ops

DEFAULT_PP = "decode|resize|value_range(-1, 1)"


def preprocess(image: Image.Image, image_size: int, spec: str = DEFAULT_PP) -> np.ndarray:
  """A PIL image → float32 [image_size, image_size, 3] per the evaluation spec: its
  deterministic ops (vit_jax.input_pipeline.ops.pil); a random (training) op raises ValueError."""
  return pil_ops.preprocess(image, image_size, spec)


def _batched(apply, params, arrays: np.ndarray, batch_size: int) -> Any:
  """`apply(params, batch)` over `arrays` in zero-padded batches of `batch_size` (one compile);
  an output that is a tree of arrays comes back as that tree, each leaf concatenated."""
  out = []
  for start in range(0, len(arrays), batch_size):
    chunk = arrays[start : start + batch_size]
    n = len(chunk)
    chunk = np.concatenate([chunk, np.zeros((batch_size - n, *chunk.shape[1:]), np.float32)])
    out.append(jax.tree.map(lambda x, n=n: np.asarray(x)[:n], apply(params, chunk)))
  return jax.tree.map(lambda *xs: np.concatenate(xs), *out)


# ---------------------------------------------------------------------------------------------
# The classifier and what travels with it.


def token_stride(model: Any) -> int:
  """Input pixels per step of the token grid: the patch size, times the hybrid stem's stride.

  Args:
    model: a `VisionTransformer` or a model ConfigDict (`patch_size`, `resnet`).
  """
  resnet = model.resnet if hasattr(model, "resnet") else model.get("resnet")
  # A ResNet stem of S stages downsamples by 2^(S+1) before the patches (models.py).
  stem = 2 ** (1 + len(resnet["num_layers"])) if resnet is not None else 1
  return int(model.patch_size) * stem


def native_image_size(params: dict[str, Any], model: Any) -> int:
  """The (square) input size that the checkpoint's position embeddings were trained at.

  Raises:
    ValueError: the checkpoint has no table (fixed sin-cos embeddings, `posemb='sincos2d'`,
      fit any size) and so no size of its own: give one.
  """
  posemb = params.get("Transformer", {}).get("posembed_input")
  if posemb is None:
    raise ValueError(
      "the checkpoint has fixed sin-cos position embeddings (no table) and no saved config "
      "giving its image size: pass image_size (--image_size)"
    )
  tokens = posemb["pos_embedding"].shape[1]
  return math.isqrt(tokens - checkpoint_lib.num_prefix_tokens(params)) * token_stride(model)


class Classifier:
  """A trained checkpoint with its architecture, input size, preprocessing and class names."""

  def __init__(
    self,
    checkpoint: str,
    *,
    model: str | None = None,
    image_size: int = 0,
    class_names: Sequence[str] | None = None,
  ):
    """Args: see the module docstring and the flags of the same names."""
    model_config = models.get_model_config(model) if model else None
    model_config, params, saved = checkpoint_lib.load_backbone(checkpoint, model_config)
    if "head" not in params:
      raise ValueError(f"{checkpoint} has no classification head (a headless backbone?)")
    # The head's leaves (ViT `kernel` [D, K], BiT `conv2d/kernel` [1, 1, C, K], biases [K]) all
    # end in the class axis.
    self.num_classes = int(np.shape(jax.tree_util.tree_leaves(params["head"])[0])[-1])
    rep = params["pre_logits"]["kernel"].shape[-1] if "pre_logits" in params else None
    self.model = models.get_model(
      model_config,
      self.num_classes,
      **models.known_overrides(model_config, representation_size=rep, dropout_rate=0.0),
    )
    dataset = saved.get("dataset") if saved is not None else None
    self.image_size = image_size or (
      dataset.image_size if dataset else native_image_size(params, self.model)
    )
    # Another resolution than the checkpoint's: position embeddings resized to its patch grid.
    self.params = checkpoint_lib.fit_posemb(params, self.model, model_config, self.image_size)
    # A head trained with sigmoid cross-entropy (multi-label) scores classes independently.
    self.sigmoid = saved is not None and saved.get("loss") == "sigmoid_xent"
    self.pp = (dataset.get("pp_eval") if dataset else None) or DEFAULT_PP
    self.class_names = list(class_names) if class_names else dataset_class_names(dataset)
    if self.class_names and (n := len(self.class_names)) != self.num_classes:
      logging.warning("%d class names for a %d-class head; printing indices", n, self.num_classes)
      self.class_names = None
    self._apply = jax.jit(lambda p, x: self.model.apply({"params": p}, x, train=False)[0])

  def name(self, index: int) -> str:
    return self.class_names[index] if self.class_names else f"class {index}"

  def probabilities(self, images: Sequence[Image.Image], batch_size: int = 32) -> np.ndarray:
    """Class probabilities [N, K] of PIL images: softmax of the logits, or their sigmoid for a
    head trained with sigmoid cross-entropy (then rows need not sum to 1)."""
    arrays = np.stack([preprocess(im, self.image_size, self.pp) for im in images])
    act = jax.nn.sigmoid if self.sigmoid else jax.nn.softmax
    return _batched(lambda p, x: act(self._apply(p, x)), self.params, arrays, batch_size)

  def top_k(self, images: Sequence[Image.Image], k: int = 5) -> list[list[tuple[int, str, float]]]:
    """For each image, the k most likely (class index, name, probability), best first."""
    probs = self.probabilities(images)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, : min(k, self.num_classes)]
    return [[(int(i), self.name(int(i)), float(probs[n, i])) for i in t] for n, t in enumerate(top)]


def dataset_class_names(dataset: ml_collections.ConfigDict | None) -> list[str] | None:
  """Class names of the dataset a checkpoint was trained on (imports TensorFlow), or None."""
  if not dataset or not dataset.get("name"):
    return None
  if dataset.get("class_names"):
    return list(dataset.class_names)
  try:
    from vit_jax import input_pipeline  # TensorFlow: only to look the names up

    info = input_pipeline.get_dataset_info(input_pipeline.dataset_config(**dataset.to_dict()))
  except Exception as e:  # noqa: BLE001 — names are a nicety; predictions stand without them
    logging.warning("no class names for dataset %s: %s", dataset.get("name"), e)
    return None
  return list(info.class_names) if info.class_names else None


# What PIL raises for a file that is no readable image (truncated, another format, too large).
UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def why_unreadable(error: BaseException) -> str:
  """The first line of what PIL said about an unreadable file."""
  return str(error).splitlines()[0] if str(error) else type(error).__name__


def skipped_line(skipped: Sequence[tuple[str, str]], total: int) -> str:
  """One line counting and naming the unreadable images: (path, why) pairs of `total`."""
  listed = "; ".join(f"{p} ({why})" for p, why in skipped)
  return f"skipped {len(skipped)} of {total} images that could not be read: {listed}"


def read_images(paths: Sequence[str]) -> tuple[list[str], list[Image.Image]]:
  """(the paths that were read, their decoded images), in the order of `paths`; unreadable ones
  are skipped with one warning line, and ValueError names the first when none could be read."""
  read, images, skipped = [], [], []
  for path in paths:
    try:
      image = Image.open(path)
      image.load()  # decodes now (a truncated file fails here) and closes the file
    except UNREADABLE as e:
      skipped.append((path, why_unreadable(e)))
      continue
    read.append(path)
    images.append(image)
  if not images:
    path, why = skipped[0]
    raise ValueError(f"none of the {len(paths)} images could be read: {path} ({why})")
  if skipped:
    logging.warning("%s", skipped_line(skipped, len(paths)))
  return read, images


def read_class_names(path: str) -> list[str]:
  with open(path) as f:
    return [line.strip() for line in f if line.strip()]


# ---------------------------------------------------------------------------------------------
# Segmentation (a workdir of the `segment` stage, configs/segment.py).

# Colours of the first classes in written masks (palette PNGs: the pixel values are the class
# indices, the palette only shows them); the background is black.
_PALETTE = [
  tuple(bytes.fromhex(rgb))
  for rgb in "000000 e6194b 3cb44b ffe119 0082c8 f58230 911eb4 46f0f0 f032e6 d2f53c fabed4 008080 "
  "aa6e28 800000 808000 000080".split()
]


def mask_image(mask: np.ndarray) -> Image.Image:
  """uint8 class indices [H, W] → a palette PNG image whose pixel values are those indices."""
  image = Image.fromarray(np.asarray(mask, np.uint8), mode="P")
  palette = [c for i in range(256) for c in _PALETTE[i % len(_PALETTE)]]
  image.putpalette(palette)
  return image


def overlay_image(image: Image.Image, mask: np.ndarray, alpha: float = 0.5) -> Image.Image:
  """The image with the mask's class colours blended in (background left as it is)."""
  rgb = np.asarray(image.convert("RGB").resize(mask.shape[::-1]), np.float32)
  colours = np.asarray([_PALETTE[i % len(_PALETTE)] for i in range(256)], np.float32)[mask]
  blend = np.where(mask[..., None] > 0, (1 - alpha) * rgb + alpha * colours, rgb)
  return Image.fromarray(blend.astype(np.uint8))


class Segmenter:
  """A `segment` stage checkpoint as a per-pixel classifier of image files.

  The workdir's `config.json` gives the encoder, the head (`segmentation`), the input size and
  the dataset's class names. Images are resized to the input size (bilinear), as the stage's
  evaluation does, and the predicted mask is resized back to the image's own size (nearest).
  """

  def __init__(self, checkpoint: str):
    from vit_jax.models import segmentation  # noqa: PLC0415

    model_config, params, saved = checkpoint_lib.load_backbone(checkpoint)
    if saved is None or saved.get("stage") != "segment":
      raise ValueError(f"{checkpoint} is not a workdir of the segment stage (configs/segment.py)")
    head = saved.segmentation
    last = params["head"].get("linear") or params["head"]["classifier"]  # the head's classifier
    self.num_classes = int(np.shape(last["bias"])[0])
    self.model = segmentation.get_model(
      model_config, self.num_classes, head.head, tuple(head.layers), int(head.width)
    )
    self.params = params
    self.image_size = int(saved.dataset.image_size)
    names = dataset_class_names(saved.dataset)
    self.class_names = names if names and len(names) == self.num_classes else None
    self._apply = jax.jit(lambda p, x: self.model.apply({"params": p}, x, train=False)[0])

  def masks(self, images: Sequence[Image.Image], batch_size: int = 16) -> list[np.ndarray]:
    """uint8 class indices [h, w] per image, at each image's own size."""
    arrays = np.stack([preprocess(im, self.image_size) for im in images])  # DEFAULT_PP: a resize
    out = np.argmax(_batched(self._apply, self.params, arrays, batch_size), -1)
    return [
      np.asarray(Image.fromarray(m.astype(np.uint8)).resize(im.size, Image.Resampling.NEAREST))
      for m, im in zip(out, images, strict=True)
    ]


# ---------------------------------------------------------------------------------------------
# Detection (a workdir of the `detect` stage, configs/detect.py).


class Detector:
  """A `detect` stage checkpoint as an object detector of image files.

  The workdir's `config.json` gives the encoder, the pyramid and head (`detection`), the input
  size and the dataset's class names. Images are resized to the input size exactly as the
  stage's evaluation resizes them (vit_jax.input_pipeline.ops.detection.augment), so the same
  file gives the evaluator's detections; boxes come back in the image's own pixels.
  """

  def __init__(self, checkpoint: str):
    from vit_jax.models import detection  # noqa: PLC0415

    model_config, params, saved = checkpoint_lib.load_backbone(checkpoint)
    if saved is None or saved.get("stage") != "detect":
      raise ValueError(f"{checkpoint} is not a workdir of the detect stage (configs/detect.py)")
    self.num_classes = int(np.shape(params["head"]["dense"]["classifier"]["bias"])[0])
    self.model = detection.get_model(model_config, self.num_classes, saved.detection)
    self.params = params
    self.image_size = int(saved.dataset.image_size)
    names = dataset_class_names(saved.dataset)
    self.class_names = names if names and len(names) == self.num_classes else None
    self._apply = jax.jit(
      lambda p, x: self.model.apply({"params": p}, x, train=False)[1]["detections"]
    )

  def name(self, k: int) -> str:
    return self.class_names[k] if self.class_names else f"class {k}"

  def preprocess(self, image: Image.Image) -> np.ndarray:
    """float32 [S, S, 3] in [-1, 1]: the evaluation's resize of the image's RGB pixels."""
    from vit_jax.input_pipeline.ops import detection as detection_ops  # noqa: PLC0415

    pixels = np.asarray(image.convert("RGB"))
    return detection_ops.augment(pixels, np.zeros((0, 8)), [], self.image_size, None)[0]

  def detect(
    self, images: Sequence[Image.Image], batch_size: int = 16
  ) -> list[dict[str, np.ndarray]]:
    """Per image: `boxes` float32 [n, 4] (ymin, xmin, ymax, xmax normalised to [0, 1]),
    `scores` [n] (descending, all > 0) and `classes` int32 [n]."""
    arrays = np.stack([self.preprocess(im) for im in images])
    out = _batched(self._apply, self.params, arrays, batch_size)
    keep = out["scores"] > 0
    return [{k: v[i][keep[i]] for k, v in out.items()} for i in range(len(arrays))]


# Colours of the drawn boxes, by class.
_BOX_COLOURS = [c for c in _PALETTE if c != (0, 0, 0)]


def draw_boxes(
  image: Image.Image, boxes: np.ndarray, labels: Sequence[str], classes: Sequence[int]
) -> Image.Image:
  """The image (RGB) with each box [x, y, w, h] (pixels) outlined in its class's colour and
  labelled."""
  from PIL import ImageDraw  # noqa: PLC0415

  out = image.convert("RGB")
  draw = ImageDraw.Draw(out)
  for (x, y, w, h), text, k in zip(boxes, labels, classes, strict=True):
    colour = _BOX_COLOURS[int(k) % len(_BOX_COLOURS)]
    draw.rectangle([x, y, x + w, y + h], outline=colour)
    draw.text((x + 1, y + 1), text, fill=colour)
  return out
