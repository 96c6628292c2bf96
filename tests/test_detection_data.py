"""Detection data: the synthetic canvases (deterministic, boxes tight around their objects), a
COCO folder and its shards giving the same examples, boxes moved with their image, the rules on
bad annotations (skipped, one line each, counted and held to the limit), `size`, slices."""

import json
import logging as std_logging
import os

import jax
import numpy as np
import pytest
from PIL import Image

from vit_jax import input_pipeline
from vit_jax.input_pipeline import bad_data
from vit_jax.input_pipeline.ops import detection as detection_ops
from vit_jax.input_pipeline.sources import builtin
from vit_jax.input_pipeline.sources import detection_synthetic as synthetic
from vit_jax.tools import make_folder, make_shards

BRIGHT = 96 / 127.5 - 1.0  # a canvas pixel >= 96, as the pipeline's image in [-1, 1] holds it


def _tight_box(bright: np.ndarray) -> tuple[int, int, int, int]:
  """(ymin, xmin, ymax, xmax), ends exclusive, of the True pixels of bright [h, w]."""
  ys, xs = np.flatnonzero(bright.any(1)), np.flatnonzero(bright.any(0))
  return ys[0], xs[0], ys[-1] + 1, xs[-1] + 1


def test_synthetic_canvases_are_deterministic_and_boxes_tight():
  objects, labels = builtin.load("mnist_5k").splits["test"]
  first = synthetic.make_synthetic(objects, labels, 300, seed=5)
  again = synthetic.make_synthetic(objects, labels, 300, seed=5)
  np.testing.assert_array_equal(first[0], again[0])
  for a, b in zip(first[1], again[1], strict=True):
    np.testing.assert_array_equal(a, b)
  images, rows = first
  assert images.shape == (300, synthetic.CANVAS, synthetic.CANVAS, 1)
  counts = [len(r) for r in rows]
  assert min(counts) == 1 and max(counts) == synthetic.MAX_OBJECTS
  boxes = np.concatenate(rows)
  heights, widths = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
  assert (heights > 0).all() and (widths > 0).all() and heights.max() <= synthetic.MAX_SIZE
  assert (boxes[:, :4] >= 0).all() and (boxes[:, :4] <= synthetic.CANVAS).all()
  assert set(boxes[:, 4].astype(int)) == set(range(10))
  np.testing.assert_array_equal(boxes[:, 7], boxes[:, 4] + 1)
  np.testing.assert_array_equal(boxes[:, 6], np.arange(1, len(boxes) + 1))  # annotation ids
  # The background stays under 96: a canvas of one object has exactly its pixels >= 96.
  for image, row in zip(images, rows, strict=True):
    if len(row) == 1:
      assert _tight_box(image[..., 0] >= 96) == tuple(row[0, :4])
  overlapping = 0
  for row in rows:  # some objects overlap or touch
    for i in range(len(row)):
      for j in range(i):
        a, b = row[i], row[j]
        overlapping += min(a[2], b[2]) >= max(a[0], b[0]) and min(a[3], b[3]) >= max(a[1], b[1])
  assert overlapping > 10
  # The task's splits: made once per process from GENERATOR_SEED, sized as documented.
  val = synthetic.synthetic_split("mnist_det", "val")
  assert len(val.images) == synthetic.SPLIT_SIZES["val"] and val.names[3] == "val/3"
  synthetic.synthetic_split.cache_clear()
  remade = synthetic.synthetic_split("mnist_det", "val")
  np.testing.assert_array_equal(val.images, remade.images)
  assert all(np.array_equal(a, b) for a, b in zip(val.objects, remade.objects, strict=True))


CLASSES = ["cat", "dog", "bird"]  # category ids 3, 7, 9: classes 0, 1, 2


def _write_coco(root, split="train", images=None, annotations=None):
  """A COCO folder split of varied images (RGB and grey PNGs, a JPEG, different sizes), some
  boxes with fractional pixels, one crowd, one image without annotations."""
  rng = np.random.default_rng(0)
  os.makedirs(root / split)
  if images is None:
    images = []
    for i in range(6):
      h, w = 30 + 4 * i, 48 - 3 * i
      name = f"im{i}.{'jpg' if i == 4 else 'png'}"
      pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
      Image.fromarray(pixels[..., 0] if i == 2 else pixels).save(root / split / name)
      images.append({"id": 10 + i, "file_name": name, "height": h, "width": w})
  else:
    for im in images:
      pixels = rng.integers(0, 256, (im["height"], im["width"], 3), dtype=np.uint8)
      Image.fromarray(pixels).save(root / split / im["file_name"])
  if annotations is None:
    annotations, next_id = [], 100
    for im in images[:-1]:  # the last image: no boxes
      for k in range(1 + im["id"] % 3):
        box = [2.5 + k, 3.0 + 2 * k, 10.25, 7.5 + k]
        cat = [3, 7, 9][(im["id"] + k) % 3]
        crowd = int(im["id"] == 11 and k == 1)
        annotations.append(
          dict(id=next_id, image_id=im["id"], category_id=cat, bbox=box, iscrowd=crowd, area=1)
        )
        next_id += 1
  categories = [
    {"id": c, "name": n} for c, n in zip([9, 3, 7], ["bird", "cat", "dog"], strict=True)
  ]
  coco = {"images": images, "annotations": annotations, "categories": categories}
  (root / split / "instances.json").write_text(json.dumps(coco))
  return coco


def _config(source, data_dir="", **kw):
  kw = {**dict(image_size=32, pp_train="", pp_eval="", max_boxes=5), **kw}
  return input_pipeline.dataset_config(source=source, data_dir=str(data_dir), **kw)


def _examples(config, split, **kw):
  """(images, labels, sizes) of every example of `split` through the eval iterator, sorted by
  their bytes (two sources of the same examples give equal arrays)."""
  out = {"image": [], "label": [], "size": []}
  for batch in input_pipeline.make_eval_iterator(config, split, global_batch_size=4, **kw):
    keep = np.asarray(batch["mask"]) > 0
    for k in out:
      out[k] += list(np.asarray(batch[k])[keep])
  order = sorted(range(len(out["image"])), key=lambda i: out["image"][i].tobytes())
  return tuple(np.stack([out[k][i] for i in order]) for k in out)


def test_coco_folder_and_its_shards_give_the_same_examples(tmp_path):
  root, out = tmp_path / "pets", tmp_path / "shards"
  coco = _write_coco(root)
  make_shards.shard_det_folder(str(root), "train", str(out), num_shards=2)
  info = json.loads((out / "dataset_info.json").read_text())
  assert info["task"] == "detection" and info["class_names"] == CLASSES
  folder, shards = _config("det_folder", root), _config("det_shards", out)
  for config in (folder, shards):
    got = input_pipeline.get_dataset_info(config)
    assert got.num_classes == 3 and got.class_names == CLASSES

  images, labels, sizes = _examples(folder, "train")
  for want, got in zip((images, labels, sizes), _examples(shards, "train"), strict=True):
    assert want.dtype == got.dtype
    np.testing.assert_array_equal(want, got)
  assert images.shape == (6, 32, 32, 3) and labels.shape == (6, 5, 6)
  assert labels.dtype == np.float32 and sizes.dtype == np.int32
  # Each example's size is its original image's; its labels its annotations', normalized.
  by_id = {im["id"]: im for im in coco["images"]}
  want = {}
  for im in coco["images"]:
    rows = np.zeros((5, 6), np.float32)
    rows[:, 4] = -1
    anns = [a for a in coco["annotations"] if a["image_id"] == im["id"]]
    for r, a in enumerate(anns):
      x, y, w, h = a["bbox"]
      hw = by_id[a["image_id"]]["height"], by_id[a["image_id"]]["width"]
      rows[r] = (y / hw[0], x / hw[1], (y + h) / hw[0], (x + w) / hw[1], 0, a["iscrowd"])
      rows[r, 4] = {3: 0, 7: 1, 9: 2}[a["category_id"]]
    want[(im["height"], im["width"])] = rows
  assert {tuple(s) for s in sizes} == set(want)
  for size, label in zip(sizes, labels, strict=True):
    np.testing.assert_allclose(label, want[tuple(size)], atol=1e-6)
  assert labels[..., 5].sum() == 1  # the crowd box

  # A training epoch (the indexed folder's seeded order, the shards' shuffled one): the same
  # examples; and `size` with a mesh too.
  for config in (folder, shards):
    it = input_pipeline.make_train_iterator(config, global_batch_size=6, seed=3)
    batch = next(it)
    it.close()
    assert set(batch) == {"image", "label", "mask", "size"}
    order = sorted(range(6), key=lambda i: batch["image"][i].tobytes())
    np.testing.assert_array_equal(batch["label"][order], labels)
    np.testing.assert_array_equal(batch["size"][order], sizes)
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  on_mesh = _examples(shards, "train", mesh=mesh)
  np.testing.assert_array_equal(on_mesh[2], sizes)

  # Slices: the same examples from the folder and from the shards (by written position).
  for split in ("train[:4]", "train[2:]"):
    a, b = _examples(folder, split), _examples(shards, split)
    assert len(a[0]) == 4
    for x, y in zip(a, b, strict=True):
      np.testing.assert_array_equal(x, y)
  sliced = _config("det_folder", root, train_split="train[:4]", eval_split="train[4:]")
  assert input_pipeline.get_dataset_info(sliced).num_examples == {"train[:4]": 4, "train[4:]": 2}


def test_flip_moves_the_boxes_with_the_pixels():
  """Through the pipeline at the canvases' size (no resampling): a single object's box is the
  tight box of the output image's bright pixels, flipped or not; about half are flipped."""
  kw = dict(name="mnist_det", image_size=synthetic.CANVAS, max_boxes=4)
  config = _config("det_builtin", pp_train="flip_lr", train_split="val[:64]", **kw)
  it = input_pipeline.make_train_iterator(config, global_batch_size=64, seed=1)
  batch = next(it)
  it.close()
  plain = _examples(_config("det_builtin", **kw), "val[:64]")[0]
  plain = {im.tobytes() for im in plain}
  flipped, singles = 0, 0
  for image, label in zip(batch["image"], batch["label"], strict=True):
    flipped += image.tobytes() not in plain
    boxes = label[label[:, 4] >= 0]
    if len(boxes) == 1:
      singles += 1
      bright = image[..., 0] >= BRIGHT - 1e-6
      want = np.array(_tight_box(bright)) / synthetic.CANVAS
      np.testing.assert_allclose(boxes[0, :4], want, atol=1e-6)
  assert singles >= 5 and 16 <= flipped <= 48


def test_scale_jitter_keeps_boxes_on_their_objects():
  """A white rectangle on black: after the jitter its box bounds its pixels (to a pixel's
  resampling); a box left with under half its area is dropped."""
  image = np.zeros((40, 60, 3), np.uint8)
  image[10:30, 20:50] = 255
  objects = np.array([[10, 20, 30, 50, 1, 0, 1, 2]], np.float64)
  for seed in range(20):
    out, moved = detection_ops.scale_jitter(image, objects, np.random.default_rng(seed), 48)
    assert out.shape == (48, 48, 3)
    if len(moved):
      np.testing.assert_allclose(moved[0, :4], _tight_box(out[..., 0] > 128), atol=1.5)
  # At twice the size (64x96), a 6x8 box in the corner (9.6x12.8 once scaled) is kept in the
  # windows that hold half of it or more, dropped from the others.
  corner = np.array([[0, 0, 6, 8, 0, 0, 2, 1]], np.float64)
  kept = 0
  for seed in range(300):
    rng = np.random.default_rng(seed)
    _, moved = detection_ops.scale_jitter(image, corner, rng, 48, 2.0, 2.0)
    rng = np.random.default_rng(seed)
    rng.uniform()
    y0, x0 = rng.integers(0, 64 - 48 + 1), rng.integers(0, 96 - 48 + 1)
    visible = max(0, 9.6 - y0) * max(0, 12.8 - x0)
    assert len(moved) == (visible >= 0.5 * 9.6 * 12.8)
    kept += len(moved)
  assert 0 < kept < 300


BAD = {  # annotation of image 'b.png' (id 7, 64x64) → the line naming its problem
  "outside": (
    dict(bbox=[60, 3, 10, 5], category_id=3),
    "annotation 12: box [x=60, y=3, w=10, h=5] outside the 64x64 image",
  ),
  "degenerate": (
    dict(bbox=[20, 30, 0, 5], category_id=3),
    "annotation 12: degenerate box [x=20, y=30, w=0, h=5] (width or height <= 0 within the "
    "64x64 image)",
  ),
  "unknown class": (
    dict(bbox=[20, 30, 4, 5], category_id=5),
    "annotation 12: category_id 5 is not among the 3 categories",
  ),
  "too many boxes": (None, "6 boxes, more than dataset.max_boxes=5"),
}


def _bad_folder(root, kind):
  images = [
    {"id": i, "file_name": f"{n}.png", "height": 64, "width": 64} for i, n in [(3, "a"), (7, "b")]
  ]
  images += [{"id": 20 + i, "file_name": f"c{i}.png", "height": 64, "width": 64} for i in range(6)]
  good = dict(bbox=[10, 10, 20, 20], category_id=7, iscrowd=0, area=400)
  # Corners within a pixel outside the image are clipped, not bad.
  annotations = [dict(good, id=1, image_id=3, bbox=[-0.5, 44, 30, 20.9])]
  bad, _ = BAD[kind]
  if bad is None:
    annotations += [dict(good, id=12 + k, image_id=7) for k in range(6)]
  else:
    annotations += [dict(good, id=11, image_id=7), dict(good, id=12, image_id=7, **bad)]
  _write_coco(root, images=images, annotations=annotations)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_annotation_is_skipped_in_one_line(tmp_path, caplog, kind):
  _bad_folder(tmp_path, kind)
  config = _config("det_folder", tmp_path, max_skipped_fraction=0.2)
  caplog.set_level(std_logging.WARNING)
  it = input_pipeline.make_train_iterator(config, global_batch_size=8, seed=0)
  batch = next(it)
  it.close()
  json_path = os.path.join(tmp_path, "train", "instances.json")
  lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
  assert lines == [f"input pipeline: skipped {json_path} image 'b.png' (id 7): {BAD[kind][1]}"]
  assert it.num_skipped == 1 and batch["mask"].sum() == 7
  boxes = batch["label"][batch["mask"] > 0]
  boxes = boxes[boxes[:, :, 4] >= 0]
  assert boxes[:, :4].min() == 0 and boxes[:, :4].max() == 1  # within tolerance: clipped

  # Held to the limit (one in eight is more than 0.1), and an evaluation needs every example.
  config = _config("det_folder", tmp_path, max_skipped_fraction=0.1)
  it = input_pipeline.make_train_iterator(config, global_batch_size=8, seed=0)
  with pytest.raises(bad_data.TooManySkippedError, match="1 with bad annotations.*'b.png'"):
    next(it)
  it.close()
  with pytest.raises(bad_data.IncompleteEvaluationError, match="bad annotation"):
    list(input_pipeline.make_eval_iterator(config, "train", global_batch_size=8))


def test_make_folder_writes_the_task_as_a_coco_folder(tmp_path):
  make_folder.write_detection("fashion_mnist_det", str(tmp_path), ["test"], max_examples=5)
  coco = json.loads((tmp_path / "test" / "instances.json").read_text())
  assert [c["id"] for c in coco["categories"]] == list(range(1, 11))
  assert len(coco["images"]) == 5 and all(a["iscrowd"] == 0 for a in coco["annotations"])
  assert all(a["area"] == a["bbox"][2] * a["bbox"][3] for a in coco["annotations"])
  # Read back as a det_folder at the canvases' size: the canvases and their boxes.
  config = _config("det_folder", tmp_path, image_size=synthetic.CANVAS, max_boxes=4)
  data = synthetic.synthetic_split("fashion_mnist_det", "test")
  images, labels, sizes = _examples(config, "test")
  want = {}
  for im in coco["images"]:
    rows = np.zeros((4, 6), np.float32)
    rows[:, 4] = -1
    objects = data.objects[im["id"]]
    rows[: len(objects), :4] = objects[:, :4] / synthetic.CANVAS
    rows[: len(objects), 4] = objects[:, 4]
    want[data.images[im["id"]].tobytes()] = rows
  for image, label in zip(images, labels, strict=True):
    pixels = np.round((image[..., 0] + 1) * 127.5).astype(np.uint8)[..., None]
    np.testing.assert_array_equal(label, want[pixels.tobytes()])
  assert len(images) == 5 and (sizes == synthetic.CANVAS).all()


def test_synthetic_shards_hold_the_tasks_examples(tmp_path):
  make_shards.shard_det_builtin("mnist_det", "val", str(tmp_path), num_shards=2)
  kw = dict(name="mnist_det", image_size=synthetic.CANVAS, max_boxes=4)
  canvases, shards = _config("det_builtin", **kw), _config("det_shards", tmp_path, **kw)
  info = input_pipeline.get_dataset_info(shards)
  assert info.class_names == synthetic.synthetic_class_names("mnist_det")
  assert info.num_classes == 10
  for a, b in zip(_examples(canvases, "val[:9]"), _examples(shards, "val[:9]"), strict=True):
    np.testing.assert_array_equal(a, b)
