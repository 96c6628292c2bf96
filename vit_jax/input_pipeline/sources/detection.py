"""Detection data: images with boxes of classes — annotations, their checks, folders and shards.

An example's objects travel as one float64 array [n, 8], a row per annotation (OBJECT_COLUMNS):
the box's corners in pixels of the original image (ymin, xmin, ymax, xmax), the class index
(-1 for a category_id that is not among the categories), crowd (0/1), the annotation's id and
its category_id (for the messages). The COCO folder layout (`det_folder`):
`data_dir/<split>/instances.json` and the image files beside it, `data_dir/<split>/<file_name>`.

The rules on annotations (`annotation_problem`): a box with a corner more than one pixel outside
its image, a box whose width or height is <= 0 once clipped to the image, an unknown class, or
more boxes than dataset.max_boxes make the example a skipped one (bad_data.BAD_ANNOTATION); the
pipeline applies them (examples.Detection), make_shards writes annotations as they are.

Images decode and encode as segmentation's (segmentation.decode_image, encode_png). numpy, no
TensorFlow (but for `serialize_example`, which imports it).
"""

import functools
import json
import os

import numpy as np

TASK = "detection"  # dataset_info.json's `task` for these shards
INSTANCES = "instances.json"
OBJECT_COLUMNS = ("ymin", "xmin", "ymax", "xmax", "class", "crowd", "id", "category_id")
TOLERANCE = 1.0  # pixels a corner may lie outside its image (then clipped)


def objects_array(boxes, classes, crowd, ids, categories) -> np.ndarray:
  """float64 [n, 8] (OBJECT_COLUMNS) from boxes [n, 4] (ymin, xmin, ymax, xmax) in pixels and
  the per-object class indices, crowd flags, annotation ids and category ids [n]."""
  boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
  columns = [np.asarray(c, np.float64).reshape(-1) for c in (classes, crowd, ids, categories)]
  return np.concatenate([boxes, np.stack(columns, axis=1)], axis=1)


# ---------------------------------------------------------------------------------------------
# Checking.


def _box_text(row: np.ndarray) -> str:
  y0, x0, y1, x1 = (float(v) for v in row[:4])
  return f"[x={x0:.6g}, y={y0:.6g}, w={x1 - x0:.6g}, h={y1 - y0:.6g}]"


def annotation_problem(
  objects: np.ndarray, height: int, width: int, num_classes: int, max_boxes: int
) -> tuple[np.ndarray, str]:
  """(the objects with their boxes clipped to the height×width image, '') for good annotations,
  else (the objects, the one line saying what is wrong with the first bad annotation)."""
  if len(objects) > max_boxes:
    return objects, f"{len(objects)} boxes, more than dataset.max_boxes={max_boxes}"
  size = f"the {width}x{height} image"
  for row in objects:
    name = f"annotation {int(row[6])}"
    if not 0 <= row[4] < num_classes:
      return objects, f"{name}: category_id {int(row[7])} is not among the {num_classes} categories"
    y0, x0, y1, x1 = row[:4]
    if min(y0, x0) < -TOLERANCE or y1 > height + TOLERANCE or x1 > width + TOLERANCE:
      return objects, f"{name}: box {_box_text(row)} outside {size}"
    if not np.all(np.isfinite(row[:4])):
      return objects, f"{name}: box {_box_text(row)} is not finite"
  clipped = objects.copy()
  clipped[:, [0, 2]] = np.clip(clipped[:, [0, 2]], 0, height)
  clipped[:, [1, 3]] = np.clip(clipped[:, [1, 3]], 0, width)
  for row, original in zip(clipped, objects, strict=True):
    if row[2] <= row[0] or row[3] <= row[1]:
      return objects, (
        f"annotation {int(row[6])}: degenerate box {_box_text(original)} (width or height <= 0 "
        f"within {size})"
      )
  return clipped, ""


# ---------------------------------------------------------------------------------------------
# A COCO folder.


def instances_path(data_dir: str, split: str) -> str:
  return os.path.join(data_dir, split, INSTANCES)


def _categories(coco: dict, path: str) -> list[tuple[int, str]]:
  cats = coco.get("categories")
  if not cats:
    raise ValueError(f"{path}: no categories")
  return sorted((int(c["id"]), str(c["name"])) for c in cats)


@functools.cache
def read_instances(path: str) -> dict:
  """A COCO instances file, parsed once per process; one line if it is missing or not JSON."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"detection folder: no {path} (COCO instances of the split)")
  with open(path) as f:
    try:
      coco = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not JSON ({e})") from e
  for key in ("images", "categories"):
    if not isinstance(coco.get(key), list):
      raise ValueError(f"{path}: no {key!r} list (a COCO instances file has images, "
                       "annotations, categories)")  # fmt: skip
  return coco


def folder_splits(data_dir: str) -> list[str]:
  """The splits of a folder: the directories holding an instances.json."""
  if not os.path.isdir(data_dir):
    return []
  names = sorted(os.listdir(data_dir))
  return [n for n in names if os.path.exists(instances_path(data_dir, n))]


def folder_categories(data_dir: str, split: str) -> list[tuple[int, str]]:
  """(category_id, name) of a folder, sorted by id, the classes 0..K-1 in this order; one line
  if another split of the folder lists other categories."""
  path = instances_path(data_dir, split)
  cats = _categories(read_instances(path), path)
  for other in folder_splits(data_dir):
    other_path = instances_path(data_dir, other)
    if other != split and _categories(read_instances(other_path), other_path) != cats:
      raise ValueError(
        f"{other_path}: its categories differ from {path}'s; every split needs the same"
      )
  return cats


def folder_class_names(data_dir: str, split: str) -> list[str]:
  return [name for _, name in folder_categories(data_dir, split)]


def folder_examples(data_dir: str, split: str) -> tuple[list[str], list[str], list[np.ndarray]]:
  """(image paths, wheres, objects float64 [n, 8] per image) of a folder's split, its images
  sorted by id (the split's order), annotations in file order; listed, not read."""
  path = instances_path(data_dir, split)
  coco = read_instances(path)
  index = {cid: k for k, (cid, _) in enumerate(folder_categories(data_dir, split))}
  images = sorted(coco["images"], key=lambda im: int(im["id"]))
  rows = {int(im["id"]): [] for im in images}
  for ann in coco.get("annotations") or []:
    image_id = int(ann["image_id"])
    if image_id not in rows:
      raise ValueError(f"{path}: annotation {ann.get('id')} of image_id {image_id}, no such image")
    x, y, w, h = (float(v) for v in ann["bbox"])
    cid = int(ann["category_id"])
    crowd = float(bool(ann.get("iscrowd", 0)))
    rows[image_id].append((y, x, y + h, x + w, index.get(cid, -1), crowd, int(ann["id"]), cid))
  paths, wheres, objects = [], [], []
  for im in images:
    paths.append(os.path.join(data_dir, split, im["file_name"]))
    wheres.append(f"{path} image {im['file_name']!r} (id {im['id']})")
    # Boxes as float32 values, as the shards hold them: a folder and its shards agree exactly.
    rows_ = np.asarray(rows[int(im["id"])], np.float64).reshape(-1, 8)
    rows_[:, :4] = rows_[:, :4].astype(np.float32)
    objects.append(rows_)
  if not paths:
    raise FileNotFoundError(f"detection folder: {path} lists no images")
  return paths, wheres, objects


def ragged(objects: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Per-example objects → (all rows float64 [total, 8], offsets int64 [N + 1])."""
  counts = [len(o) for o in objects]
  offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
  flat = np.concatenate(objects) if objects else np.zeros((0, 8))
  return flat.reshape(-1, 8).astype(np.float64), offsets


# ---------------------------------------------------------------------------------------------
# Shards: vit_jax.tools.make_shards --task=detection writes them, shards.DetectionShardsSource
# reads. The TF object-detection API's names; boxes in pixels, the class its index (-1 for an
# unknown category), plus the annotation ids and category ids for the messages.

IMAGE_KEY = "image/encoded"
BOX_KEYS = tuple(f"image/object/bbox/{c}" for c in ("ymin", "xmin", "ymax", "xmax"))
CLASS_KEY, CROWD_KEY = "image/object/class/label", "image/object/is_crowd"
ID_KEY, CATEGORY_KEY = "image/object/id", "image/object/category_id"
HEIGHT_KEY, WIDTH_KEY = "image/height", "image/width"
NAME_KEY, INDEX_KEY = "image/filename", "image/index"


def serialize_example(
  image_bytes: bytes, height: int, width: int, objects: np.ndarray, name: str, index: int
) -> bytes:
  """A serialized tf.train.Example: an encoded image of height×width and its objects [n, 8]."""
  import tensorflow as tf  # Only the shards need it.

  def ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

  def floats(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))

  def one(value: bytes):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

  objects = np.asarray(objects, np.float64).reshape(-1, 8)
  features = {key: floats(objects[:, c]) for c, key in enumerate(BOX_KEYS)}
  features.update(
    {
      CLASS_KEY: ints(objects[:, 4]),
      CROWD_KEY: ints(objects[:, 5]),
      ID_KEY: ints(objects[:, 6]),
      CATEGORY_KEY: ints(objects[:, 7]),
      IMAGE_KEY: one(image_bytes),
      HEIGHT_KEY: ints([height]),
      WIDTH_KEY: ints([width]),
      NAME_KEY: one(name.encode()),
      INDEX_KEY: ints([index]),
    }
  )
  return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
