"""Writers of small synthetic TFRecord shards, for tests and benchmarks (the tests' other fixtures:
tests/helpers/synthetic_data.py)."""

import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from vit_jax.input_pipeline.sources import shards

# A serialized tf.train.Example of one image and its label(s), as the shards hold them.
example = shards.serialize_example


def encode(image: np.ndarray, fmt: str = "png") -> bytes:
  """uint8 [h, w, c] → PNG or JPEG bytes."""
  if fmt == "png":
    return tf.io.encode_png(image).numpy()
  return tf.io.encode_jpeg(image, quality=90).numpy()


def write_shards(
  directory: str, prefix: str, records: Sequence[bytes], num_shards: int
) -> list[str]:
  """Writes serialized records round-robin into `{prefix}.tfrecord-{i:05d}-of-{n:05d}` files."""
  os.makedirs(directory, exist_ok=True)
  paths = [shards.shard_path(directory, prefix, i, num_shards) for i in range(num_shards)]
  writers = [tf.io.TFRecordWriter(p) for p in paths]
  for i, record in enumerate(records):
    writers[i % num_shards].write(record)
  for w in writers:
    w.close()
  return paths
