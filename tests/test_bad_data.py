"""Reading is not decoding (vit_jax.input_pipeline.bad_data), in-process: an I/O error is retried
and then one line naming the file; a damaged shard's lost records are counted from its listed
count; an image declaring too many pixels is skipped without decoding; the limit on the share of
skipped examples, over a resume. The runs' behaviour through the entry point: test_data_faults."""

import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from test_image_header import bomb_png  # tests/

from tests.helpers import REPO, synthetic_data, this_thread
from vit_jax import input_pipeline
from vit_jax.input_pipeline import bad_data
from vit_jax.input_pipeline.sources import tfrecord_files
from vit_jax.tools import make_shards

PP = "decode|resize|value_range(-1, 1)"
N, SHARDS = 20, 2


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
  monkeypatch.setattr(bad_data, "READ_BACKOFF_S", 0.0)


def _config(data_dir, **kw):
  args = dict(
    source="tfrecord", name="toy", data_dir=str(data_dir), train_split="train",
    eval_split="train", image_size=8, pp_train=PP, pp_eval=PP, shuffle_buffer=4, prefetch=1,
  )  # fmt: skip
  return input_pipeline.dataset_config(**(args | kw))


def _shards(tmp_path):
  """N examples (label = id) in SHARDS shards that dataset_info.json lists: ids 0-9, 10-19."""
  rng = np.random.default_rng(0)
  examples = [(synthetic_data.encode(synthetic_data.random_image(rng, 8, 8)), i) for i in range(N)]
  names = [str(i) for i in range(N)]
  return make_shards.write_shards(examples, N, str(tmp_path), "toy", "train", SHARDS, names)


def _damage(path) -> tuple[list[int], int]:
  """Flips a byte in the middle of a shard; returns (labels of the records still read, lost)."""
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0xFF
  open(path, "wb").write(bytes(data))
  read = []
  with pytest.raises(tf.errors.DataLossError):
    for record in tf.compat.v1.io.tf_record_iterator(path):
      example = tf.train.Example.FromString(record)
      read.append(example.features.feature["image/class/label"].int64_list.value[0])
  return read, N // SHARDS - len(read)


def test_a_damaged_shards_lost_records_are_counted_from_its_listed_count(tmp_path, caplog):
  paths = _shards(tmp_path)
  read, lost = _damage(paths[1])
  assert 0 < lost < N // SHARDS
  config = _config(tmp_path, max_skipped_fraction=1.0)
  it = input_pipeline.make_train_iterator(config, global_batch_size=4, seed=0)
  batches = [next(it) for _ in range(N // 4)]  # one epoch: the listed 20 records
  masks = np.concatenate([b["mask"] for b in batches])
  labels = np.concatenate([b["label"] for b in batches])
  # Every record of shard 0, the records of shard 1 before the damage, a placeholder per loss.
  assert sorted(labels[masks > 0].tolist()) == sorted(list(range(N // SHARDS)) + read)
  assert it.num_skipped == lost == int(np.sum(masks == 0))
  assert it.get_state()["num_records"] == N  # the epoch kept its listed length
  it.close()
  assert f"{paths[1]} is damaged after record {len(read)} (DataLossError: " in caplog.text
  assert f"its last {lost} of {N // SHARDS} records are lost, counted as skipped" in caplog.text


def test_the_share_of_skipped_examples_stops_a_run_in_one_line_also_after_a_resume(tmp_path):
  paths = _shards(tmp_path)
  _, lost = _damage(paths[0])
  share = lost / N

  def run(fraction, state=None, steps=N // 4):
    config = _config(tmp_path, max_skipped_fraction=fraction)
    it = input_pipeline.make_train_iterator(config, global_batch_size=4, seed=0, state=state)
    try:
      for _ in range(steps):
        next(it)
      return it.get_state()
    finally:
      it.close()

  # At the limit the run goes on (over more than one epoch); past it, it stops once the host
  # read its first epoch (dataset_info.json lists fewer than MIN_RECORDS records).
  run(share, steps=N // 4 + 1)
  state = run(share / 2, steps=N // 4 - 1)  # the epoch is not done: not checked yet
  with pytest.raises(bad_data.TooManySkippedError) as e:
    run(share / 2, state=state, steps=1)  # resumed: the restored counts go on
  assert str(e.value) == (
    f"input pipeline: {lost} of the {N} examples this host read ({100 * share:.2f}%) were "
    f"skipped ({lost - state['num_skipped']} lost in damaged files since the run resumed), "
    f"more than dataset.max_skipped_fraction={share / 2:g}; the most recent: {paths[0]} record "
    f"{N // SHARDS - 1}, which was lost with the rest of its damaged TFRecord file"
  )


def test_an_unreadable_shard_is_read_again_then_one_line(tmp_path, monkeypatch, caplog):
  paths = _shards(tmp_path)
  # A read that fails once after 3 records: read again past them, nothing given twice. Other
  # tests' readers may still run in the worker: only this test's thread sees the fake.
  real, calls = tfrecord_files._records, []

  def flaky(path):
    calls.append(path)
    for i, record in enumerate(real(path)):
      if i == 3 and len(calls) == 1:
        raise tf.errors.UnavailableError(None, None, "connection reset")
      yield record

  with monkeypatch.context() as patched:
    patched.setattr(tfrecord_files, "_records", this_thread.only(flaky, real))
    chunks = list(tfrecord_files.read_chunks(paths[0], N // SHARDS))
  assert [list(c[1]) for c in chunks] == [list(range(N // SHARDS))] and all(chunks[0][2])
  assert list(chunks[0][0]) == list(real(paths[0])) and len(calls) == 2
  assert f"reading {paths[0]} failed (attempt 1 of 4), again in 0.0 s: UnavailableError" in (
    caplog.text
  )
  # A shard that stays unreadable (a directory in its place): the run ends naming it.
  os.remove(paths[1])
  os.mkdir(paths[1])
  it = input_pipeline.make_train_iterator(_config(tmp_path), global_batch_size=4, seed=0)
  with pytest.raises(bad_data.DataReadError) as e:
    next(it)
  it.close()
  assert str(e.value) == (
    f"cannot read {paths[1]} (4 attempts): FailedPreconditionError: {paths[1]}; Is a directory"
  )


@pytest.fixture
def folder(tmp_path):
  """train/: 6 images in 2 classes and bomb.png, declaring 30,000 x 30,000 pixels in 69 bytes."""
  synthetic_data.write_image_folder(str(tmp_path), "train", ["a", "b"], per_class=3)
  (tmp_path / "train" / "a" / "bomb.png").write_bytes(bomb_png())
  return tmp_path


def _folder_epoch(root, caplog, **kw):
  config = input_pipeline.dataset_config(
    source="folder", data_dir=str(root), train_split="train", eval_split="train", image_size=8,
    pp_train=PP, pp_eval=PP, max_skipped_fraction=1.0, **kw,
  )  # fmt: skip
  caplog.clear()
  it = input_pipeline.make_train_iterator(config, global_batch_size=7, seed=0)
  try:
    batch = next(it)
    return it.num_skipped, batch["mask"]
  finally:
    it.close()


def test_an_image_declaring_too_many_pixels_is_skipped_without_decoding(folder, caplog):
  caplog.set_level(logging.WARNING)
  skipped, mask = _folder_epoch(folder, caplog)
  assert skipped == 1 and mask.sum() == 6
  bomb = folder / "train" / "a" / "bomb.png"
  assert (
    f"input pipeline: skipped {bomb}: it declares 900,000,000 pixels, more than "
    "dataset.max_image_pixels=100,000,000" in caplog.text
  )
  # Without the bound the decoder is given it (and fails on its 64 bytes of pixels).
  skipped, mask = _folder_epoch(folder, caplog, max_image_pixels=0)
  assert skipped == 1 and f"skipped {bomb}: it could not be decoded" in caplog.text


def test_an_unreadable_image_file_is_read_again_then_one_line(folder, caplog):
  shutil.rmtree(folder / "train" / "b")
  (folder / "train" / "b").mkdir()
  (folder / "train" / "b" / "gone.png").mkdir()  # listed as an image, unreadable
  with pytest.raises(bad_data.DataReadError) as e:
    _folder_epoch(folder, caplog)
  path = folder / "train" / "b" / "gone.png"
  assert str(e.value) == (
    f"cannot read {path} (4 attempts): FailedPreconditionError: {path}; Is a directory"
  )
  assert f"reading {path} failed (attempt 3 of 4)" in caplog.text


def test_an_evaluations_line_gives_every_digit_of_the_examples_it_read(monkeypatch):
  from vit_jax.runtime import logging_util

  lines = []
  progress = logging_util.Progress(10, 0)
  monkeypatch.setattr(progress, "_log", lines.append)
  progress.evaluation(10, "val", {"val/accuracy": 0.5, "val/num_examples": 50_000.0}, 75.0)
  assert lines[-1] == "step 10/10 | val: accuracy 50.00%, num_examples 50,000 (1m15s)"


# ---------------------------------------------------------------------------------------------
# The segmentation sources, the same way (their records go through the same pipeline).


def _seg_folder(root, names=("a", "b", "c", "d")) -> None:
  """train/images/<name>.png, 8x8 grey, with masks/<name>.png; classes.txt of 3 classes."""
  from PIL import Image

  for d in ("images", "masks"):
    (root / "train" / d).mkdir(parents=True)
  for i, name in enumerate(names):
    Image.fromarray(np.full((8, 8), 10 * i, np.uint8)).save(
      root / "train" / "images" / f"{name}.png"
    )
    Image.fromarray(np.full((8, 8), i % 3, np.uint8)).save(root / "train" / "masks" / f"{name}.png")
  (root / "classes.txt").write_text("bg\nx\ny\n")


def _seg_config(source, data_dir, **kw):
  args = dict(
    source=source, data_dir=str(data_dir), train_split="train", eval_split="train", image_size=8,
    pp_train="flip_lr", pp_eval="", shuffle_buffer=4, prefetch=1,
  )  # fmt: skip
  return input_pipeline.dataset_config(**(args | kw))


def test_segmentation_images_that_are_too_large_or_undecodable_are_skipped_and_counted(
  tmp_path, caplog
):
  """A segmentation folder's image declaring 30,000 x 30,000 pixels is skipped without decoding,
  one that does not decode is skipped: named, counted under max_skipped_fraction; an evaluation
  of the split fails in one line."""
  caplog.set_level(logging.WARNING)
  _seg_folder(tmp_path)
  bomb, broken = tmp_path / "train" / "images" / "bomb.png", tmp_path / "train" / "images" / "x.png"
  bomb.write_bytes(bomb_png())
  broken.write_bytes(b"not an image")
  for name in ("bomb", "x"):  # their masks are good
    shutil.copy(
      tmp_path / "train" / "masks" / "a.png", tmp_path / "train" / "masks" / f"{name}.png"
    )
  it = input_pipeline.make_train_iterator(
    _seg_config("seg_folder", tmp_path, max_skipped_fraction=1.0), global_batch_size=6, seed=0
  )
  batch = next(it)
  it.close()
  assert it.num_skipped == 2 and batch["mask"].sum() == 4
  assert np.all(batch["label"][batch["mask"] == 0] == 255)  # no pixel of a skipped one counts
  assert (
    f"input pipeline: skipped {bomb}: it declares 900,000,000 pixels, more than "
    "dataset.max_image_pixels=100,000,000" in caplog.text
  )
  assert f"input pipeline: skipped {broken}: it could not be decoded or preprocessed" in caplog.text
  # The default limit (0.1%): the run stops once the host read its epoch of 6.
  it = input_pipeline.make_train_iterator(_seg_config("seg_folder", tmp_path), global_batch_size=6)
  with pytest.raises(bad_data.TooManySkippedError) as e:
    next(it)
  it.close()
  assert str(e.value).startswith(
    "input pipeline: 2 of the 6 examples this host read (33.33%) were skipped (1 undecodable, "
    "1 too large), more than dataset.max_skipped_fraction=0.001; the most recent: "
  )
  with pytest.raises(bad_data.IncompleteEvaluationError) as e:
    list(
      input_pipeline.make_eval_iterator(_seg_config("seg_folder", tmp_path), global_batch_size=6)
    )
  assert str(e.value).startswith(
    "evaluation of split 'train' read 4 of the 6 examples of this host: 2 skipped (1 "
    "undecodable, 1 too large); the most recent: "
  )


def test_an_unreadable_segmentation_mask_is_read_again_then_one_line(tmp_path, caplog):
  _seg_folder(tmp_path)
  mask = tmp_path / "train" / "masks" / "c.png"
  mask.unlink()
  mask.mkdir()  # listed as c.png's mask, unreadable
  it = input_pipeline.make_train_iterator(_seg_config("seg_folder", tmp_path), global_batch_size=4)
  with pytest.raises(bad_data.DataReadError) as e:
    next(it)
  it.close()
  assert str(e.value) == (
    f"cannot read {mask} (4 attempts): FailedPreconditionError: {mask}; Is a directory"
  )
  assert f"reading {mask} failed (attempt 3 of 4)" in caplog.text


def _seg_shards(tmp_path) -> list[str]:
  """N 8x8 examples, example i's image all grey level i, in SHARDS shards: ids 0-9, 10-19."""
  from vit_jax.input_pipeline.sources import segmentation

  examples = [
    (segmentation.encode_png(np.full((8, 8, 1), i, np.uint8)), np.zeros((8, 8), np.uint8),
     f"{i}.png", i)
    for i in range(N)
  ]  # fmt: skip
  return make_shards._write_segmentation(
    examples, N, str(tmp_path), "t", "train", SHARDS, ["bg"], 1
  )


def test_a_damaged_segmentation_shards_lost_records_are_counted_from_its_listed_count(
  tmp_path, caplog
):
  from vit_jax.input_pipeline import splits

  paths = _seg_shards(tmp_path)
  data = bytearray(open(paths[1], "rb").read())
  data[len(data) // 2] ^= 0xFF
  open(paths[1], "wb").write(bytes(data))
  read = []  # the ids of shard 1's records before the damage
  with pytest.raises(tf.errors.DataLossError):
    for record in tf.compat.v1.io.tf_record_iterator(paths[1]):
      read.append(
        tf.train.Example.FromString(record).features.feature["image/index"].int64_list.value[0]
      )
  lost = N // SHARDS - len(read)
  assert 0 < lost < N // SHARDS
  config = _seg_config("seg_shards", tmp_path, max_skipped_fraction=1.0)
  it = input_pipeline.make_train_iterator(config, global_batch_size=4, seed=0)
  batches = [next(it) for _ in range(N // 4)]  # one epoch: the listed 20 records
  masks = np.concatenate([b["mask"] for b in batches])
  ids = np.rint((np.concatenate([b["image"][:, 0, 0, 0] for b in batches]) + 1) * 127.5)
  assert sorted(ids[masks > 0].astype(int).tolist()) == sorted(list(range(N // SHARDS)) + read)
  assert it.num_skipped == lost == int(np.sum(masks == 0))
  assert it.get_state()["num_records"] == N  # the epoch kept its listed length
  it.close()
  assert f"{paths[1]} is damaged after record {len(read)} (DataLossError: " in caplog.text
  # An evaluation of a slice: its records lost with the shard are counted as lost.
  split = "train[:15]"
  in_slice = set(splits.slice_rows(split, N, split).tolist())
  missing = len(in_slice - set(range(N // SHARDS)) - set(read))
  assert missing
  with pytest.raises(bad_data.IncompleteEvaluationError) as e:
    list(input_pipeline.make_eval_iterator(config, split, global_batch_size=5))
  assert str(e.value).startswith(
    f"evaluation of split {split!r} read {15 - missing} of the 15 examples of this host: "
    f"{missing} skipped ({missing} lost in damaged files); the most recent: a record of split "
    f"{split!r} lost with its damaged shard"
  )


def test_reading_a_shard_prints_no_deprecation_notice(tmp_path):
  """TensorFlow's record iterator is deprecated and said so in five lines on every tfrecord
  run's first read; the reader calls it without its deprecation wrapper (a fresh process: the
  notice is printed once per process)."""
  path = _shards(tmp_path)[0]
  code = "import sys; from vit_jax.input_pipeline.sources import tfrecord_files as t; "
  code += "print(sum(len(c[0]) for c in t.read_chunks(sys.argv[1])))"
  out = subprocess.run(
    [sys.executable, "-c", code, path], capture_output=True, text=True, cwd=REPO, timeout=120
  )
  assert out.returncode == 0 and out.stdout.split() == [str(N // SHARDS)], out.stderr[-2000:]
  assert "deprecated" not in out.stderr, out.stderr[-2000:]
