"""Small synthetic datasets for the input pipeline's tests: TFRecord records labelled by their
id, image folders, and a split's examples read back through the evaluation iterator."""

import os
from collections.abc import Callable, Sequence

import numpy as np

from vit_jax.input_pipeline.testing import encode, example, write_shards

__all__ = [
  "encode",
  "example",
  "id_records",
  "random_image",
  "split_examples",
  "write_image_folder",
  "write_shards",
]


def random_image(
  rng: np.random.Generator, height: int, width: int, channels: int = 3
) -> np.ndarray:
  return rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)


def id_records(
  num_examples: int,
  size: int = 8,
  fmt: str = "png",
  labels_fn: Callable[[int], Sequence[int] | int] | None = None,
  seed: int = 0,
) -> list[bytes]:
  """Records whose label is the example's id (or labels_fn(id)), with random square images."""
  rng = np.random.default_rng(seed)
  labels_fn = labels_fn or (lambda i: i)
  return [
    example(encode(random_image(rng, size, size), fmt), labels_fn(i)) for i in range(num_examples)
  ]


def write_image_folder(
  root: str, split: str, class_names: Sequence[str], per_class: int, size: int = 12, seed: int = 0
) -> int:
  """Writes `root/split/<class>/<i>.{png,jpg}` (alternating formats, some grayscale); returns count."""
  rng = np.random.default_rng(seed)
  n = 0
  for name in class_names:
    os.makedirs(os.path.join(root, split, name), exist_ok=True)
    for i in range(per_class):
      fmt = ("png", "jpeg")[i % 2]
      image = random_image(rng, size, size + i, channels=1 if i % 3 == 0 else 3)
      ext = {"png": "png", "jpeg": "jpg"}[fmt]
      with open(os.path.join(root, split, name, f"{i}.{ext}"), "wb") as f:
        f.write(encode(image, fmt))
      n += 1
  return n


def split_examples(config, split: str) -> tuple[np.ndarray, np.ndarray]:
  """(images, labels) of every example of `split` through the evaluation iterator (one host,
  padding dropped), sorted by their bytes: two sources of the same examples give equal arrays,
  whatever order each reads them in."""
  from vit_jax import input_pipeline

  images, labels = [], []
  for batch in input_pipeline.make_eval_iterator(config, split, global_batch_size=8):
    keep = batch["mask"] > 0
    images += list(batch["image"][keep])
    labels += list(batch["label"][keep])
  order = sorted(range(len(images)), key=lambda i: (images[i].tobytes(), labels[i].tobytes()))
  return np.stack([images[i] for i in order]), np.stack([labels[i] for i in order])
