"""Segmentation data: images with a label per pixel, in memory, augmented in numpy.

Three sources (`dataset.source`):

  seg_builtin  an offline synthetic task made from the bundled real images (`dataset.name`):
               `fashion_mnist_seg`, `mnist_seg` or `animal_mnist_seg`. Each 48x48 grey canvas
               holds 1 to 3 objects of the named dataset (28px images resized to 16..28 px,
               placed at random, later ones on top) over a blocky, noisy background (grey
               levels 0..59); an object pixel of source intensity >= 96 is labelled with the
               object's class + 1, a softer edge pixel (32..95) with IGNORE_LABEL, the rest
               (background) 0. Splits `train` (4,000 canvases), `val` (500) and `test` (1,000),
               made deterministically from GENERATOR_SEED: train and val objects come from
               disjoint parts of the source's training split, test objects from its test split.
  seg_folder   a user's data: `data_dir/<split>/images/<name>.{png,jpg,jpeg}` and
               `data_dir/<split>/masks/<name>.png`, the mask's pixel values the labels (a
               palette PNG's indices, or a grey PNG's values; IGNORE_LABEL = 255 is ignored);
               class names from `data_dir/classes.txt` (one per line, background first) or
               `dataset.num_classes`.
  seg_shards   TFRecord shards in `data_dir` (local or gs://) written by `python -m
               vit_jax.tools.make_shards --task=segmentation` from a folder or a synthetic task:
               per tf.train.Example the encoded image, its mask as a grey PNG of class indices,
               their size, the name and the position in the written split (IMAGE_KEY, ...);
               classes, split sizes and the ignore label from `data_dir/dataset_info.json`
               (`task: segmentation`). For now the shards are read whole, with tf.data, into the
               same in-memory arrays as the other two sources, in the written split's order:
               a split (or slice) gives exactly the arrays its folder or task gives.

Splits can be sliced as the other in-memory sources (`train[:1000]`, vit_jax.input_pipeline.
splits). The split is loaded whole before training, so bad input ends the run at its start
with one line naming the file (and record), never a skipped example: a folder without `masks/`,
an image without its mask, an image declaring more than `dataset.max_image_pixels` pixels
(checked before decoding), a mask whose size differs from its image, a label outside
[0, num_classes) other than IGNORE_LABEL; a shards directory without dataset_info.json, shards of
a classification task, a split the shards do not have or whose files disagree with its
dataset_info.json listing, a damaged shard. A file that cannot be read is read again first
(vit_jax.input_pipeline.bad_data).

Augmentation (`pp_train`, `pp_eval`: ops joined by '|') moves image and mask together:
`random_crop(min_area)` (a window of min_area..1 of the area, aspect 3/4..4/3), `flip_lr` (half
the time) and the final resize to `image_size` (bilinear for the image, nearest neighbour for
the mask). Images come out float32 [-1, 1] with 3 channels, labels int32 [H, W].

The iterators have the trainer's interface (vit_jax.input_pipeline.make_train_iterator,
make_eval_iterator): row r of global batch b is stream position b·B + r, the example there and
its augmentation a function of (seed, position) alone, on any number of hosts and any mesh; the
state {'num_records', 'num_skipped', 'seed', 'process_count'} resumes exactly.

numpy and PIL (TensorFlow only to read and write the shards, imported there): the data is small
and in memory, and image/mask ops are simplest to keep aligned on arrays.
"""

import dataclasses
import functools
import io
import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
from PIL import Image

from vit_jax.input_pipeline import bad_data, builtin, layout, splits

IGNORE_LABEL = 255
SOURCES = ("seg_builtin", "seg_folder", "seg_shards")
GENERATOR_SEED = 0
CANVAS = 48
SPLIT_SIZES = {"train": 4000, "val": 500, "test": 1000}
# name → the bundled classification dataset whose images are the objects.
SYNTHETIC = {
  "fashion_mnist_seg": "fashion_mnist",
  "mnist_seg": "mnist_5k",
  "animal_mnist_seg": "animal_mnist",
}
_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")


@dataclasses.dataclass(frozen=True)
class SegmentationData:
  """A split in memory: images uint8 [h, w, c] and masks uint8 [h, w] (lists: sizes may vary)."""

  images: list[np.ndarray]
  masks: list[np.ndarray]
  names: list[str]


@dataclasses.dataclass
class SegmentationInfo:
  """The trainer's DatasetInfo for a segmentation dataset (labels are per pixel)."""

  num_classes: int
  num_examples: dict[str, int | None]
  class_names: list[str] | None
  multi_label: bool = False
  ignore_label: int = IGNORE_LABEL


# ---------------------------------------------------------------------------------------------
# The synthetic task.


def _resize(array: np.ndarray, hw: tuple[int, int], nearest: bool) -> np.ndarray:
  """uint8 [h, w] or [h, w, c] → [hw[0], hw[1], ...] with PIL (bilinear or nearest)."""
  if array.shape[:2] == tuple(hw):
    return array
  squeeze = array.ndim == 3 and array.shape[2] == 1
  image = Image.fromarray(array[..., 0] if squeeze else array)
  out = np.asarray(image.resize((hw[1], hw[0]), Image.NEAREST if nearest else Image.BILINEAR))
  return out[..., None] if squeeze else out


def make_synthetic(
  objects: np.ndarray,
  labels: np.ndarray,
  num: int,
  seed: int,
  canvas: int = CANVAS,
) -> tuple[np.ndarray, np.ndarray]:
  """Canvases of objects (see the module docstring).

  Args:
    objects: uint8 [N, 28, 28, 1] bright objects on black.
    labels: int [N], their classes (the mask gets class + 1).
    num: canvases to make.
    seed: all random draws (objects, sizes, places, background).
    canvas: side of the square canvases.

  Returns:
    images uint8 [num, canvas, canvas, 1], masks uint8 [num, canvas, canvas].
  """
  rng = np.random.default_rng(seed)
  images = np.zeros((num, canvas, canvas), np.uint8)
  masks = np.zeros((num, canvas, canvas), np.uint8)
  block = 6
  for n in range(num):
    coarse = rng.integers(0, 40, (canvas // block + 1,) * 2)
    background = np.kron(coarse, np.ones((block, block)))[:canvas, :canvas]
    images[n] = (background + rng.integers(0, 20, (canvas, canvas))).astype(np.uint8)
    for _ in range(int(rng.integers(1, 4))):
      i = int(rng.integers(len(labels)))
      size = int(rng.integers(16, 29))
      obj = _resize(objects[i, ..., 0], (size, size), nearest=False)
      y, x = (int(v) for v in rng.integers(0, canvas - size + 1, 2))
      shown = obj >= 32
      images[n, y : y + size, x : x + size][shown] = obj[shown]
      window = masks[n, y : y + size, x : x + size]
      window[shown] = IGNORE_LABEL
      window[obj >= 96] = int(labels[i]) + 1
  return images[..., None], masks


@functools.cache
def synthetic_split(name: str, split: str) -> SegmentationData:
  if name not in SYNTHETIC:
    raise ValueError(f"seg_builtin dataset {name!r}; expected one of {sorted(SYNTHETIC)}")
  if split not in SPLIT_SIZES:
    raise ValueError(
      f"seg_builtin dataset {name!r} has no split {split!r}; splits: {sorted(SPLIT_SIZES)}"
    )
  source = builtin.load(SYNTHETIC[name])
  if split == "test":
    objects, labels = source.splits["test"]
  else:
    objects, labels = source.splits["train"]
    order = np.random.default_rng(GENERATOR_SEED).permutation(len(labels))
    cut = int(len(labels) * 0.9)
    rows = order[:cut] if split == "train" else order[cut:]
    objects, labels = objects[rows], labels[rows]
  salt = {"train": 0, "val": 1, "test": 2}[split]
  images, masks = make_synthetic(
    objects, labels, SPLIT_SIZES[split], seed=GENERATOR_SEED * 1000 + salt
  )
  return SegmentationData(list(images), list(masks), [f"{split}/{i}" for i in range(len(masks))])


def synthetic_class_names(name: str) -> list[str]:
  """Background, then the object dataset's classes."""
  return ["background", *builtin.load(SYNTHETIC[name]).class_names]


# ---------------------------------------------------------------------------------------------
# The folder source.


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


def folder_class_names(data_dir: str) -> list[str] | None:
  path = os.path.join(data_dir, "classes.txt")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return [line.strip() for line in f if line.strip()]


def read_mask(path: str | io.BytesIO, where: str | None = None) -> np.ndarray:
  """A label PNG → uint8 [h, w]: a palette image's indices or a grey image's values."""
  with Image.open(path) as image:
    if image.mode not in ("P", "L"):
      raise ValueError(
        f"mask {where or path}: PNG mode {image.mode!r}; expected a palette ('P') or grey ('L') "
        "image whose pixel values are the labels"
      )
    return np.asarray(image).astype(np.uint8)


def _check_mask(mask: np.ndarray, image: np.ndarray, num_classes: int, where: str) -> None:
  """One line naming `where` for a mask of another size than its image or a label outside."""
  if mask.shape != image.shape[:2]:
    raise ValueError(
      f"mask {where} is {mask.shape[1]}x{mask.shape[0]} but its image is "
      f"{image.shape[1]}x{image.shape[0]}"
    )
  bad = np.unique(mask[(mask >= num_classes) & (mask != IGNORE_LABEL)])
  if bad.size:
    raise ValueError(
      f"mask {where}: label {int(bad[0])} outside [0, {num_classes}) (and not the ignore "
      f"label {IGNORE_LABEL})"
    )


def folder_listing(data_dir: str, split: str) -> list[str]:
  """The image file names of a folder's split, sorted (the order of the split's examples)."""
  image_dir, _ = _folder_split(data_dir, split)
  names = sorted(f for f in os.listdir(image_dir) if f.lower().endswith(_IMAGE_EXTENSIONS))
  if not names:
    raise FileNotFoundError(f"segmentation folder {image_dir}: no .png/.jpg/.jpeg images")
  return names


def read_folder_example(
  data_dir: str, split: str, name: str, num_classes: int, max_pixels: int = 0
) -> tuple[bytes, np.ndarray, np.ndarray]:
  """One example of a folder, checked: (the image file's bytes, image uint8 [h, w, 3] (RGB),
  mask uint8 [h, w])."""
  image_dir, mask_dir = _folder_split(data_dir, split)
  image_path = os.path.join(image_dir, name)
  mask_path = os.path.join(mask_dir, os.path.splitext(name)[0] + ".png")
  if not os.path.exists(mask_path):
    raise FileNotFoundError(f"image {image_path} has no mask {mask_path}")
  encoded = bad_data.read_file(image_path)
  image = _decode_image(encoded, 3, max_pixels, image_path)
  mask = read_mask(io.BytesIO(bad_data.read_file(mask_path)), mask_path)
  _check_mask(mask, image, num_classes, mask_path)
  return encoded, image, mask


def _decode_image(encoded: bytes, channels: int, max_pixels: int, where: str) -> np.ndarray:
  """PNG/JPEG bytes → uint8 [h, w, 3] (RGB) or, for channels=1, [h, w, 1] (grey); one line for
  an image whose header declares more than `max_pixels` (0: no bound), before decoding it."""
  try:
    im = Image.open(io.BytesIO(encoded))
  except Image.DecompressionBombError as e:  # Pillow's own bound, twice its warning's
    raise ValueError(f"image {where}: {e}") from e
  with im:
    if 0 < max_pixels < im.width * im.height:
      raise ValueError(
        f"image {where} declares {im.width}x{im.height} = {im.width * im.height:,} pixels, more "
        f"than dataset.max_image_pixels={max_pixels:,}"
      )
    if channels == 1:
      return np.asarray(im.convert("L"))[..., None]
    return np.asarray(im.convert("RGB"))


@functools.cache
def _folder_data(data_dir: str, split: str, num_classes: int, max_pixels: int) -> SegmentationData:
  names = folder_listing(data_dir, split)
  images, masks = [], []
  for name in names:
    _, image, mask = read_folder_example(data_dir, split, name, num_classes, max_pixels)
    images.append(image)
    masks.append(mask)
  return SegmentationData(images, masks, names)


# ---------------------------------------------------------------------------------------------
# The shards source: TFRecord shards written by vit_jax.tools.make_shards --task=segmentation.

# Feature keys of a segmentation tf.train.Example (DeepLab's names, where it has them): the
# encoded image, its mask as a grey PNG of class indices, their size, the name (file name or
# `split/i`) and the position in the split (the shards are shuffled; the source restores the
# written split's order, so its slices are the folder's or the synthetic task's).
IMAGE_KEY = "image/encoded"
MASK_KEY = "image/segmentation/class/encoded"
HEIGHT_KEY, WIDTH_KEY = "image/height", "image/width"
NAME_KEY, INDEX_KEY = "image/filename", "image/index"
TASK = "segmentation"  # dataset_info.json's `task` for these shards (classification: none)


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


def shards_info(data_dir: str) -> dict:
  """dataset_info.json of segmentation shards; one line if it is missing or of another task."""
  from vit_jax.input_pipeline import sources  # It imports this module.

  info = sources.read_info_json(data_dir)
  if info is None:
    raise FileNotFoundError(
      f"segmentation shards {data_dir}: no {sources.INFO_FILENAME} (write the shards with "
      "python -m vit_jax.tools.make_shards --task=segmentation)"
    )
  if info.get("task") != TASK:
    raise ValueError(
      f"{os.path.join(data_dir, sources.INFO_FILENAME)}: shards of a "
      f"{info.get('task', 'classification')} task, not segmentation (source 'tfrecord' reads "
      "classification shards)"
    )
  return info


def _shard_records(path: str) -> list[bytes]:
  """The records of one shard; a damaged one is one line, an I/O error is read again."""
  import tensorflow as tf

  def read():
    try:
      return list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    except tf.errors.DataLossError as e:
      raise ValueError(f"segmentation shard {path}: {e.message.splitlines()[0]}") from e

  return bad_data.with_retries(read, path)


@functools.cache
def _shards_data(data_dir: str, split: str, max_pixels: int) -> SegmentationData:
  import tensorflow as tf  # Only the shards need it.

  from vit_jax.input_pipeline import sources  # It imports this module.

  info = shards_info(data_dir)
  entry = info["splits"].get(split)
  if entry is None:
    raise FileNotFoundError(
      f"segmentation shards {data_dir}: no split {split!r}; splits: {sorted(info['splits'])}"
    )
  pattern = os.path.join(data_dir, entry["file_pattern"])
  sources.check_listed(tf.io.gfile.glob(pattern), entry["shards"], pattern, split)
  num_classes, channels = len(info["class_names"]), int(info["image_channels"])
  n = int(entry["num_examples"])
  images, masks, names = [None] * n, [None] * n, [None] * n
  for file in sorted(entry["shards"]):
    path = os.path.join(data_dir, file)
    for r, record in enumerate(_shard_records(path)):
      where = f"{path} record {r}"
      f = tf.train.Example.FromString(record).features.feature
      i, name = int(f[INDEX_KEY].int64_list.value[0]), f[NAME_KEY].bytes_list.value[0].decode()
      if not 0 <= i < n or names[i] is not None:
        raise ValueError(f"{where}: index {i} repeated or outside the split's {n} examples")
      image = _decode_image(f[IMAGE_KEY].bytes_list.value[0], channels, max_pixels, where)
      mask = read_mask(io.BytesIO(f[MASK_KEY].bytes_list.value[0]), where)
      _check_mask(mask, image, num_classes, f"{where} ({name})")
      images[i], masks[i], names[i] = image, mask, name
  if None in names:
    raise ValueError(
      f"segmentation shards {data_dir}: split {split!r} lacks example {names.index(None)} of "
      f"the {n} its dataset_info.json lists"
    )
  return SegmentationData(images, masks, names)


# ---------------------------------------------------------------------------------------------
# Datasets by config.


def get_dataset_info(config) -> SegmentationInfo:
  """Classes (background included) and examples per split of a segmentation dataset config."""
  if config.source == "seg_builtin":
    names = synthetic_class_names(config.name) if config.name in SYNTHETIC else None
    if names is None:
      raise ValueError(f"seg_builtin dataset {config.name!r}; expected one of {sorted(SYNTHETIC)}")
  elif config.source == "seg_shards":
    names = shards_info(_data_dir(config))["class_names"]
  else:
    names = folder_class_names(config.data_dir or "")
  num_classes = config.num_classes or (len(names) if names else None)
  if num_classes is None:
    raise ValueError(
      f"segmentation folder {config.data_dir}: no classes.txt; set dataset.num_classes"
    )
  counts = {}
  for split in dict.fromkeys([config.train_split, config.eval_split]):
    try:
      counts[split] = len(load_split(config, split).masks)
    except (ValueError, FileNotFoundError):
      counts[split] = None
  return SegmentationInfo(int(num_classes), counts, names)


def _data_dir(config) -> str:
  if not config.data_dir:
    raise ValueError(f"dataset.source={config.source!r} needs dataset.data_dir")
  return config.data_dir


def load_split(config, split: str) -> SegmentationData:
  """The examples of `split` (a slice of one allowed) of a segmentation dataset config."""
  base = splits.base_split(split)
  if config.source == "seg_builtin":
    data = synthetic_split(config.name, base)
  elif config.source == "seg_folder":
    num_classes = config.num_classes or len(folder_class_names(_data_dir(config)) or []) or 256
    data = _folder_data(config.data_dir, base, int(num_classes), int(config.max_image_pixels))
  elif config.source == "seg_shards":
    data = _shards_data(_data_dir(config), base, int(config.max_image_pixels))
  else:
    raise ValueError(f"dataset.source={config.source!r}; expected one of {SOURCES}")
  rows = splits.slice_rows(split, len(data.masks), f"segmentation split {base!r}")
  if rows is None:
    return data
  return SegmentationData(
    [data.images[r] for r in rows], [data.masks[r] for r in rows], [data.names[r] for r in rows]
  )


def check_readable(config, split: str) -> None:
  """Raises (one line) unless `split` is there."""
  load_split(config, split)


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
  image = _resize(np.ascontiguousarray(image), (size, size), nearest=False)
  mask = _resize(np.ascontiguousarray(mask), (size, size), nearest=True)
  if image.ndim == 2:
    image = image[..., None]
  if image.shape[2] == 1:
    image = np.repeat(image, 3, axis=2)
  return (image.astype(np.float32) / 127.5 - 1.0), mask.astype(np.int32)


# ---------------------------------------------------------------------------------------------
# Iterators.


class TrainIterator:
  """Endless training batches {'image' [B, S, S, 3], 'label' int32 [B, S, S], 'mask' [B]}."""

  def __init__(
    self,
    config,
    *,
    global_batch_size: int,
    mesh=None,
    data_axes=("data",),
    seed: int = 0,
    state: dict[str, Any] | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
  ):
    self.process_index, self.process_count = layout.hosts(process_index, process_count)
    layout.local_batch_size(int(global_batch_size), self.process_count)  # divides, or one line
    self.global_batch_size = int(global_batch_size)
    self.seed = int(seed)
    self._rows = layout.host_rows(
      mesh, data_axes, self.global_batch_size, self.process_index, self.process_count
    )
    self._mesh, self._data_axes = mesh, data_axes
    self._data = load_split(config, config.train_split)
    self._ops = parse_ops(config.pp_train)
    self._size = int(config.image_size)
    self._batch = 0
    if state:
      if int(state["seed"]) != self.seed:
        raise ValueError(f"Resuming a data stream of seed {state['seed']} with seed {self.seed}.")
      position = int(state["num_records"]) * int(state["process_count"])
      if position % self.global_batch_size:
        raise ValueError(
          f"Resuming a data stream at example {position}, not a whole number of global batches "
          f"of {self.global_batch_size}: a different global_batch_size is a different run."
        )
      self._batch = position // self.global_batch_size

  @functools.lru_cache(maxsize=2)  # noqa: B019 - two epochs at most are in use at once
  def _permutation(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(len(self._data.masks))

  def example(self, position: int) -> tuple[np.ndarray, np.ndarray]:
    """The augmented example at stream `position` (a function of the seed and the position)."""
    n = len(self._data.masks)
    i = int(self._permutation(position // n)[position % n])
    rng = np.random.default_rng([self.seed, 1, position])
    return augment(self._data.images[i], self._data.masks[i], self._ops, self._size, rng)

  def __iter__(self) -> Iterator[dict[str, Any]]:
    return self

  def __next__(self) -> dict[str, Any]:
    start = self._batch * self.global_batch_size
    pairs = [self.example(start + int(r)) for r in self._rows]
    self._batch += 1
    batch = {
      "image": np.stack([p[0] for p in pairs]),
      "label": np.stack([p[1] for p in pairs]),
      "mask": np.ones(len(pairs), np.float32),
    }
    return layout.to_global(batch, self._mesh, self._data_axes)

  @property
  def num_skipped(self) -> int:
    return 0  # in-memory arrays: nothing fails to decode

  def get_state(self) -> dict[str, int]:
    """The position after the last batch (the input pipeline's state format)."""
    return {
      "num_records": self._batch * len(self._rows),
      "num_skipped": 0,
      "seed": self.seed,
      "process_count": self.process_count,
    }

  def close(self) -> None:
    pass


class EvalIterable:
  """Every example of a split once, in order, at `image_size` (pp_eval); padding has mask 0."""

  def __init__(
    self,
    config,
    split: str | None = None,
    *,
    global_batch_size: int,
    mesh=None,
    data_axes=("data",),
    process_index: int | None = None,
    process_count: int | None = None,
  ):
    self.process_index, self.process_count = layout.hosts(process_index, process_count)
    layout.local_batch_size(int(global_batch_size), self.process_count)  # divides, or one line
    self.split = split or config.eval_split
    self.global_batch_size = int(global_batch_size)
    self._rows = layout.host_rows(
      mesh, data_axes, self.global_batch_size, self.process_index, self.process_count
    )
    self._mesh, self._data_axes = mesh, data_axes
    self._data = load_split(config, self.split)
    self._ops = parse_ops(config.pp_eval)
    self._size = int(config.image_size)
    self.num_examples = len(self._data.masks)
    self.num_batches = max(1, -(-self.num_examples // self.global_batch_size))

  def __len__(self) -> int:
    return self.num_batches

  def __iter__(self) -> Iterator[dict[str, Any]]:
    size = self._size
    for b in range(self.num_batches):
      images, labels, mask = [], [], []
      for r in self._rows:
        i = b * self.global_batch_size + int(r)
        if i < self.num_examples:
          image, label = augment(self._data.images[i], self._data.masks[i], self._ops, size, None)
          images.append(image)
          labels.append(label)
          mask.append(1.0)
        else:
          images.append(np.zeros((size, size, 3), np.float32))
          labels.append(np.full((size, size), IGNORE_LABEL, np.int32))
          mask.append(0.0)
      batch = {
        "image": np.stack(images),
        "label": np.stack(labels),
        "mask": np.asarray(mask, np.float32),
      }
      yield layout.to_global(batch, self._mesh, self._data_axes)
