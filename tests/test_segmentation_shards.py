"""Segmentation shards: make_shards --task=segmentation, then the seg_shards source, held to the
folder and synthetic sources they were written from (bitwise), and its one-line errors."""

import json
import os
import types

import numpy as np
import pytest
from absl import app
from PIL import Image

from vit_jax import input_pipeline
from vit_jax.input_pipeline import segmentation as seg_data
from vit_jax.tools import make_shards

IGNORE = seg_data.IGNORE_LABEL
CLASSES = ["background", "cat", "dog"]


def _write_folder(root, n=7):
  """A folder of n examples of varied sizes: RGB PNGs, a grey PNG and a JPEG (stored as their
  bytes, decoded as RGB by both sources); masks grey or palette PNGs, some pixels ignored."""
  rng = np.random.default_rng(0)
  for d in ("images", "masks"):
    os.makedirs(root / "train" / d)
  for i in range(n):
    h, w = 20 + 3 * i, 32 - 2 * i
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    mask = rng.integers(0, len(CLASSES), (h, w)).astype(np.uint8)
    mask[0, : i + 1] = IGNORE
    if i == 2:
      Image.fromarray(image[..., 0]).save(root / "train" / "images" / f"x{i}.png")
    else:
      ext = "jpg" if i == 4 else "png"
      Image.fromarray(image).save(root / "train" / "images" / f"x{i}.{ext}")
    m = Image.fromarray(mask, mode="L")
    if i % 2:
      m = m.convert("P")
      m.putpalette([v for c in range(256) for v in (c * 5 % 256, c * 9 % 256, c)])
    m.save(root / "train" / "masks" / f"x{i}.png")
  (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")


def _clear_caches():
  seg_data._folder_data.cache_clear()
  seg_data._shards_data.cache_clear()


def _config(source, data_dir, **kw):
  return input_pipeline.dataset_config(source=source, data_dir=str(data_dir), **kw)


def _assert_same_data(a, b):
  assert a.names == b.names
  for x, y in zip(a.images + a.masks, b.images + b.masks, strict=True):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(x, y)


def test_folder_shards_give_the_folder_arrays_bitwise(tmp_path):
  _clear_caches()
  root, out = tmp_path / "pets", tmp_path / "shards"
  _write_folder(root)
  paths = make_shards.shard_seg_folder(str(root), "train", str(out), num_shards=3)
  assert [os.path.basename(p) for p in paths] == [
    f"pets-train.tfrecord-{i:05d}-of-00003" for i in range(3)
  ]
  info = json.loads((out / "dataset_info.json").read_text())
  assert info["task"] == "segmentation" and info["ignore_label"] == IGNORE
  assert info["class_names"] == CLASSES and info["num_classes"] == 3
  assert info["splits"]["train"]["num_examples"] == 7
  assert sorted(info["splits"]["train"]["shards"].values()) == [2, 2, 3]

  for split in ("train", "train[:4]", "train[3:]"):
    folder = seg_data.load_split(_config("seg_folder", root), split)
    shards = seg_data.load_split(_config("seg_shards", out), split)
    _assert_same_data(shards, folder)
  assert len(shards.masks) == 4 and shards.images[0].shape[2] == 3

  config = _config("seg_shards", out, train_split="train[:5]", eval_split="train")
  got = input_pipeline.get_dataset_info(config)
  assert got.num_classes == 3 and got.class_names == CLASSES
  assert got.num_examples == {"train[:5]": 5, "train": 7}


def test_synthetic_shards_and_their_train_batches_are_the_tasks(tmp_path):
  _clear_caches()
  make_shards.shard_seg_builtin("mnist_seg", "val", str(tmp_path), num_shards=2)
  kw = dict(
    name="mnist_seg",
    image_size=24,
    train_split="val[:32]",
    pp_train="random_crop|flip_lr",
    pp_eval="",
  )
  builtin = _config("seg_builtin", "", **kw)
  shards = _config("seg_shards", tmp_path, **kw)
  _assert_same_data(seg_data.load_split(shards, "val"), seg_data.load_split(builtin, "val"))
  assert input_pipeline.get_dataset_info(shards).class_names == seg_data.synthetic_class_names(
    "mnist_seg"
  )
  # Through the trainer's iterators: the same augmented batches.
  input_pipeline.check_readable(shards, "val[:32]")
  a = input_pipeline.make_train_iterator(builtin, global_batch_size=8, seed=1)
  b = input_pipeline.make_train_iterator(shards, global_batch_size=8, seed=1)
  pairs = [(next(a), next(b)) for _ in range(2)]
  ev = input_pipeline.make_eval_iterator
  pairs += zip(
    ev(builtin, "val[:9]", global_batch_size=4),
    ev(shards, "val[:9]", global_batch_size=4),
    strict=True,
  )
  assert len(pairs) == 5
  for x, y in pairs:
    for k in ("image", "label", "mask"):
      np.testing.assert_array_equal(x[k], y[k])


def _flags(**values):
  names = (
    "dataset",
    "folder",
    "task",
    "split",
    "out_dir",
    "name",
    "num_shards",
    "shuffle_seed",
    "overwrite",
  )
  defaults = dict.fromkeys(names) | dict(num_shards=2, shuffle_seed=0, overwrite=False)
  return types.SimpleNamespace(
    **{k: types.SimpleNamespace(value=v) for k, v in (defaults | values).items()}
  )


def test_make_shards_command_picks_the_task(tmp_path, capsys):
  # The command's main (its flags as values): a synthetic task's name implies segmentation, a
  # folder needs --task=segmentation, and a synthetic task is no classification dataset.
  _clear_caches()
  _write_folder(tmp_path / "pets", n=3)
  make_shards.main([], _flags(dataset="mnist_seg", split=["val"], out_dir=str(tmp_path / "a")))
  make_shards.main(
    [],
    _flags(
      folder=str(tmp_path / "pets"),
      task="segmentation",
      split=["train"],
      out_dir=str(tmp_path / "b"),
    ),
  )
  assert "val: 2 shards" in capsys.readouterr().out
  assert len(seg_data.load_split(_config("seg_shards", tmp_path / "a"), "val[:3]").masks) == 3
  assert seg_data.load_split(_config("seg_shards", tmp_path / "b"), "train").names == [
    "x0.png",
    "x1.png",
    "x2.png",
  ]
  with pytest.raises(app.UsageError, match="--dataset=mnist_seg is a segmentation task"):
    make_shards.main([], _flags(dataset="mnist_seg", task="classification", out_dir="x"))


def _one_record_shards(tmp_path, mask_rows, label=0):
  """Shards of one 8x6 image whose mask has `mask_rows` rows (8: a good example), one pixel
  labelled `label`."""
  image = np.zeros((8, 6, 3), np.uint8)
  mask = np.zeros((mask_rows, 6), np.uint8)
  mask[1, 2] = label
  examples = [(seg_data.encode_png(image), mask, "bad.png", 0)]
  make_shards._write_segmentation(examples, 1, str(tmp_path), "t", "train", 1, CLASSES, 3)


@pytest.mark.parametrize(
  "kind, message",
  [
    ("no_info", r"segmentation shards .*: no dataset_info.json \(write the shards with"),
    ("classification", r"dataset_info.json: shards of a classification task, not segmentation"),
    ("no_split", r"segmentation shards .*: no split 'val'; splits: \['train'\]"),
    ("mask_size", r"mask .*t-train.tfrecord-00000-of-00001 record 0 \(bad.png\) is 6x5 but its"),
    ("label", r"mask .*t-train.tfrecord-00000-of-00001 record 0 \(bad.png\): label 7 outside"),
    (
      "too_large",
      r"image .*t-train.tfrecord-00000-of-00001 record 0 declares 6x8 = 48 pixels, more than "
      r"dataset.max_image_pixels=40$",
    ),
  ],
)
def test_bad_shards_are_one_line_naming_the_culprit(tmp_path, kind, message):
  _clear_caches()
  split, bound = "train", {}
  if kind == "classification":
    make_shards.shard_builtin("digits", "test", str(tmp_path), num_shards=1)
  elif kind == "no_split":
    _one_record_shards(tmp_path, 8)
    split = "val[:10]"
  elif kind == "mask_size":
    _one_record_shards(tmp_path, 5)
  elif kind == "label":
    _one_record_shards(tmp_path, 8, label=7)
  elif kind == "too_large":  # checked before decoding
    _one_record_shards(tmp_path, 8)
    bound = dict(max_image_pixels=40)
  with pytest.raises((ValueError, FileNotFoundError), match=message) as e:
    seg_data.load_split(_config("seg_shards", tmp_path, **bound), split)
  assert "\n" not in str(e.value)
  if kind == "no_split":  # the good example reads
    assert seg_data.load_split(_config("seg_shards", tmp_path), "train").names == ["bad.png"]


def test_the_files_a_split_finds_are_checked_against_its_listing(tmp_path):
  """As the classification reader does: a stray shard beside the listed ones (an earlier
  make_shards run), or a listed one missing, stops the reader in one line."""
  _clear_caches()
  image = seg_data.encode_png(np.zeros((8, 6, 3), np.uint8))
  examples = [(image, np.zeros((8, 6), np.uint8), f"x{i}.png", i) for i in range(2)]
  make_shards._write_segmentation(examples, 2, str(tmp_path), "t", "train", 2, CLASSES, 3)
  config = _config("seg_shards", tmp_path)
  assert seg_data.load_split(config, "train").names == ["x0.png", "x1.png"]
  stray = tmp_path / "t-train.tfrecord-00000-of-00003"
  stray.write_bytes(b"")
  _clear_caches()
  with pytest.raises(
    input_pipeline.DataMismatchError,
    match=r"^split 'train': the files matching '.*t-train.tfrecord-\*' are not the 2 shards its "
    r"dataset_info.json lists: 1 not listed \(t-train.tfrecord-00000-of-00003, ...\); rewrite",
  ):
    seg_data.load_split(config, "train")
  stray.unlink()
  (tmp_path / "t-train.tfrecord-00001-of-00002").unlink()
  _clear_caches()
  with pytest.raises(
    input_pipeline.DataMismatchError,
    match=r"1 listed but missing \(t-train.tfrecord-00001-of-00002, ...\)",
  ):
    seg_data.load_split(config, "train")


def test_tfrecord_source_refuses_segmentation_shards(tmp_path):
  _one_record_shards(tmp_path, 8)
  config = _config("tfrecord", tmp_path, name="t", train_split="train", eval_split="train")
  with pytest.raises(ValueError, match="segmentation shards; dataset.source='seg_shards'"):
    input_pipeline.get_dataset_info(config)


@pytest.mark.slow  # ~20 s on 2 cores; the fast tests hold the source to the others' arrays
def test_segment_stage_runs_on_shards(tmp_path, trainer_on_one_device):
  from vit_jax import config_files, stages

  _clear_caches()
  make_shards.shard_seg_builtin("mnist_seg", "val", str(tmp_path / "shards"), num_shards=2)
  config = config_files.from_flags(
    [
      "--config=configs/segment.py:dataset=shards,runlocal",
      f"--config.dataset.data_dir={tmp_path / 'shards'}",
      "--config.init_from_scratch=true",
      "--config.dataset.train_split=val[:32]",
      "--config.dataset.eval_split=val[32:48]",
      "--config.evals.test.split=val[48:64]",
      "--config.dataset.image_size=16",
      "--config.total_steps=2",
      "--config.checkpoint.asynchronous=false",
    ]
  )
  results = stages.run(config, str(tmp_path / "workdir"))
  # The test evaluator counted the labelled pixels of the 16 shards' canvases at 16px.
  batches = input_pipeline.make_eval_iterator(config.dataset, "val[48:64]", global_batch_size=8)
  labelled = sum(int(np.sum(b["label"] != IGNORE)) for b in batches)
  assert results["test/num_pixels"] == labelled > 0
  assert 0 <= results["test/miou"] <= 1 and "test/iou/background" in results


def test_a_folder_image_declaring_too_many_pixels_is_one_line_before_decoding(tmp_path):
  from test_image_header import bomb_png  # tests/

  for d in ("images", "masks"):
    (tmp_path / "train" / d).mkdir(parents=True)
  Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "train" / "masks" / "x.png")
  image = tmp_path / "train" / "images" / "x.png"
  image.write_bytes(bomb_png(12_000, 10_000))
  # Pillow warns from 89.5 million pixels on; the bound stops it before any decoding.
  with pytest.warns(Image.DecompressionBombWarning), pytest.raises(ValueError) as e:
    seg_data.read_folder_example(str(tmp_path), "train", "x.png", 3, max_pixels=100_000_000)
  assert str(e.value) == (
    f"image {image} declares 12000x10000 = 120,000,000 pixels, more than "
    "dataset.max_image_pixels=100,000,000"
  )
  image.write_bytes(bomb_png())  # past Pillow's own bound, which refuses it at its header
  with pytest.raises(ValueError, match=rf"^image {image}: Image size \(900000000 pixels\)"):
    seg_data.read_folder_example(str(tmp_path), "train", "x.png", 3, max_pixels=100_000_000)
