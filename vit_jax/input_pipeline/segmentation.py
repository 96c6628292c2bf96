"""Segmentation data: images with a label per pixel — the format, its checks and augmentation.

Three sources read it (vit_jax.input_pipeline.segmentation_sources; `dataset.source`):

  seg_builtin  an offline synthetic task made from the bundled real images (`dataset.name`:
               segmentation_synthetic.SYNTHETIC), in memory;
  seg_folder   a user's data: `data_dir/<split>/images/<name>.{png,jpg,jpeg}` and
               `data_dir/<split>/masks/<name>.png`, the mask's pixel values the labels (a
               palette PNG's indices, or a grey PNG's values; IGNORE_LABEL = 255 is ignored);
               class names from `data_dir/classes.txt` (one per line, background first) or
               `dataset.num_classes`;
  seg_shards   TFRecord shards in `data_dir` (local or gs://) written by `python -m
               vit_jax.tools.make_shards --task=segmentation` from a folder or a synthetic task:
               per tf.train.Example the encoded image, its mask as a grey PNG of class indices,
               their size, the name and the position in the written split (IMAGE_KEY, ...);
               classes, split sizes and the ignore label from `data_dir/dataset_info.json`
               (`task: segmentation`).

A record becomes an example here (`example`, run per record inside tf.data by
vit_jax.input_pipeline.examples): the image and mask decoded with PIL (the image as RGB, or grey
for grey shards), checked, then augmented. Bytes that do not decode raise, and the pipeline skips
the record (a mask-0 example, counted); a mask that is no palette or grey PNG, a mask of another
size than its image, and a label outside [0, num_classes) other than IGNORE_LABEL are data errors
that end the run in one line naming the mask (`mask_problem`).

Augmentation (`pp_train`, `pp_eval`: ops joined by '|') moves image and mask together:
`random_crop(min_area)` (a window of min_area..1 of the area, aspect 3/4..4/3), `flip_lr` (half
the time) and the final resize to `image_size` (bilinear for the image, nearest neighbour for
the mask). Images come out float32 [-1, 1] with 3 channels, labels int32 [H, W].

numpy and PIL, no TensorFlow (but for `serialize_example`, which imports it): image and mask
ops are simplest to keep aligned on arrays, and predict preprocesses with PIL too.
"""

import io
import os
import re

import numpy as np
from PIL import Image

from vit_jax.input_pipeline import bad_data

IGNORE_LABEL = 255
TASK = "segmentation"  # dataset_info.json's `task` for these shards (classification: none)
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")


def resize(array: np.ndarray, hw: tuple[int, int], nearest: bool) -> np.ndarray:
  """uint8 [h, w] or [h, w, c] → [hw[0], hw[1], ...] with PIL (bilinear or nearest)."""
  if array.shape[:2] == tuple(hw):
    return array
  squeeze = array.ndim == 3 and array.shape[2] == 1
  image = Image.fromarray(array[..., 0] if squeeze else array)
  out = np.asarray(image.resize((hw[1], hw[0]), Image.NEAREST if nearest else Image.BILINEAR))
  return out[..., None] if squeeze else out


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


def example(
  image: bytes | np.ndarray,
  mask: bytes | np.ndarray,
  where: str,
  *,
  num_classes: int,
  channels: int,
  ops: list[tuple[str, tuple[float, ...]]],
  size: int,
  rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, str]:
  """One record → (image float32 [size, size, 3], labels int32 [size, size], problem).

  `image` and `mask` are encoded bytes (decoded here; bytes that do not decode raise) or uint8
  arrays [h, w, c] and [h, w]; `problem` is `mask_problem`'s line ('' for a good record, else
  the arrays are blank).
  """
  mode = ""
  if isinstance(image, bytes):
    image = decode_image(image, channels)
  if isinstance(mask, bytes):
    mask, mode = decode_mask(mask)
  problem = mask_problem(mask, mode, image, num_classes, where)
  if problem:
    return (
      np.zeros((size, size, 3), np.float32),
      np.full((size, size), IGNORE_LABEL, np.int32),
      problem,
    )
  image, labels = augment(image, mask, ops, size, rng)
  return image, labels, ""


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
# Shards: vit_jax.tools.make_shards --task=segmentation writes them, segmentation_sources reads.

# Feature keys of a segmentation tf.train.Example (DeepLab's names, where it has them): the
# encoded image, its mask as a grey PNG of class indices, their size, the name (file name or
# `split/i`) and the position in the split (the shards are shuffled; a slice of a split takes
# the positions a slice of the folder or synthetic task takes).
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


# ---------------------------------------------------------------------------------------------
# Augmentation.

_OP_RE = re.compile(r"^(\w+)(?:\(([^)]*)\))?$")
OPS = ("random_crop", "flip_lr", "resize")


def parse_ops(spec: str) -> list[tuple[str, tuple[float, ...]]]:
  """'random_crop(0.5)|flip_lr' → [('random_crop', (0.5,)), ('flip_lr', ())]."""
  ops = []
  for part in filter(None, (p.strip() for p in (spec or "").split("|"))):
    match = _OP_RE.match(part)
    if not match or match.group(1) not in OPS:
      raise ValueError(f"segmentation preprocessing op {part!r}; known ops: {', '.join(OPS)}")
    args = tuple(float(a) for a in match.group(2).split(",")) if match.group(2) else ()
    ops.append((match.group(1), args))
  return ops


def augment(
  image: np.ndarray,
  mask: np.ndarray,
  ops: list[tuple[str, tuple[float, ...]]],
  size: int,
  rng: np.random.Generator | None,
) -> tuple[np.ndarray, np.ndarray]:
  """Applies `ops` to image uint8 [h, w, c] and mask uint8 [h, w] alike, then resizes both to
  size×size; returns image float32 [size, size, 3] in [-1, 1] and labels int32 [size, size]."""
  for name, args in ops:
    if name == "random_crop":
      h, w = mask.shape
      area = h * w * rng.uniform(args[0] if args else 0.5, 1.0)
      aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
      ch = int(min(h, max(1, round(np.sqrt(area / aspect)))))
      cw = int(min(w, max(1, round(np.sqrt(area * aspect)))))
      y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
      image, mask = image[y : y + ch, x : x + cw], mask[y : y + ch, x : x + cw]
    elif name == "flip_lr" and rng.random() < 0.5:
      image, mask = image[:, ::-1], mask[:, ::-1]
  image = resize(np.ascontiguousarray(image), (size, size), nearest=False)
  mask = resize(np.ascontiguousarray(mask), (size, size), nearest=True)
  if image.ndim == 2:
    image = image[..., None]
  if image.shape[2] == 1:
    image = np.repeat(image, 3, axis=2)
  return (image.astype(np.float32) / 127.5 - 1.0), mask.astype(np.int32)
