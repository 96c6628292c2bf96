"""Each data source end to end: TFRecord (single/multi-label), tfds (mock), image folder, builtin."""

import os
import subprocess
import sys

import numpy as np
import pytest

# Imported here, at collection, while the process has one thread: `tfds.testing.mock_data`
# imports this module lazily on first use, and pytest's assertion rewriting then runs
# `ast.parse`, which on CPython 3.11.7 fails ("AST constructor recursion depth mismatch") when
# another thread builds an AST at the same moment (the input pipelines of earlier tests have
# threads alive).
from tensorflow_datasets.testing import mocking as tfds_mocking

from tests.helpers import REPO, synthetic_data
from vit_jax import input_pipeline
from vit_jax.input_pipeline.sources import builtin
from vit_jax.tools import make_shards

PP_EVAL = "decode|resize_small|central_crop|value_range(-1, 1)"


def _eval_examples(config, batch=8, split=None):
  """(labels of real examples, number of batches) of one eval pass; checks images on the way."""
  labels, n = [], 0
  for b in input_pipeline.make_eval_iterator(config, split, global_batch_size=batch):
    size = config.image_size
    assert b["image"].shape == (batch, size, size, 3) and b["image"].dtype == np.float32
    assert b["image"].min() >= -1.0 and b["image"].max() <= 1.0
    labels.extend(list(b["label"][b["mask"] > 0]))
    n += 1
  return labels, n


def test_tfrecord_single_label_jpeg_and_png(tmp_path):
  records = synthetic_data.id_records(10, size=20, fmt="jpeg") + synthetic_data.id_records(
    7, size=9, fmt="png"
  )
  synthetic_data.write_shards(str(tmp_path), "mine-train", records, 3)
  config = input_pipeline.dataset_config(
    source="tfrecord",
    name="mine",
    data_dir=str(tmp_path),
    train_split="train",
    eval_split="train",
    num_classes=10,
    image_size=16,
    pp_eval=PP_EVAL,
    shuffle_buffer=8,
  )
  info = input_pipeline.get_dataset_info(config)
  assert info.num_classes == 10 and info.num_examples == {"train": None}
  labels, _ = _eval_examples(config)
  assert sorted(labels) == sorted(list(range(10)) + list(range(7)))
  batch = next(input_pipeline.make_train_iterator(config, global_batch_size=4))
  assert batch["image"].shape == (4, 16, 16, 3) and batch["label"].dtype == np.int32


def test_tfrecord_multi_label_custom_keys(tmp_path):
  k = 6

  def labels_fn(i):
    return sorted({i % k, (3 * i + 1) % k}) if i % 5 else []  # Some have no positive label.

  rng = np.random.default_rng(0)
  records = [
    synthetic_data.example(
      synthetic_data.encode(synthetic_data.random_image(rng, 8, 8)), labels_fn(i), "jpg", "tags"
    )
    for i in range(15)
  ]
  synthetic_data.write_shards(str(tmp_path), "jft-train", records, 2)
  config = input_pipeline.dataset_config(
    source="tfrecord",
    name="jft",
    data_dir=str(tmp_path),
    train_split="train",
    eval_split="train",
    num_classes=k,
    multi_label=True,
    image_key="jpg",
    label_key="tags",
    image_size=8,
    pp_eval=PP_EVAL,
  )
  assert input_pipeline.get_dataset_info(config).multi_label
  got, _ = _eval_examples(config, batch=4)
  expected = [np.isin(np.arange(k), labels_fn(i)).astype(np.float32) for i in range(15)]
  assert sorted(map(tuple, got)) == sorted(map(tuple, expected))
  batch = next(input_pipeline.make_train_iterator(config, global_batch_size=4))
  assert batch["label"].shape == (4, k) and batch["label"].dtype == np.float32


@pytest.mark.parametrize(
  "name,num_classes",
  # oxford_iiit_pet is left out: tfds's own mock generator draws invalid bounding boxes for it.
  [
    ("cifar10", 10),
    ("cifar100", 100),
    ("oxford_flowers102", 102),
    ("imagenet2012", 1000),
    ("imagenet_v2", 1000),
    ("dtd", 47),
    ("svhn_cropped", 10),
  ],
)
def test_tfds_mock(name, num_classes):
  with tfds_mocking.mock_data(num_examples=9, policy=tfds_mocking.MockPolicy.USE_CODE):
    config = input_pipeline.dataset_config(
      source="tfds",
      name=name,
      data_dir="/nonexistent",
      train_split="train",
      eval_split="test",
      image_size=32,
      shuffle_buffer=4,
    )
    info = input_pipeline.get_dataset_info(config)
    assert info.num_classes == num_classes and len(info.class_names) == num_classes
    labels, n = _eval_examples(config, batch=4)
    assert len(labels) == 9 and n == 3
    batch = next(input_pipeline.make_train_iterator(config, global_batch_size=4))
    assert batch["image"].shape == (4, 32, 32, 3) and batch["mask"].sum() == 4


def test_tfds_vtab_style_label_key():
  # VTAB-1k dSprites tasks pick one of several label features.
  with tfds_mocking.mock_data(num_examples=5, policy=tfds_mocking.MockPolicy.USE_CODE):
    config = input_pipeline.dataset_config(
      source="tfds",
      name="dsprites",
      train_split="train[:800]",
      eval_split="train[800:1000]",
      label_key="label_shape",
      image_size=16,
    )
    assert input_pipeline.get_dataset_info(config).num_classes == 3
    labels, _ = _eval_examples(config, batch=4)
    assert len(labels) == 5 and all(0 <= x < 3 for x in labels)


def test_image_folder(tmp_path):
  classes = ["cat", "dog", "zebra"]
  n_train = synthetic_data.write_image_folder(str(tmp_path), "train", classes, per_class=5)
  n_val = synthetic_data.write_image_folder(str(tmp_path), "val", classes[:2], per_class=3)
  (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
  config = input_pipeline.dataset_config(
    source="folder", data_dir=str(tmp_path), train_split="train", eval_split="val", image_size=12
  )
  info = input_pipeline.get_dataset_info(config)
  assert info.class_names == classes and info.num_classes == 3
  assert info.num_examples == {"train": n_train, "val": n_val}
  labels, _ = _eval_examples(config, batch=4)
  assert sorted(labels) == [0, 0, 0, 1, 1, 1]
  batch = next(input_pipeline.make_train_iterator(config, global_batch_size=4))
  assert batch["image"].shape == (4, 12, 12, 3) and batch["mask"].sum() == 4
  with pytest.raises(ValueError, match="test"):
    input_pipeline.make_eval_iterator(config, "test", global_batch_size=2)


def test_image_folder_takes_slices_as_the_builtin_datasets_do(tmp_path):
  from vit_jax.input_pipeline.sources import indexed

  classes = ["ant", "bee", "cat", "dog"]
  synthetic_data.write_image_folder(str(tmp_path), "train", classes, per_class=25)
  config = input_pipeline.dataset_config(source="folder", data_dir=str(tmp_path))

  def files(split):
    return [p.decode() for p in indexed.FolderSource(config, split, 0, 1).paths.numpy()]

  everything = files("train")
  head, tail = files("train[:98%]"), files("train[98%:]")
  # Disjoint and together the split, each in the folder's order.
  assert len(head) == 98 and len(tail) == 2 and sorted(head + tail) == sorted(everything)
  assert head == sorted(head, key=everything.index)
  assert (
    set(files("train[:40]")) <= set(files("train[:80]")) and files("train[:100%]") == everything
  )
  # A range of a shuffle, not of the class-sorted listing: the first 40 hold every class.
  assert {os.path.basename(os.path.dirname(p)) for p in files("train[:40]")} == set(classes)
  config.train_split, config.eval_split = "train[:98%]", "train[98%:]"
  info = input_pipeline.get_dataset_info(config)
  assert info.num_examples == {"train[:98%]": 98, "train[98%:]": 2} and info.num_classes == 4
  labels, _ = _eval_examples(config, batch=2)
  assert len(labels) == 2
  with pytest.raises(ValueError, match=r"Image folder .*train.*: slice 'train\[100:\]' of 100"):
    files("train[100:]")


@pytest.mark.parametrize(
  "name,train,test,size",
  [
    ("fashion_mnist", 60000, 10000, 28),
    ("animal_mnist", 9000, 1000, 28),
    ("mnist_5k", 4500, 500, 28),
    ("digits", 1618, 179, 8),
  ],
)
def test_builtin(name, train, test, size):
  config = input_pipeline.dataset_config(
    source="builtin",
    name=name,
    train_split="train",
    eval_split="test",
    image_size=size,
    pp_train="decode|flip_lr|value_range(-1, 1)",
    pp_eval="decode|value_range(-1, 1)",
  )
  info = input_pipeline.get_dataset_info(config)
  assert info.num_examples == {"train": train, "test": test} and info.num_classes == 10
  images, labels = builtin.get_split(name, "test")
  assert images.shape == (test, size, size, 1) and images.dtype == np.uint8
  assert np.bincount(labels).min() >= test // 10 - 1  # Stratified: every class in test.
  batch = next(input_pipeline.make_train_iterator(config, global_batch_size=16))
  assert batch["image"].shape == (16, size, size, 3) and batch["mask"].sum() == 16
  assert (batch["image"][..., 0] == batch["image"][..., 2]).all()  # Gray → RGB.


def test_builtin_eval_and_unknown_split():
  config = input_pipeline.dataset_config(
    source="builtin",
    name="mnist_5k",
    eval_split="test",
    image_size=28,
    pp_eval=PP_EVAL,
  )
  labels, _ = _eval_examples(config, batch=64)
  assert np.bincount(labels).tolist() == [50] * 10
  with pytest.raises(ValueError, match="no split 'validation'"):
    input_pipeline.make_eval_iterator(config, "validation", global_batch_size=8)


def test_restricted_unpickler_refuses_code(tmp_path):
  import gzip
  import os
  import pickle

  path = tmp_path / "evil.gz"
  with gzip.open(path, "wb") as f:
    pickle.dump(os.system, f)
  with pytest.raises(pickle.UnpicklingError, match="only numpy arrays"):
    builtin._load_array_pickle(str(path))


def test_make_shards_builtin_streams_like_jft(tmp_path):
  for split in ("train", "test"):
    make_shards.shard_builtin("digits", split, str(tmp_path), num_shards=4)
  config = input_pipeline.dataset_config(
    source="tfrecord",
    name="digits",
    data_dir=str(tmp_path),
    train_split="train",
    eval_split="test",
    image_size=8,
    pp_eval="decode|value_range(-1, 1)",
  )
  info = input_pipeline.get_dataset_info(config)  # From dataset_info.json.
  assert info.num_classes == 10 and info.class_names[3] == "3"
  assert info.num_examples == {"train": 1618, "test": 179}
  labels, _ = _eval_examples(config, batch=32)
  np.testing.assert_array_equal(
    np.bincount(labels), np.bincount(builtin.get_split("digits", "test")[1])
  )


def test_make_shards_cli_folder(tmp_path):
  root, out = tmp_path / "photos", tmp_path / "shards"
  synthetic_data.write_image_folder(str(root), "train", ["a", "b"], per_class=4)
  subprocess.run(
    [
      sys.executable,
      "-m",
      "vit_jax.tools.make_shards",
      f"--folder={root}",
      "--split=train",
      f"--out_dir={out}",
      "--num_shards=3",
    ],
    check=True,
    capture_output=True,
    cwd=REPO,
  )
  assert len(list(out.glob("photos-train.tfrecord-*-of-00003"))) == 3
  config = input_pipeline.dataset_config(
    source="tfrecord",
    name="photos",
    data_dir=str(out),
    train_split="train",
    eval_split="train",
    image_size=12,
  )
  assert input_pipeline.get_dataset_info(config).class_names == ["a", "b"]
  labels, _ = _eval_examples(config, batch=3)
  assert sorted(labels) == [0] * 4 + [1] * 4


def test_make_shards_never_leaves_two_sets_and_the_reader_checks_its_listing(tmp_path):
  """A rerun with another --num_shards into the same directory is refused (nothing written) or,
  with --overwrite, replaces the split; a split whose files disagree with dataset_info.json
  stops the reader with one line."""
  out = str(tmp_path)
  make_shards.shard_builtin("digits", "test", out, num_shards=4)
  before = sorted(p.name for p in tmp_path.glob("digits-test.tfrecord-*"))
  assert len(before) == 4
  with pytest.raises(FileExistsError, match="already holds 4 shard files of split 'test'"):
    make_shards.shard_builtin("digits", "test", out, num_shards=2)
  assert sorted(p.name for p in tmp_path.glob("digits-test.tfrecord-*")) == before

  def run(*flags):
    argv = [sys.executable, "-m", "vit_jax.tools.make_shards", "--dataset=digits", "--split=test"]
    return subprocess.run(
      [*argv, f"--out_dir={out}", *flags], capture_output=True, text=True, cwd=REPO
    )

  refused = run("--num_shards=2")
  assert refused.returncode == 1
  assert (
    refused.stderr.strip()
    .splitlines()[-1]
    .startswith(
      f"make_shards: error: FileExistsError: {out} already holds 4 shard files of split 'test'"
    )
  )
  assert run("--num_shards=2", "--overwrite").returncode == 0
  assert sorted(p.name for p in tmp_path.glob("digits-test.tfrecord-*")) == [
    "digits-test.tfrecord-00000-of-00002",
    "digits-test.tfrecord-00001-of-00002",
  ]
  config = input_pipeline.dataset_config(
    source="tfrecord", name="digits", data_dir=out, train_split="test", eval_split="test",
    image_size=8, pp_eval="decode|value_range(-1, 1)",
  )  # fmt: skip
  labels, _ = _eval_examples(config, batch=32)
  assert len(labels) == 179  # one set, read once
  # A stale shard beside the listed ones (a copy from elsewhere, a crashed rewrite).
  (tmp_path / "digits-test.tfrecord-00003-of-00004").write_bytes(b"")
  with pytest.raises(
    input_pipeline.DataMismatchError, match="1 not listed .digits-test.tfrecord-00003"
  ):
    _eval_examples(config, batch=32)


def test_builtin_slices_are_shuffled_nested_and_disjoint():
  images, labels = builtin.get_split("animal_mnist", "train")  # sorted by class in the files
  head = builtin.get_split("animal_mnist", "train[:98%]")
  tail = builtin.get_split("animal_mnist", "train[98%:]")
  assert len(head[1]) == 8820 and len(tail[1]) == 180
  assert np.bincount(tail[1], minlength=10).min() >= 5  # a shuffle, not the last class
  # Together the two slices are the split (as a multiset: the files hold duplicate images).
  rows = lambda x: sorted(r.tobytes() + bytes([int(y)]) for r, y in zip(*x, strict=True))  # noqa: E731
  assert sorted(rows(head) + rows(tail)) == rows((images, labels))
  small = builtin.get_split("animal_mnist", "train[:100]")
  large = builtin.get_split("animal_mnist", "train[:1000]")
  assert len(small[1]) == 100 and set(rows(small)) <= set(rows(large))
  whole = builtin.get_split("animal_mnist", "train[:100%]")
  np.testing.assert_array_equal(whole[0], images)
  config = input_pipeline.dataset_config(
    source="builtin", name="mnist_5k", train_split="train[:1000]"
  )
  assert input_pipeline.get_dataset_info(config).num_examples["train[:1000]"] == 1000
  with pytest.raises(ValueError, match="no split 'val'"):
    builtin.get_split("mnist_5k", "val[:10]")
  with pytest.raises(ValueError, match="is empty"):
    builtin.get_split("mnist_5k", "train[50%:10%]")
