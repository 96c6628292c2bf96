"""Segmentation data: images with a label per pixel — decoding, checks, folders and shards.

The folder layout and the shards' keys that the segmentation sources read: docs/segmentation.md.
A bad mask ends the run in one line naming it (`mask_problem`); bytes that do not decode raise
(the pipeline skips the record). The augmentation is ops/segmentation.py's.

numpy and PIL, no TensorFlow (but for `serialize_example`, which imports it).
"""

import io
import os

import numpy as np
from PIL import Image

from vit_jax.input_pipeline import bad_data

IGNORE_LABEL = 255
TASK = "segmentation"  # dataset_info.json's `task` for these shards (classification: none)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")


# ---------------------------------------------------------------------------------------------
# Decoding and checking.


def decode_image(encoded: bytes, channels: int) -> np.ndarray:
  """PNG/JPEG bytes → uint8 [h, w, 3] (RGB) or, for channels=1, [h, w, 1] (grey). Raises on
  bytes that do not decode, and past Pillow's own bound on pixels (DecompressionBombError)."""
  with Image.open(io.BytesIO(encoded)) as im:
    if channels == 1:
      return np.asarray(im.convert("L"))[..., None]
    return np.asarray(im.convert("RGB"))


def decode_mask(encoded: bytes) -> tuple[np.ndarray | None, str]:
  """A label PNG → (uint8 [h, w], '') — a palette image's indices or a grey image's values — or
  (None, PIL's mode) for an image of another mode. Raises on bytes that do not decode."""
  with Image.open(io.BytesIO(encoded)) as image:
    if image.mode not in ("P", "L"):
      return None, image.mode
    return np.asarray(image).astype(np.uint8), ""


def mask_problem(
  mask: np.ndarray | None, mode: str, image: np.ndarray, num_classes: int, where: str
) -> str:
  """The one line naming `where` for a mask of another PNG mode than 'P' or 'L', of another
  size than its image, or with a label outside the classes; '' for a good mask."""
  if mask is None:
    return (
      f"mask {where}: PNG mode {mode!r}; expected a palette ('P') or grey ('L') image whose "
      "pixel values are the labels"
    )
  if mask.shape != image.shape[:2]:
    return (
      f"mask {where} is {mask.shape[1]}x{mask.shape[0]} but its image is "
      f"{image.shape[1]}x{image.shape[0]}"
    )
  bad = np.unique(mask[(mask >= num_classes) & (mask != IGNORE_LABEL)])
  if bad.size:
    return (
      f"mask {where}: label {int(bad[0])} outside [0, {num_classes}) (and not the ignore "
      f"label {IGNORE_LABEL})"
    )
  return ""


# ---------------------------------------------------------------------------------------------
# A segmentation folder.


def folder_class_names(data_dir: str) -> list[str] | None:
  path = os.path.join(data_dir, "classes.txt")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return [line.strip() for line in f if line.strip()]


def _folder_split(data_dir: str, split: str) -> tuple[str, str]:
  root = os.path.join(data_dir, split)
  images, masks = os.path.join(root, "images"), os.path.join(root, "masks")
  if not os.path.isdir(images):
    raise FileNotFoundError(f"segmentation folder {root}: no images/ directory")
  if not os.path.isdir(masks):
    raise FileNotFoundError(
      f"segmentation folder {root}: no masks/ directory (masks/<name>.png for every image)"
    )
  return images, masks


def folder_listing(data_dir: str, split: str) -> list[str]:
  """The image file names of a folder's split, sorted (the order of the split's examples)."""
  image_dir, _ = _folder_split(data_dir, split)
  names = sorted(f for f in os.listdir(image_dir) if f.lower().endswith(IMAGE_EXTENSIONS))
  if not names:
    raise FileNotFoundError(f"segmentation folder {image_dir}: no .png/.jpg/.jpeg images")
  return names


def folder_paths(data_dir: str, split: str) -> tuple[list[str], list[str]]:
  """(image paths, mask paths) of a folder's split in its order, listed, not read: one line for
  an image without its mask."""
  image_dir, mask_dir = _folder_split(data_dir, split)
  masks = set(os.listdir(mask_dir))
  images, labels = [], []
  for name in folder_listing(data_dir, split):
    mask = os.path.splitext(name)[0] + ".png"
    if mask not in masks:
      raise FileNotFoundError(
        f"image {os.path.join(image_dir, name)} has no mask {os.path.join(mask_dir, mask)}"
      )
    images.append(os.path.join(image_dir, name))
    labels.append(os.path.join(mask_dir, mask))
  return images, labels


def read_folder_example(
  data_dir: str, split: str, name: str, num_classes: int
) -> tuple[bytes, np.ndarray, np.ndarray]:
  """One example of a folder, checked, for writing it elsewhere (make_shards): (the image file's
  bytes, image uint8 [h, w, 3] (RGB), mask uint8 [h, w]); ValueError (one line) for a bad mask
  or an image that does not decode (past Pillow's bound on pixels too)."""
  image_dir, mask_dir = _folder_split(data_dir, split)
  image_path = os.path.join(image_dir, name)
  mask_path = os.path.join(mask_dir, os.path.splitext(name)[0] + ".png")
  if not os.path.exists(mask_path):
    raise FileNotFoundError(f"image {image_path} has no mask {mask_path}")
  encoded = bad_data.read_file(image_path)
  try:
    image = decode_image(encoded, 3)
  except (OSError, Image.DecompressionBombError) as e:  # undecodable; past Pillow's own bound
    raise ValueError(f"image {image_path}: {e}") from e
  mask, mode = decode_mask(bad_data.read_file(mask_path))
  problem = mask_problem(mask, mode, image, num_classes, mask_path)
  if problem:
    raise ValueError(problem)
  return encoded, image, mask


# ---------------------------------------------------------------------------------------------
# Shards: vit_jax.tools.make_shards --task=segmentation writes them, shards.ShardsSource reads.

# Feature keys of a segmentation tf.train.Example (DeepLab's names, where it has them; what each
# holds: docs/segmentation.md). The position in the split lets a slice of shuffled shards take
# the positions a slice of the folder or synthetic task takes.
IMAGE_KEY = "image/encoded"
MASK_KEY = "image/segmentation/class/encoded"
HEIGHT_KEY, WIDTH_KEY = "image/height", "image/width"
NAME_KEY, INDEX_KEY = "image/filename", "image/index"


def encode_png(array: np.ndarray) -> bytes:
  """uint8 [h, w], [h, w, 1] or [h, w, 3] → PNG bytes (grey or RGB)."""
  if array.ndim == 3 and array.shape[2] == 1:
    array = array[..., 0]
  out = io.BytesIO()
  Image.fromarray(array).save(out, format="PNG")
  return out.getvalue()


def serialize_example(
  image_bytes: bytes, height: int, width: int, mask: np.ndarray, name: str, index: int
) -> bytes:
  """A serialized tf.train.Example: encoded image of height×width, mask uint8 [h, w] (as PNG)."""
  import tensorflow as tf  # Only the shards need it.

  def feature(value):
    if isinstance(value, bytes):
      return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

  features = {
    IMAGE_KEY: feature(image_bytes),
    MASK_KEY: feature(encode_png(mask)),
    HEIGHT_KEY: feature(height),
    WIDTH_KEY: feature(width),
    NAME_KEY: feature(name.encode()),
    INDEX_KEY: feature(index),
  }
  return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
