r"""Writes a bundled offline dataset or an image folder as TFRecord shards, plus dataset_info.json.

The shards use the ImageNet/JFT layout (`image/encoded` bytes, `image/class/label` int64), so the
result streams through the same `source='tfrecord'` path as ImageNet-21k or JFT (docs/data.md):

  python -m vit_jax.tools.make_shards --dataset=fashion_mnist --split=train,test \
      --out_dir=/tmp/shards --num_shards=8
  python -m vit_jax.tools.make_shards --folder=/data/flowers --split=train,val \
      --name=flowers --out_dir=gs://bucket/flowers --num_shards=64

writes `{out_dir}/{name}-{split}.tfrecord-{i:05d}-of-{n:05d}` and merges `{out_dir}/dataset_info.json`
({name, num_classes, class_names, multi_label, splits: {split: {num_examples, file_pattern,
shards: {file: num_examples}}}}). Examples are shuffled (seeded) before sharding, so that each
shard holds every class. Folder images are stored as their original bytes; bundled arrays are
encoded as PNG.

With `--task=segmentation` (implied by a synthetic task's name) the input is a segmentation folder
or a `seg_builtin` task; each record holds an image, its mask (a grey PNG of class indices, 255
ignored), their size, the name and the position in the split
(vit_jax.input_pipeline.sources.segmentation.serialize_example), and dataset_info.json adds
{task: 'segmentation', ignore_label, image_channels} for `source='seg_shards'`
(docs/segmentation.md).

With `--task=detection` (implied by a synthetic detection task's name, `*_det`) the input is a
COCO folder (ROOT/<split>/instances.json, the images beside it) or a `det_builtin` task; each
record holds an image, its objects' boxes in pixels, class indices (-1 for a category that is
not among the categories), crowd flags, annotation and category ids, its size, the name and the
position in the split (vit_jax.input_pipeline.sources.detection.serialize_example): the
annotations as they are, the pipeline applies the rules on boxes. dataset_info.json adds
{task: 'detection', image_channels} for `source='det_shards'` (docs/data.md, "Detection data").

  python -m vit_jax.tools.make_shards --task=detection --folder=/data/coco --split=train,val \
      --out_dir=gs://bucket/coco --num_shards=64
  python -m vit_jax.tools.make_shards --dataset=fashion_mnist_det --split=train,val \
      --out_dir=/tmp/det_shards
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import dataclasses
import json
import os
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from absl import app, logging

from vit_jax.input_pipeline import bad_data
from vit_jax.input_pipeline.sources import (
  builtin,
  detection,
  detection_synthetic,
  indexed,
  segmentation,
  segmentation_synthetic,
  shards,
)
from vit_jax.runtime import cli, gcs
from vit_jax.tools import make_folder

TASKS = ("classification", "segmentation", "detection")


def _classification_record(example: tuple[bytes, int]) -> bytes:
  return shards.serialize_example(example[0], int(example[1]))


def write_shards(
  examples: Sequence[Any] | Iterator[Any],
  num_examples: int,
  out_dir: str,
  name: str,
  split: str,
  num_shards: int,
  class_names: Sequence[str],
  serialize: Callable[[Any], bytes] = _classification_record,
  info: dict[str, Any] | None = None,
) -> list[str]:
  """Writes examples, in the given order, to contiguous shards; updates the info.

  Args:
    examples: `num_examples` examples, by default (encoded image, label) pairs.
    num_examples: how many `examples` yields.
    out_dir: output directory.
    name: file prefix.
    split: split name.
    num_shards: number of shards (never more than examples, so none is empty).
    class_names: names in label order.
    serialize: an example → a serialized tf.train.Example (default: the ImageNet layout).
    info: more fields of dataset_info.json (a segmentation task's); they must agree with the
      fields other splits wrote there.

  Returns:
    The shard paths.
  """
  num_shards = max(1, min(num_shards, num_examples))
  tf.io.gfile.makedirs(out_dir)
  existing = split_files(out_dir, name, split)
  if existing:
    # A second set beside the first would be read with it (the split's pattern matches both).
    raise FileExistsError(
      f"{out_dir} already holds {len(existing)} shard files of split {split!r} "
      f"({os.path.basename(existing[0])}, ...); pass --overwrite to replace them, or choose "
      "another --out_dir; nothing was written"
    )
  bounds = np.linspace(0, num_examples, num_shards + 1).astype(int)
  paths, lengths = [], {}
  examples = iter(examples)
  for i in range(num_shards):
    path = shards.shard_path(out_dir, f"{name}-{split}", i, num_shards)
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(bounds[i + 1] - bounds[i]):
        writer.write(serialize(next(examples)))
    paths.append(path)
    lengths[os.path.basename(path)] = int(bounds[i + 1] - bounds[i])
  _update_info(out_dir, name, split, class_names, lengths, info or {})
  return paths


def split_files(out_dir: str, name: str, split: str) -> list[str]:
  """The shard files of `split` in `out_dir` (what the split's file pattern reads)."""
  return sorted(tf.io.gfile.glob(os.path.join(out_dir, f"{name}-{split}.tfrecord-*")))


def remove_split(out_dir: str, name: str, split: str) -> int:
  """Deletes `split`'s shard files and its entry in dataset_info.json; returns the files removed.

  The entry goes first: a reader meanwhile finds files that dataset_info.json does not list and
  stops, rather than reading half a set."""
  info = shards.read_info_json(out_dir)
  if info and split in info.get("splits", {}):
    del info["splits"][split]
    _write_info(out_dir, info)
  files = split_files(out_dir, name, split)
  for path in files:
    tf.io.gfile.remove(path)
  return len(files)


def _update_info(out_dir, name, split, class_names, lengths, extra):
  info = shards.read_info_json(out_dir) or {}
  if info.get("class_names") not in (None, list(class_names)):
    raise ValueError(f"{out_dir}/{shards.INFO_FILENAME} lists other class names.")
  if info.get("splits") and info.get("task") != extra.get("task"):
    raise ValueError(
      f"{out_dir}/{shards.INFO_FILENAME} describes shards of a "
      f"{info.get('task', 'classification')} task."
    )
  info.update(
    name=name, num_classes=len(class_names), class_names=list(class_names), multi_label=False
  )
  info.update(extra)
  info.setdefault("splits", {})[split] = {
    "num_examples": sum(lengths.values()),
    "file_pattern": f"{name}-{split}.tfrecord-*",
    "shards": lengths,
  }
  _write_info(out_dir, info)


def _write_info(out_dir: str, info: dict[str, Any]) -> None:
  # Atomically: a reader (or a second writer of another split) never sees half a file.
  path = os.path.join(out_dir, shards.INFO_FILENAME)
  tmp = f"{path}.tmp-{os.getpid()}"
  with tf.io.gfile.GFile(tmp, "w") as f:
    json.dump(info, f, indent=1)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def shard_builtin(dataset: str, split: str, out_dir: str, num_shards: int, name=None, seed=0):
  """Writes a bundled dataset's split as PNG-encoded shards; returns the shard paths."""
  images, labels = builtin.get_split(dataset, split)
  order = np.random.default_rng(seed).permutation(len(labels))
  examples = ((tf.io.encode_png(images[i]).numpy(), labels[i]) for i in order)
  class_names = builtin.load(dataset).class_names
  return write_shards(
    examples, len(order), out_dir, name or dataset, split, num_shards, class_names
  )


def shard_folder(root: str, split: str, out_dir: str, num_shards: int, name=None, seed=0):
  """Writes `root/<split>/<class>/*` (original bytes) as shards; returns the shard paths."""
  source = indexed.FolderSource(types.SimpleNamespace(data_dir=root), split, 0, 1)
  paths = source.paths.numpy()
  labels = source.labels.numpy()
  order = np.random.default_rng(seed).permutation(len(paths))

  def read(i):
    with tf.io.gfile.GFile(paths[i].decode(), "rb") as f:
      return f.read(), labels[i]

  name = name or os.path.basename(os.path.normpath(root))
  examples = (read(i) for i in order)
  return write_shards(examples, len(order), out_dir, name, split, num_shards, source.class_names)


def _write_segmentation(
  examples, num_examples, out_dir, name, split, num_shards, class_names, channels
):
  """Writes (image bytes, mask, name, index) examples, `channels` the decoded images' channels."""

  def serialize(example):
    image_bytes, mask, example_name, index = example
    return segmentation.serialize_example(image_bytes, *mask.shape, mask, example_name, index)

  info = dict(
    task=segmentation.TASK, ignore_label=segmentation.IGNORE_LABEL, image_channels=channels
  )
  return write_shards(
    examples, num_examples, out_dir, name, split, num_shards, class_names, serialize, info
  )


def shard_seg_builtin(dataset: str, split: str, out_dir: str, num_shards: int, name=None, seed=0):
  """Writes a synthetic segmentation task's split (PNG-encoded canvases) as shards."""
  data = segmentation_synthetic.synthetic_split(dataset, split)
  order = np.random.default_rng(seed).permutation(len(data.masks))
  examples = (
    (segmentation.encode_png(data.images[i]), data.masks[i], data.names[i], int(i)) for i in order
  )
  channels = data.images[0].shape[2]
  class_names = segmentation_synthetic.synthetic_class_names(dataset)
  return _write_segmentation(
    examples, len(order), out_dir, name or dataset, split, num_shards, class_names, channels
  )


def shard_seg_folder(root: str, split: str, out_dir: str, num_shards: int, name=None, seed=0):
  """Writes a segmentation folder's split (images as their original bytes) as shards."""
  class_names = segmentation.folder_class_names(root)
  if not class_names:
    raise ValueError(
      f"segmentation folder {root}: no classes.txt (class names, one per line, background first)"
    )
  names = segmentation.folder_listing(root, split)
  order = np.random.default_rng(seed).permutation(len(names))

  def example(i):
    encoded, _, mask = segmentation.read_folder_example(root, split, names[i], len(class_names))
    return encoded, mask, names[i], int(i)

  name = name or os.path.basename(os.path.normpath(root))
  examples = (example(i) for i in order)
  # The seg_folder source decodes every image as RGB; the shards source does the same.
  return _write_segmentation(
    examples, len(order), out_dir, name, split, num_shards, class_names, channels=3
  )


def _write_detection(
  examples, num_examples, out_dir, name, split, num_shards, class_names, channels
):
  """Writes (image bytes, height, width, objects, name, index) examples, `channels` the decoded
  images' channels."""

  def serialize(example):
    return detection.serialize_example(*example)

  info = dict(task=detection.TASK, image_channels=channels)
  return write_shards(
    examples, num_examples, out_dir, name, split, num_shards, class_names, serialize, info
  )


def shard_det_builtin(dataset: str, split: str, out_dir: str, num_shards: int, name=None, seed=0):
  """Writes a synthetic detection task's split (PNG-encoded canvases) as shards."""
  data = detection_synthetic.synthetic_split(dataset, split)
  order = np.random.default_rng(seed).permutation(len(data.images))
  size = data.images.shape[1:3]
  examples = (
    (segmentation.encode_png(data.images[i]), *size, data.objects[i], data.names[i], int(i))
    for i in order
  )
  channels = data.images.shape[3]
  class_names = detection_synthetic.synthetic_class_names(dataset)
  return _write_detection(
    examples, len(order), out_dir, name or dataset, split, num_shards, class_names, channels
  )


def shard_det_folder(root: str, split: str, out_dir: str, num_shards: int, name=None, seed=0):
  """Writes a COCO folder's split (images as their original bytes, annotations as they are) as
  shards; each image's height and width are its instances.json's."""
  class_names = detection.folder_class_names(root, split)
  paths, _, objects = detection.folder_examples(root, split)
  images = sorted(
    detection.read_instances(detection.instances_path(root, split))["images"],
    key=lambda im: int(im["id"]),
  )
  order = np.random.default_rng(seed).permutation(len(paths))

  def example(i):
    im = images[i]
    encoded = bad_data.read_file(paths[i], tf.io.gfile.GFile)
    return encoded, int(im["height"]), int(im["width"]), objects[i], str(im["file_name"]), int(i)

  name = name or os.path.basename(os.path.normpath(root))
  examples = (example(i) for i in order)
  # The det_folder source decodes every image as RGB; the shards source does the same.
  return _write_detection(
    examples, len(order), out_dir, name, split, num_shards, class_names, channels=3
  )


define_flags = cli.define_flags(
  dataset=dataclasses.replace(make_folder.DATASET, required=False),
  folder=cli.Flag(
    str,
    "Image folder root: ROOT/<split>/<class>/*.{jpg,jpeg,png}; with --task=segmentation "
    "ROOT/<split>/images/*, ROOT/<split>/masks/*.png and ROOT/classes.txt; with "
    "--task=detection ROOT/<split>/instances.json (COCO) and the images beside it.",
  ),
  task=cli.Flag(
    None,
    "What the labels are; default: segmentation (detection) for a synthetic segmentation "
    "(detection) task, else classification.",
    choices=TASKS,
  ),
  split=cli.Flag(["train", "test"], "Split(s) to write, comma separated."),
  out_dir=cli.Flag(str, "Output directory (local or gs://)."),
  name=cli.Flag(str, "Shard name prefix; default: the dataset or folder name."),
  num_shards=cli.Flag(8, "Shards per split (fewer if the split has fewer examples)."),
  shuffle_seed=cli.Flag(0, "Seed of the example order written to the shards."),
  overwrite=cli.Flag(
    False,
    "Replace a split's existing shards in --out_dir (without it, existing shards of a split "
    "stop the command before anything is written).",
  ),
)


def main(argv, f):
  cli.no_arguments(argv)
  if bool(f.dataset.value) == bool(f.folder.value):
    raise app.UsageError("Pass exactly one of --dataset and --folder.")
  if not f.out_dir.value:
    raise app.UsageError("--out_dir is required.")
  implied = {
    **dict.fromkeys(segmentation_synthetic.SYNTHETIC, "segmentation"),
    **dict.fromkeys(detection_synthetic.SYNTHETIC, "detection"),
  }.get(f.dataset.value)
  task = f.task.value or implied or "classification"
  if implied and task != implied:
    raise app.UsageError(f"--dataset={f.dataset.value} is a {implied} task.")
  if f.dataset.value and not implied and task != "classification":
    raise app.UsageError(f"--task={task} takes a synthetic {task} task or a --folder.")
  gcs.check_bucket(f.out_dir.value)  # before TensorFlow's makedirs: a missing bucket hangs it
  for split in f.split.value:
    name = f.name.value or f.dataset.value or os.path.basename(os.path.normpath(f.folder.value))
    if f.overwrite.value:
      removed = remove_split(f.out_dir.value, name, split)
      if removed:
        print(f"{split}: removed its {removed} earlier shard files")
    args = (split, f.out_dir.value, f.num_shards.value, f.name.value, f.shuffle_seed.value)
    if f.dataset.value:
      write = {"segmentation": shard_seg_builtin, "detection": shard_det_builtin}
      paths = write.get(task, shard_builtin)(f.dataset.value, *args)
    else:
      write = {"segmentation": shard_seg_folder, "detection": shard_det_folder}
      paths = write.get(task, shard_folder)(f.folder.value, *args)
    logging.info("Wrote %d shards of split %s to %s", len(paths), split, f.out_dir.value)
    print(f"{split}: {len(paths)} shards, e.g. {paths[0]}")


if __name__ == "__main__":
  cli.run(main, "make_shards", define_flags, errors=(ImportError, OSError, ValueError))
