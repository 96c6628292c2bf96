"""Segmentation shards: make_shards --task=segmentation, then the seg_shards source, streamed
record by record: the examples of the folder and synthetic sources they were written from
(bitwise), exact resume, a bound on what the reader holds whatever the split's size, and its
one-line errors."""

import json
import os
import threading
import types

import numpy as np
import pytest
import tensorflow as tf
from absl import app
from PIL import Image

from tests.helpers import synthetic_data
from vit_jax import input_pipeline
from vit_jax.input_pipeline.sources import segmentation as seg_data
from vit_jax.input_pipeline.sources import segmentation_synthetic as synthetic
from vit_jax.input_pipeline.sources import tfrecord_files
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


def _config(source, data_dir, **kw):
  return input_pipeline.dataset_config(source=source, data_dir=str(data_dir), **kw)


def _assert_same(a, b):
  for x, y in zip(a, b, strict=True):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(x, y)


def _written(directory, split="train") -> list[str]:
  """The names the shards of `split` hold, in the written split's order (image/index)."""
  info = json.loads((directory / "dataset_info.json").read_text())
  names = {}
  for file in info["splits"][split]["shards"]:
    for record in tf.data.TFRecordDataset(str(directory / file)).as_numpy_iterator():
      f = tf.train.Example.FromString(record).features.feature
      names[f[seg_data.INDEX_KEY].int64_list.value[0]] = f[seg_data.NAME_KEY].bytes_list.value[0]
  return [names[i].decode() for i in range(len(names))]


def test_folder_shards_give_the_folder_examples_bitwise(tmp_path):
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
  assert sorted(_written(out)) == [f"x{i}.{'jpg' if i == 4 else 'png'}" for i in range(7)]

  # Every image larger at 40 px than written (upsampled, nothing lost), masks by nearest.
  kw = dict(image_size=40, pp_eval="")
  for split in ("train", "train[:4]", "train[3:]"):
    shards = synthetic_data.split_examples(_config("seg_shards", out, **kw), split)
    _assert_same(shards, synthetic_data.split_examples(_config("seg_folder", root, **kw), split))
  assert len(shards[0]) == 4 and shards[0].shape[1:] == (40, 40, 3)

  config = _config("seg_shards", out, train_split="train[:5]", eval_split="train")
  got = input_pipeline.get_dataset_info(config)
  assert got.num_classes == 3 and got.class_names == CLASSES
  assert got.num_examples == {"train[:5]": 5, "train": 7}


def test_synthetic_shards_hold_the_tasks_examples(tmp_path):
  make_shards.shard_seg_builtin("mnist_seg", "val", str(tmp_path), num_shards=2)
  kw = dict(name="mnist_seg", image_size=48, train_split="val[:32]", pp_train="", pp_eval="")
  builtin, shards = _config("seg_builtin", "", **kw), _config("seg_shards", tmp_path, **kw)
  assert input_pipeline.get_dataset_info(shards).class_names == synthetic.synthetic_class_names(
    "mnist_seg"
  )
  input_pipeline.check_readable(shards, "val[:32]")
  _assert_same(
    synthetic_data.split_examples(shards, "val[:9]"),
    synthetic_data.split_examples(builtin, "val[:9]"),
  )
  # A training epoch of the slice (4 batches of 8, read by position from both shards): each of
  # its 32 examples once, the task's (at the canvases' size, unaugmented: the arrays).
  it = input_pipeline.make_train_iterator(shards, global_batch_size=8, seed=1)
  batches = [next(it) for _ in range(4)]
  it.close()
  images = np.concatenate([b["image"] for b in batches])
  labels = np.concatenate([b["label"] for b in batches])
  order = sorted(range(32), key=lambda i: (images[i].tobytes(), labels[i].tobytes()))
  _assert_same((images[order], labels[order]), synthetic_data.split_examples(builtin, "val[:32]"))
  assert all(b["mask"].all() for b in batches)


def _canvas_shards(directory, n=24, num_shards=4):
  """The first n canvases of the synthetic val split, as a `train` split of shards."""
  data = synthetic.synthetic_split("mnist_seg", "val")
  examples = [(seg_data.encode_png(data.images[i]), data.masks[i], f"c{i}", i) for i in range(n)]
  classes = synthetic.synthetic_class_names("mnist_seg")
  make_shards._write_segmentation(examples, n, str(directory), "t", "train", num_shards, classes, 1)


@pytest.mark.parametrize("split, hosts", [("train", 1), ("train", 2), ("train[:20]", 2)])
def test_streamed_shards_resume_bitwise(tmp_path, split, hosts):
  """Each host's stream continues exactly from a saved state: over epochs (24 or 20 records,
  batches of 8), with files split over the hosts or, for a slice, its records."""
  _canvas_shards(tmp_path)
  config = _config(
    "seg_shards", tmp_path, image_size=24, train_split=split, shuffle_buffer=8,
    pp_train="random_crop(0.5)|flip_lr",
  )  # fmt: skip
  for host in range(hosts):
    kw = dict(global_batch_size=8, seed=2, process_index=host, process_count=hosts)
    it = input_pipeline.make_train_iterator(config, **kw)
    batches = [next(it) for _ in range(4)]
    state = it.get_state()  # after 4 batches, whatever the iterator prefetched
    batches += [next(it) for _ in range(3)]
    it.close()
    assert state["num_records"] == 4 * 8 // hosts
    resumed = input_pipeline.make_train_iterator(config, state=state, **kw)
    for want in batches[4:]:
      got = next(resumed)
      _assert_same([got[k] for k in ("image", "label", "mask")], [want[k] for k in want])
    resumed.close()
    assert all(b["mask"].all() for b in batches)


def test_the_reader_holds_a_bounded_part_of_a_split_whatever_its_size(tmp_path, monkeypatch):
  """3,000 records in 2 shards, read by the training and the evaluation iterators: the records
  read from the files and not yet delivered in a batch stay under a bound set by the pipeline's
  buffers (a chunk of each file being read, the shuffle buffer, the per-record stage, the
  batches prefetched), far below the split. A reader that loads a split whole (as the source
  did before it streamed) holds all 3,000 at its first batch."""
  n, batch = 3000, 16
  rng = np.random.default_rng(0)
  examples = [
    (seg_data.encode_png(rng.integers(0, 256, (8, 8, 1), np.uint8)), np.zeros((8, 8), np.uint8),
     f"r{i}", i)
    for i in range(n)
  ]  # fmt: skip
  make_shards._write_segmentation(examples, n, str(tmp_path), "t", "train", 2, CLASSES, 1)
  read, lock = [0], threading.Lock()
  real = tfrecord_files.read_chunks

  def counted(path, expected=tfrecord_files.UNKNOWN):
    # tf.data's threads call it, for this test's files and for those of another test's iterator
    # not yet released in the same worker: only this test's files count.
    mine = str(tmp_path) in (path.decode() if isinstance(path, bytes) else path)
    for chunk in real(path, expected):
      if mine:
        with lock:
          read[0] += len(chunk[0])
      yield chunk

  monkeypatch.setattr(tfrecord_files, "read_chunks", counted)
  config = _config(
    "seg_shards", tmp_path, image_size=8, train_split="train", eval_split="train",
    pp_train="flip_lr", pp_eval="", shuffle_buffer=64, prefetch=2,
  )  # fmt: skip
  cycle = max(16, 2 * (os.cpu_count() or 1))  # the per-record stage's interleave (pipeline.py)
  bound = 2 * tfrecord_files._CHUNK + 64 + 4 * cycle + 16 * batch
  assert bound < n // 2

  def most_held(iterator, batches):
    delivered, most = 0, 0
    for _ in range(batches):
      next(iterator)
      delivered += batch
      most = max(most, read[0] - delivered)
    return most

  train = input_pipeline.make_train_iterator(config, global_batch_size=batch, seed=0)
  held = most_held(train, 40)  # 640 of the 3,000
  train.close()
  assert 0 < held <= bound, (held, bound)
  read[0] = 0
  held = most_held(iter(input_pipeline.make_eval_iterator(config, global_batch_size=batch)), 40)
  assert 0 < held <= bound, (held, bound)


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
  a = _config("seg_shards", tmp_path / "a", train_split="val[:3]", eval_split="val")
  assert input_pipeline.get_dataset_info(a).num_examples == {"val[:3]": 3, "val": 500}
  assert _written(tmp_path / "b") == ["x0.png", "x1.png", "x2.png"]
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
    ("mask_size", r"^mask .*t-train.tfrecord-00000-of-00001 record 0 \(bad.png\) is 6x5 but its"),
    ("label", r"^mask .*t-train.tfrecord-00000-of-00001 record 0 \(bad.png\): label 7 outside"),
  ],
)
def test_bad_shards_are_one_line_naming_the_culprit(tmp_path, kind, message):
  """What the shards' listing says is checked when the source opens them; a record's mask when
  it is read (a mask of another size, a label outside the classes: the run stops, nothing is
  skipped). An image declaring too many pixels is a skipped example (test_bad_data.py)."""
  split = "train"
  if kind == "classification":
    make_shards.shard_builtin("digits", "test", str(tmp_path), num_shards=1)
  elif kind == "no_split":
    _one_record_shards(tmp_path, 8)
    split = "val[:10]"
  elif kind == "mask_size":
    _one_record_shards(tmp_path, 5)
  elif kind == "label":
    _one_record_shards(tmp_path, 8, label=7)
  config = _config("seg_shards", tmp_path, image_size=8, pp_eval="")
  with pytest.raises((ValueError, FileNotFoundError), match=message) as e:
    list(input_pipeline.make_eval_iterator(config, split, global_batch_size=1))
  assert "\n" not in str(e.value)
  if kind == "no_split":  # the good example reads
    (batch,) = input_pipeline.make_eval_iterator(config, "train", global_batch_size=1)
    assert batch["mask"].tolist() == [1.0]


def test_the_files_a_split_finds_are_checked_against_its_listing(tmp_path):
  """As the classification reader does: a stray shard beside the listed ones (an earlier
  make_shards run), or a listed one missing, stops the reader in one line."""
  image = seg_data.encode_png(np.zeros((8, 6, 3), np.uint8))
  examples = [(image, np.zeros((8, 6), np.uint8), f"x{i}.png", i) for i in range(2)]
  make_shards._write_segmentation(examples, 2, str(tmp_path), "t", "train", 2, CLASSES, 3)
  config = _config("seg_shards", tmp_path)
  input_pipeline.check_readable(config, "train")
  stray = tmp_path / "t-train.tfrecord-00000-of-00003"
  stray.write_bytes(b"")
  with pytest.raises(
    input_pipeline.DataMismatchError,
    match=r"^split 'train': the files matching '.*t-train.tfrecord-\*' are not the 2 shards its "
    r"dataset_info.json lists: 1 not listed \(t-train.tfrecord-00000-of-00003, ...\); rewrite",
  ):
    input_pipeline.check_readable(config, "train")
  stray.unlink()
  (tmp_path / "t-train.tfrecord-00001-of-00002").unlink()
  with pytest.raises(
    input_pipeline.DataMismatchError,
    match=r"1 listed but missing \(t-train.tfrecord-00001-of-00002, ...\)",
  ):
    input_pipeline.make_eval_iterator(config, "train", global_batch_size=2)


def test_tfrecord_source_refuses_segmentation_shards(tmp_path):
  _one_record_shards(tmp_path, 8)
  config = _config("tfrecord", tmp_path, name="t", train_split="train", eval_split="train")
  with pytest.raises(ValueError, match="segmentation shards; dataset.source='seg_shards'"):
    input_pipeline.get_dataset_info(config)


@pytest.mark.slow  # ~20 s on 2 cores; the fast tests hold the source to the others' examples
def test_segment_stage_runs_on_shards(tmp_path, trainer_on_one_device):
  from vit_jax import stages
  from vit_jax.runtime import config_files

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


def test_make_shards_names_an_image_it_cannot_decode_in_one_line(tmp_path):
  from test_image_header import bomb_png  # tests/

  for d in ("images", "masks"):
    (tmp_path / "train" / d).mkdir(parents=True)
  Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "train" / "masks" / "x.png")
  image = tmp_path / "train" / "images" / "x.png"
  image.write_bytes(bomb_png())  # past Pillow's own bound, which refuses it at its header
  with pytest.raises(ValueError, match=rf"^image {image}: Image size \(900000000 pixels\)"):
    seg_data.read_folder_example(str(tmp_path), "train", "x.png", 3)
  image.write_bytes(b"not an image")
  with pytest.raises(ValueError, match=rf"^image {image}: cannot identify image file"):
    seg_data.read_folder_example(str(tmp_path), "train", "x.png", 3)
