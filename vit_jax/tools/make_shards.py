r"""Writes a bundled offline dataset or an image folder as TFRecord shards, plus dataset_info.json.

The shards use the ImageNet/JFT layout (`image/encoded` bytes, `image/class/label` int64), so the
result streams through the same `source='tfrecord'` path as ImageNet-21k or JFT:

  python -m vit_jax.tools.make_shards --dataset=fashion_mnist --split=train,test \
      --out_dir=/tmp/shards --num_shards=8
  python -m vit_jax.tools.make_shards --folder=/data/flowers --split=train,val \
      --name=flowers --out_dir=gs://bucket/flowers --num_shards=64

writes `{out_dir}/{name}-{split}.tfrecord-{i:05d}-of-{n:05d}` and merges `{out_dir}/dataset_info.json`
({name, num_classes, class_names, multi_label, splits: {split: {num_examples, file_pattern,
shards: {file: num_examples}}}}), which `get_dataset_info` and the per-host split read. Examples are
shuffled (seeded) before sharding, so that each shard holds every class. Folder images are stored
as their original bytes; bundled arrays are encoded as PNG.
"""

import json
import os
import types
from collections.abc import Iterator, Sequence

import numpy as np
import tensorflow as tf
from absl import app, flags, logging

from vit_jax.input_pipeline import builtin, sources
from vit_jax.runtime import cli, gcs


def define_flags() -> types.SimpleNamespace:
  """The command's flags (see vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    dataset=flags.DEFINE_string(
      "dataset", None, f"Bundled dataset: one of {sorted(builtin.LOADERS)}."
    ),
    folder=flags.DEFINE_string(
      "folder", None, "Image folder root: ROOT/<split>/<class>/*.{jpg,jpeg,png}."
    ),
    split=flags.DEFINE_list("split", ["train", "test"], "Split(s) to write, comma separated."),
    out_dir=flags.DEFINE_string("out_dir", None, "Output directory (local or gs://)."),
    name=flags.DEFINE_string(
      "name", None, "Shard name prefix; default: the dataset or folder name."
    ),
    num_shards=flags.DEFINE_integer(
      "num_shards", 8, "Shards per split (fewer if the split has fewer examples)."
    ),
    shuffle_seed=flags.DEFINE_integer(
      "shuffle_seed", 0, "Seed of the example order written to the shards."
    ),
  )


def write_shards(
  examples: Sequence[tuple[bytes, int]] | Iterator[tuple[bytes, int]],
  num_examples: int,
  out_dir: str,
  name: str,
  split: str,
  num_shards: int,
  class_names: Sequence[str],
) -> list[str]:
  """Writes (image bytes, label) pairs, in the given order, to contiguous shards; updates the info.

  Args:
    examples: encoded images with their labels, `num_examples` of them.
    num_examples: how many `examples` yields.
    out_dir: output directory.
    name: file prefix.
    split: split name.
    num_shards: number of shards (never more than examples, so none is empty).
    class_names: names in label order.

  Returns:
    The shard paths.
  """
  num_shards = max(1, min(num_shards, num_examples))
  tf.io.gfile.makedirs(out_dir)
  bounds = np.linspace(0, num_examples, num_shards + 1).astype(int)
  paths, lengths = [], {}
  examples = iter(examples)
  for i in range(num_shards):
    path = sources.shard_path(out_dir, f"{name}-{split}", i, num_shards)
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(bounds[i + 1] - bounds[i]):
        image, label = next(examples)
        writer.write(sources.serialize_example(image, int(label)))
    paths.append(path)
    lengths[os.path.basename(path)] = int(bounds[i + 1] - bounds[i])
  _update_info(out_dir, name, split, class_names, lengths)
  return paths


def _update_info(out_dir, name, split, class_names, lengths):
  info = sources.read_info_json(out_dir) or {}
  if info.get("class_names") not in (None, list(class_names)):
    raise ValueError(f"{out_dir}/{sources.INFO_FILENAME} lists other class names.")
  info.update(
    name=name, num_classes=len(class_names), class_names=list(class_names), multi_label=False
  )
  info.setdefault("splits", {})[split] = {
    "num_examples": sum(lengths.values()),
    "file_pattern": f"{name}-{split}.tfrecord-*",
    "shards": lengths,
  }
  # Atomically: a reader (or a second writer of another split) never sees half a file.
  path = os.path.join(out_dir, sources.INFO_FILENAME)
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
  config = {"data_dir": root}
  source = sources.FolderSource(_Attrs(config), split, 0, 1)
  paths = source.paths.numpy()
  labels = source.labels.numpy()
  order = np.random.default_rng(seed).permutation(len(paths))

  def read(i):
    with tf.io.gfile.GFile(paths[i].decode(), "rb") as f:
      return f.read(), labels[i]

  name = name or os.path.basename(os.path.normpath(root))
  examples = (read(i) for i in order)
  return write_shards(examples, len(order), out_dir, name, split, num_shards, source.class_names)


class _Attrs:
  def __init__(self, d):
    self.__dict__.update(d)


def main(argv, f: types.SimpleNamespace):
  del argv
  if bool(f.dataset.value) == bool(f.folder.value):
    raise app.UsageError("Pass exactly one of --dataset and --folder.")
  if not f.out_dir.value:
    raise app.UsageError("--out_dir is required.")
  gcs.check_bucket(f.out_dir.value)  # before TensorFlow's makedirs: a missing bucket hangs it
  for split in f.split.value:
    args = (split, f.out_dir.value, f.num_shards.value, f.name.value, f.shuffle_seed.value)
    if f.dataset.value:
      paths = shard_builtin(f.dataset.value, *args)
    else:
      paths = shard_folder(f.folder.value, *args)
    logging.info("Wrote %d shards of split %s to %s", len(paths), split, f.out_dir.value)
    print(f"{split}: {len(paths)} shards, e.g. {paths[0]}")


if __name__ == "__main__":
  cli.run(main, "make_shards", define_flags, errors=(ImportError, OSError, ValueError))
