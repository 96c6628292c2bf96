"""Per-host split, exact-once evaluation, bad data, determinism and resume of the input pipeline."""

import os

import jax
import numpy as np
import pytest

from tests.helpers import synthetic_data
from vit_jax import input_pipeline
from vit_jax.input_pipeline import bad_data

PP_TRAIN = "decode|inception_crop|flip_lr|value_range(-1, 1)"
PP_EVAL = "decode|resize_small|central_crop|value_range(-1, 1)"


def _config(data_dir, **kw):
  args = dict(
    source="tfrecord",
    name="toy",
    data_dir=str(data_dir),
    train_split="train",
    eval_split="train",
    image_size=8,
    pp_train=PP_TRAIN,
    pp_eval=PP_EVAL,
    shuffle_buffer=16,
    prefetch=1,
  )
  args.update(kw)
  return input_pipeline.dataset_config(**args)


def _id_shards(tmp_path, n, shards, **kw):
  """Shards whose label is the example id, so ids can be traced through the pipeline."""
  synthetic_data.write_shards(
    str(tmp_path), "toy-train", synthetic_data.id_records(n, **kw), shards
  )
  return _config(tmp_path, num_classes=n)


def _one_epoch(config, host, hosts, batch):
  """The ids one host trains on in its first epoch."""
  it = input_pipeline.make_train_iterator(
    config, global_batch_size=batch * hosts, seed=3, process_index=host, process_count=hosts
  )
  length = it._source.host_length(host)
  ids = []
  while len(ids) < length:
    b = next(it)
    ids.extend(b["label"][b["mask"] > 0].tolist())
  it.close()
  return ids[:length]


@pytest.mark.parametrize("shards", [4, 1])  # By file, then by example (too few files).
def test_two_hosts_train_disjoint_union_is_split(tmp_path, shards):
  n = 37
  config = _id_shards(tmp_path, n, shards)
  ids = [_one_epoch(config, h, 2, batch=4) for h in range(2)]
  assert not set(ids[0]) & set(ids[1])
  assert sorted(ids[0] + ids[1]) == list(range(n))


@pytest.mark.parametrize("shards", [4, 3])
def test_two_hosts_eval_each_example_once(tmp_path, shards):
  n = 29
  config = _id_shards(tmp_path, n, shards)
  seen, num_batches = [], []
  for host in range(2):
    ev = input_pipeline.make_eval_iterator(
      config, "train", global_batch_size=6, process_index=host, process_count=2
    )
    batches = list(ev)
    num_batches.append(len(batches))
    assert len(batches) == len(ev)
    for b in batches:
      assert b["image"].shape == (3, 8, 8, 3)
      seen.extend(b["label"][b["mask"] > 0].tolist())
  assert num_batches[0] == num_batches[1]  # Hosts must agree, or collectives would hang.
  assert sorted(seen) == list(range(n))


def test_eval_batch_not_dividing_split(tmp_path):
  config = _id_shards(tmp_path, 23, 2)
  ev = input_pipeline.make_eval_iterator(config, global_batch_size=5)
  batches = list(ev)
  assert len(batches) == 5 and ev.num_examples == 23
  masks = np.concatenate([b["mask"] for b in batches])
  labels = np.concatenate([b["label"] for b in batches])
  assert masks.sum() == 23 and masks[23:].sum() == 0
  assert sorted(labels[masks > 0].tolist()) == list(range(23))
  assert len(list(ev)) == 5  # Re-iterable.


def test_an_eval_batch_not_dividing_the_devices_is_rounded_up(tmp_path):
  """eval_batch_size 5 on 8 devices (a segment config's 100 on a pod host): batches of 8, the
  padding masked, every example once."""
  config = _id_shards(tmp_path, 23, 2)
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  ev = input_pipeline.make_eval_iterator(config, global_batch_size=5, mesh=mesh)
  batches = list(ev)
  assert len(batches) == 3 and {b["image"].shape[0] for b in batches} == {8}
  masks = np.concatenate([np.asarray(b["mask"]) for b in batches])
  labels = np.concatenate([np.asarray(b["label"]) for b in batches])
  assert masks.sum() == 23 and sorted(labels[masks > 0].tolist()) == list(range(23))


def test_resume_continues_exact_order(tmp_path):
  config = _id_shards(tmp_path, 20, 3)
  kw = dict(global_batch_size=6, seed=7)
  first = input_pipeline.make_train_iterator(config, **kw)
  for _ in range(4):  # Into the second epoch (20 records per epoch).
    next(first)
  state = first.get_state()
  assert state == {"num_records": 24, "num_skipped": 0, "seed": 7, "process_count": 1}
  expected = [next(first) for _ in range(6)]  # Crosses more epoch boundaries.
  resumed = input_pipeline.make_train_iterator(config, state=dict(state), **kw)
  for want in expected:
    got = next(resumed)
    np.testing.assert_array_equal(got["label"], want["label"])
    np.testing.assert_array_equal(got["image"], want["image"])  # Same augmentation too.
  with pytest.raises(ValueError, match="seed"):
    input_pipeline.make_train_iterator(config, state=state, global_batch_size=6, seed=8)


def test_seed_fixes_order_and_epochs_differ(tmp_path):
  config = _id_shards(tmp_path, 24, 3)

  def labels(seed, steps=8):
    it = input_pipeline.make_train_iterator(config, global_batch_size=6, seed=seed)
    return np.concatenate([next(it)["label"] for _ in range(steps)])

  a, b, c = labels(0), labels(0), labels(1)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  assert sorted(a[:24]) == list(range(24)) and sorted(a[24:]) == list(range(24))
  assert not np.array_equal(a[:24], a[24:])  # Each epoch is reshuffled.


def _corrupt_dataset(tmp_path):
  """12 good records, 1 undecodable image, 1 truncated file, 1 CRC-corrupt file, 1 empty file."""
  good = synthetic_data.id_records(12, fmt="jpeg")
  bad_image = synthetic_data.example(b"\xff\xd8 definitely not a jpeg", 12)
  synthetic_data.write_shards(str(tmp_path), "toy-train", good[:6] + [bad_image], 1)
  synthetic_data.write_shards(str(tmp_path), "toy-train-b", good[6:9], 1)
  synthetic_data.write_shards(str(tmp_path), "toy-train-c", good[9:], 1)
  b = tmp_path / "toy-train-b.tfrecord-00000-of-00001"
  b.write_bytes(b.read_bytes()[:-40])  # Last record truncated.
  c = tmp_path / "toy-train-c.tfrecord-00000-of-00001"
  data = bytearray(c.read_bytes())
  data[30] ^= 0xFF  # Inside the first record's data: its CRC no longer matches.
  c.write_bytes(bytes(data))
  (tmp_path / "toy-train-d.tfrecord").write_bytes(b"")
  return _config(tmp_path, num_classes=13, file_pattern="{name}-{split}*")


def test_corrupt_records_fail_an_evaluation_in_one_line(tmp_path):
  """An evaluation needs every example: 8 read (6 of file a, 2 before the truncation of b; c
  fails at its first record), 4 skipped (the undecodable image, one placeholder per damaged or
  empty file: no dataset_info.json gives their counts)."""
  config = _corrupt_dataset(tmp_path)
  ev = input_pipeline.make_eval_iterator(config, global_batch_size=4)
  assert ev.num_examples == 8 + 1 + 3
  with pytest.raises(
    bad_data.IncompleteEvaluationError,
    match=r"^evaluation of split 'train' read 8 of the 12 examples of this host: 4 skipped "
    r"\(1 undecodable, 3 lost in damaged files\); the most recent: .*toy-train.tfrecord-00000-of-00001 "
    r"record 6, which could not be decoded or preprocessed; an evaluation needs every example",
  ) as e:
    list(ev)
  assert "\n" not in str(e.value)


def test_corrupt_records_skipped_and_counted_train(tmp_path):
  config = _corrupt_dataset(tmp_path)
  it = input_pipeline.make_train_iterator(config, global_batch_size=6, seed=0)
  masks = np.concatenate([next(it)["mask"] for _ in range(4)])  # Two epochs of 12 records.
  assert it.num_skipped == 8 == int((masks == 0).sum())
  assert it.get_state()["num_skipped"] == 8


def test_bad_label_names_file_and_record(tmp_path):
  records = synthetic_data.id_records(5)
  records[3] = synthetic_data.example(synthetic_data.encode(np.zeros((8, 8, 3), np.uint8)), 99)
  synthetic_data.write_shards(str(tmp_path), "toy-train", records, 1)
  config = _config(tmp_path, num_classes=5)
  with pytest.raises(
    ValueError, match=r"label 99 outside \[0, 5\) in .*toy-train.tfrecord-00000-of-00001 record 3"
  ):
    list(input_pipeline.make_eval_iterator(config, global_batch_size=2))
  it = input_pipeline.make_train_iterator(config, global_batch_size=2)
  with pytest.raises(ValueError, match="label 99 outside"):
    for _ in range(5):
      next(it)


def test_multiple_labels_in_single_label_data_is_an_error(tmp_path):
  synthetic_data.write_shards(
    str(tmp_path), "toy-train", synthetic_data.id_records(3, labels_fn=lambda i: [0, 1]), 1
  )
  config = _config(tmp_path, num_classes=3)
  with pytest.raises(ValueError, match="2 labels .*multi_label"):
    list(input_pipeline.make_eval_iterator(config, global_batch_size=2))


def test_empty_glob_names_pattern(tmp_path):
  config = _config(tmp_path, num_classes=3)
  pattern = os.path.join(str(tmp_path), "toy-train.tfrecord*")
  with pytest.raises(ValueError, match="No TFRecord files match .*" + "toy-train"):
    input_pipeline.make_train_iterator(config, global_batch_size=2)
  with pytest.raises(ValueError, match="nowhere"):
    input_pipeline.make_eval_iterator(
      config, split=str(tmp_path / "nowhere-*"), global_batch_size=2
    )
  del pattern


def test_global_arrays_on_mesh(tmp_path):
  config = _id_shards(tmp_path, 40, 4)
  devices = np.array(jax.devices()).reshape(4, 2)
  mesh = jax.sharding.Mesh(devices, ("data", "fsdp"))
  it = input_pipeline.make_train_iterator(
    config, global_batch_size=16, mesh=mesh, data_axes=("data", "fsdp")
  )
  batch = next(it)
  assert isinstance(batch["image"], jax.Array) and batch["image"].shape == (16, 8, 8, 3)
  assert batch["image"].sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
  assert len(batch["label"].addressable_shards) == 8
  assert batch["label"].addressable_shards[0].data.shape == (2,)
  ev = input_pipeline.make_eval_iterator(config, global_batch_size=16, mesh=mesh, data_axes="data")
  assert float(sum(b["mask"].sum() for b in ev)) == 40.0
  with pytest.raises(ValueError, match="not axes of the mesh"):
    next(input_pipeline.make_train_iterator(config, global_batch_size=16, mesh=mesh, data_axes="x"))


def test_mixup_is_left_to_the_trainer(tmp_path):
  """With mixup on, the pipeline's batches are the plain ones: the trainer mixes the global
  batch on device (vit_jax.train.mixup), where every example's partner is the one before it."""
  config = _id_shards(tmp_path, 16, 2)
  config.num_classes = 16
  plain = next(input_pipeline.make_train_iterator(config, global_batch_size=8))
  config.mixup_alpha = 0.4
  batch = next(input_pipeline.make_train_iterator(config, global_batch_size=8))
  for k in plain:
    np.testing.assert_array_equal(batch[k], plain[k])


def test_batch_size_must_split_over_hosts(tmp_path):
  config = _id_shards(tmp_path, 8, 2)
  with pytest.raises(ValueError, match="multiple of the number of hosts"):
    input_pipeline.make_train_iterator(
      config, global_batch_size=5, process_index=0, process_count=2
    )


def test_close_returns_before_the_iterator_is_released_and_the_exit_waits_for_it(monkeypatch):
  """Freeing a tf.data iterator can block for seconds (its autotuning thread); closing the
  prefetcher hands that to a thread of its own, and `wait_for_releases` (run at exit) waits for
  it. A generator whose cleanup blocks until told stands in for the iterator."""
  import threading

  from vit_jax.input_pipeline import pipeline

  # The releases of iterators that earlier tests closed are left to the exit, not waited for here.
  monkeypatch.setattr(pipeline, "_releases", [])
  proceed, released = threading.Event(), threading.Event()

  def items():
    try:
      yield from range(100)
    finally:
      proceed.wait(timeout=10)
      released.set()

  prefetcher = pipeline._Prefetcher(items(), size=2)
  assert [prefetcher.get() for _ in range(3)] == [0, 1, 2]
  prefetcher.close()  # would block until `proceed` if it freed the iterator itself
  assert not released.is_set()
  proceed.set()
  pipeline.wait_for_releases()
  assert released.is_set()
