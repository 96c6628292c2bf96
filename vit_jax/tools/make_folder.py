r"""Writes a bundled offline dataset as an image folder: PNG files that any command reads.

  python -m vit_jax.tools.make_folder --dataset=animal_mnist --out=/tmp/animal_mnist
  python -m vit_jax.tools.make_folder --dataset=animal_mnist_seg --split=test --max_examples=4 \
      --out=/tmp/canvases
  python -m vit_jax.tools.make_folder --dataset=fashion_mnist_det --split=test --max_examples=4 \
      --out=/tmp/boxes

A classification dataset (one of vit_jax.input_pipeline.sources.builtin's) becomes
`<out>/<split>/<class>/<index>.png`, the layout of the `folder` source and of
`make_shards --folder`; a synthetic segmentation task (`*_seg`) becomes
`<out>/<split>/images/<index>.png` with its class-index mask in `<out>/<split>/masks/<index>.png`
and `<out>/classes.txt`, the layout of the `seg_folder` source; a synthetic detection task
(`*_det`) becomes `<out>/<split>/<index>.png` with the split's COCO annotations in
`<out>/<split>/instances.json` (image ids the indices, category ids 1..K, area = box w·h,
iscrowd 0), the layout of the `det_folder` source. So the bundled data can stand in
for your own folder in every command that reads one (predict, the folder source, make_shards).

Nothing is overwritten: an existing `<out>/<split>` is an error.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import os
from collections.abc import Sequence

import numpy as np

from vit_jax.input_pipeline.sources import builtin, detection_synthetic, segmentation_synthetic
from vit_jax.runtime import cli

# The bundled datasets (make_shards reads them too).
DATASET = cli.Flag(
  str,
  f"Bundled dataset: one of {sorted(builtin.LOADERS)}, or a synthetic segmentation task: "
  f"{sorted(segmentation_synthetic.SYNTHETIC)}, or a synthetic detection task: "
  f"{sorted(detection_synthetic.SYNTHETIC)}.",
  required=True,
)


def write_classification(
  name: str, root: str, splits: Sequence[str] = ("train", "test"), max_examples: int = 0
) -> str:
  """Writes builtin dataset `name`'s `splits` as `root/<split>/<class>/<index>.png`."""
  from PIL import Image

  classes = builtin.load(name).class_names
  for split in splits:
    _refuse_existing(root, split)
  for split in splits:
    images, labels = builtin.get_split(name, split)
    for i in _indices(len(labels), max_examples):
      class_dir = os.path.join(root, split, classes[labels[i]])
      os.makedirs(class_dir, exist_ok=True)
      Image.fromarray(_grey_or_rgb(images[i])).save(os.path.join(class_dir, f"{i:05d}.png"))
  return root


def write_segmentation(
  name: str, root: str, splits: Sequence[str] = ("train", "val", "test"), max_examples: int = 0
) -> str:
  """Writes synthetic task `name`'s `splits` as `root/<split>/{images,masks}/<index>.png` and
  `root/classes.txt` (background first)."""
  from PIL import Image

  for split in splits:
    _refuse_existing(root, split)
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "classes.txt"), "w") as f:
    f.write("\n".join(segmentation_synthetic.synthetic_class_names(name)) + "\n")
  for split in splits:
    data = segmentation_synthetic.synthetic_split(name, split)
    for kind in ("images", "masks"):
      os.makedirs(os.path.join(root, split, kind), exist_ok=True)
    for i in _indices(len(data.masks), max_examples):
      file = f"{i:05d}.png"
      Image.fromarray(_grey_or_rgb(data.images[i])).save(os.path.join(root, split, "images", file))
      Image.fromarray(data.masks[i]).save(os.path.join(root, split, "masks", file))
  return root


def write_detection(
  name: str, root: str, splits: Sequence[str] = ("train", "val", "test"), max_examples: int = 0
) -> str:
  """Writes synthetic task `name`'s `splits` as `root/<split>/<index>.png` and
  `root/<split>/instances.json` (COCO: image ids the indices, category ids class + 1)."""
  import json

  from PIL import Image

  for split in splits:
    _refuse_existing(root, split)
  names = detection_synthetic.synthetic_class_names(name)
  categories = [{"id": k + 1, "name": n} for k, n in enumerate(names)]
  for split in splits:
    data = detection_synthetic.synthetic_split(name, split)
    os.makedirs(os.path.join(root, split))
    images, annotations = [], []
    for i in _indices(len(data.images), max_examples):
      file = f"{i:05d}.png"
      Image.fromarray(_grey_or_rgb(data.images[i])).save(os.path.join(root, split, file))
      h, w = data.images[i].shape[:2]
      images.append({"id": int(i), "file_name": file, "height": int(h), "width": int(w)})
      for y0, x0, y1, x1, _, _, ann_id, category in data.objects[i]:
        box = [float(x0), float(y0), float(x1 - x0), float(y1 - y0)]
        annotations.append({
          "id": int(ann_id), "image_id": int(i), "category_id": int(category), "bbox": box,
          "area": box[2] * box[3], "iscrowd": 0,
        })  # fmt: skip
    coco = {"images": images, "annotations": annotations, "categories": categories}
    with open(os.path.join(root, split, "instances.json"), "w") as f:
      json.dump(coco, f)
  return root


def _indices(count: int, max_examples: int) -> np.ndarray:
  """Every index, or `max_examples` of them spread evenly over the split (bundled splits are
  often sorted by class)."""
  if max_examples <= 0 or max_examples >= count:
    return np.arange(count)
  return np.unique(np.linspace(0, count - 1, max_examples).round().astype(int))


def _grey_or_rgb(image: np.ndarray) -> np.ndarray:
  """uint8 [h, w, 1] → [h, w] (PIL writes a grey PNG); [h, w, 3] as it is."""
  return image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image


def _refuse_existing(root: str, split: str) -> None:
  if os.path.exists(os.path.join(root, split)):
    raise FileExistsError(f"{os.path.join(root, split)} exists; nothing was written")


define_flags = cli.define_flags(
  dataset=DATASET,
  out=cli.Flag(str, "Folder to write.", required=True),
  split=cli.Flag(list, "Splits to write (default: train and test; the synthetic tasks' val too)."),
  max_examples=cli.Flag(0, "Write this many images per split, spread evenly over it (0: all)."),
)


def main(argv: Sequence[str], f) -> None:
  cli.no_arguments(argv)
  name = f.dataset.value
  if name in segmentation_synthetic.SYNTHETIC:
    splits = f.split.value or list(segmentation_synthetic.SPLIT_SIZES)
    write_segmentation(name, f.out.value, splits, f.max_examples.value)
  elif name in detection_synthetic.SYNTHETIC:
    splits = f.split.value or list(detection_synthetic.SPLIT_SIZES)
    write_detection(name, f.out.value, splits, f.max_examples.value)
  elif name in builtin.LOADERS:
    splits = f.split.value or ["train", "test"]
    write_classification(name, f.out.value, splits, f.max_examples.value)
  else:
    known = sorted(
      [*builtin.LOADERS, *segmentation_synthetic.SYNTHETIC, *detection_synthetic.SYNTHETIC]
    )
    raise ValueError(f"--dataset={name}: expected one of {known}")
  print(f"wrote {name} ({', '.join(splits)}) to {f.out.value}")


if __name__ == "__main__":
  cli.run(main, "make_folder", define_flags, errors=(ValueError, FileExistsError))
