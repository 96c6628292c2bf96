"""The detection evaluator and its COCO helpers: pixel boxes are the float64 formula, AP matches
a hand derivation and an independent numpy COCO AP, crowd boxes and masked rows do not count."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import evaluators
from vit_jax.evaluators import detection

S = 64.0  # side of the hand-made images: box corners in 1/256ths of it are exact in float32


class _Detector(nn.Module):
  """Reads its detections off the image [B, D, 6, 3]: channel 0 of row d is detection d's
  (ymin, xmin, ymax, xmax, score, class)."""

  @nn.compact
  def __call__(self, images, train=False):
    rows = images[..., 0]
    detections = {
      "boxes": rows[..., :4],
      "scores": rows[..., 4],
      "classes": jnp.round(rows[..., 5]).astype(jnp.int32),
    }
    return jnp.zeros((images.shape[0], 2)), {"detections": detections}


def _fn():
  return evaluators.output_fn(_Detector(), "detections")


def _images(dets):
  """[N, D, 6, 3] images carrying `dets` [N, D, 6] (see _Detector)."""
  return np.repeat(np.asarray(dets, np.float32)[..., None], 3, axis=-1)


def _source(dets, labels, sizes, batch_size, pad_with=None, sharding=None):
  """Batches of the images; the last one filled with copies of image 0 whose mask is 0 (or, with
  `pad_with`, a mask-0 row is put after every real one)."""
  dets, labels, sizes = (np.asarray(x) for x in (dets, labels, sizes))
  n = len(dets)
  mask = np.ones(n, np.float32)
  if pad_with is not None:  # a skipped row after each real one, carrying real-looking data
    order = np.repeat(np.arange(n), 2)
    dets, labels, sizes = dets[order], labels[order], sizes[order]
    mask = np.tile([1.0, 0.0], n).astype(np.float32)
    dets[1::2], labels[1::2] = pad_with
  fill = -len(dets) % batch_size
  idx = np.concatenate([np.arange(len(dets)), np.zeros(fill, int)])
  mask = np.concatenate([mask, np.zeros(fill, np.float32)])

  def source():
    for s in range(0, len(idx), batch_size):
      i = idx[s : s + batch_size]
      batch = {
        "image": _images(dets[i]),
        "label": labels[i].astype(np.float32),
        "size": sizes[i].astype(np.int32),
        "mask": mask[s : s + batch_size],
      }
      if sharding is not None:
        batch = {k: jax.device_put(v, sharding) for k, v in batch.items()}
      yield batch

  return source


def _evaluate(dets, labels, sizes, num_classes=1, batch_size=4, **kwargs):
  ev = detection.DetectionEvaluator(
    _fn(), _source(dets, labels, sizes, batch_size, **kwargs), num_classes, name="det"
  )
  return ev.run({})


def _row(box, cls=0, crowd=0.0):
  return [*(np.asarray(box, np.float64) / S), cls, crowd]


def _random_case(seed, n=12, num_classes=3, crowd=True):
  """Images of random sizes with up to 6 boxes each (all three COCO sizes, some crowd), and 8
  detections each: jittered copies of most boxes, some with the wrong class, and strays."""
  rng = np.random.default_rng(seed)
  sizes = np.stack([rng.integers(200, 640, n), rng.integers(200, 640, n)], 1)
  labels = np.full((n, 6, 6), -1.0)
  dets = np.zeros((n, 8, 6))
  for i in range(n):
    m = rng.integers(1, 7)
    side = rng.choice([0.04, 0.12, 0.4], m) * rng.uniform(0.7, 1.3, m)  # small, medium, large
    y, x = rng.uniform(0, 1 - side, (2, m))
    boxes = np.stack([y, x, y + side, x + side], 1)
    labels[i, :m, :4] = boxes
    labels[i, :m, 4] = rng.integers(num_classes, size=m)
    labels[i, :m, 5] = (rng.uniform(size=m) < 0.15) if crowd else 0
    found = min(m, 6)
    dets[i, :found, :4] = boxes[:found] + rng.normal(0, 0.1, (found, 4)) * side[:found, None]
    wrong = rng.uniform(size=found) < 0.1
    dets[i, :found, 5] = np.where(
      wrong, (labels[i, :found, 4] + 1) % num_classes, labels[i, :found, 4]
    )
    y, x = rng.uniform(0, 0.8, (2, 8 - found))
    dets[i, found:, :4] = np.stack([y, x, y + 0.1, x + 0.15], 1)
    dets[i, found:, 5] = rng.integers(num_classes, size=8 - found)
    dets[i, :, 4] = rng.uniform(0.05, 1.0, 8)
  dets[rng.uniform(size=(n, 8)) < 0.1, 4] = 0.0  # no detection there
  return dets.astype(np.float32), labels.astype(np.float32), sizes


def test_to_coco_bbox_is_the_float64_formula():
  rng = np.random.default_rng(0)
  boxes = np.sort(rng.uniform(size=(3, 5, 4)).astype(np.float32), -1)
  sizes = rng.integers(1, 2000, (3, 2))
  got = detection.to_coco_bbox(boxes, sizes[:, 0, None], sizes[:, 1, None])
  assert got.dtype == np.float64 and got.shape == (3, 5, 4)
  for i in range(3):
    h, w = float(sizes[i, 0]), float(sizes[i, 1])
    for d in range(5):
      ymin, xmin, ymax, xmax = (float(v) for v in boxes[i, d])  # float32 -> Python float64
      want = [xmin * w, ymin * h, (xmax - xmin) * w, (ymax - ymin) * h]
      assert got[i, d].tolist() == want  # bit for bit


def test_coco_results_skips_empty_slots_and_maps_categories():
  boxes = np.array([[[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 1.0, 1.0]]], np.float32)
  scores = np.array([[0.7, 0.0]], np.float32)
  classes = np.array([[1, 0]], np.int32)
  (res,) = detection.coco_results([42], (boxes, scores, classes), [[100, 200]], [5, 9])
  assert res["image_id"] == 42 and res["category_id"] == 9
  assert res["score"] == float(np.float32(0.7))
  assert res["bbox"] == detection.to_coco_bbox(boxes[0, 0], 100, 200).tolist()
  assert detection.coco_results([0], (boxes, scores, classes), [[1, 1]])[0]["category_id"] == 2
  with pytest.raises(ValueError, match="class 1 has no category"):
    detection.coco_results([0], (boxes, scores, classes), [[1, 1]], [5])


def test_perfect_detections_score_one():
  dets, labels, sizes = _random_case(1, crowd=False)
  dets[...] = 0.0
  for i in range(len(dets)):
    real = labels[i, labels[i, :, 4] >= 0]
    dets[i, : len(real), :4], dets[i, : len(real), 5] = real[:, :4], real[:, 4]
    dets[i, : len(real), 4] = 0.5
  got = _evaluate(dets, labels, sizes, num_classes=3)
  assert {f"det/{k}" for k in detection.METRICS} <= set(got)  # every size has boxes here
  for k in detection.METRICS:
    assert got[f"det/{k}"] == 1.0
  assert got["det/num_images"] == len(dets) and got["det/num_boxes"] == (labels[..., 4] >= 0).sum()


def test_hand_made_case():
  # One class, two 64x64 images, a 10x10 box in each (area 100: small); detections by score:
  #   d1 0.9  image 0, height 8.25 on its box: IoU 82.5 / 100 = 0.825
  #   fp 0.8  image 0, far from any box: a false positive at every IoU threshold t
  #   d2 0.7  image 1, height 6.25 on its box: IoU 0.625
  # COCO: 2 boxes; at each t the ranked list's precision p (made non-increasing from the right)
  # read at the 101 recalls r = 0, 0.01, .., 1 at the first rank whose recall reaches r (0 if
  # none does), averaged:
  #   t in 0.5, 0.55, 0.6: TP FP TP, recall .5 .5 1, p 1 1/2 2/3 -> 1 2/3 2/3;
  #     r <= 0.5 (51 points) read 1, r > 0.5 (50) read 2/3: AP_t = (51 + 100/3) / 101 = 253/303
  #   t in 0.65 .. 0.8 (4): TP FP FP, recall stays .5: 51 points read 1, the rest 0: 51/101
  #   t in 0.85 .. 0.95 (3): no TP: 0
  # AP = (3 * 253/303 + 4 * 51/101) / 10 = 457/1010; AP50 = 253/303; AP75 = 51/101;
  # APs = AP (every box small); no medium or large box: APm and APl are left out.
  box = _row([0, 0, 10, 10])
  labels = [[box], [box]]
  sizes = [[64, 64], [64, 64]]
  dets = [
    [[*_row([0, 0, 8.25, 10])[:4], 0.9, 0], [*_row([40, 40, 50, 50])[:4], 0.8, 0]],
    [[*_row([0, 0, 6.25, 10])[:4], 0.7, 0], [0, 0, 0, 0, 0, 0]],
  ]
  got = _evaluate(dets, labels, sizes)
  want = {"AP": 457 / 1010, "AP50": 253 / 303, "AP75": 51 / 101, "APs": 457 / 1010}
  assert set(got) == {f"det/{k}" for k in want} | {"det/num_images", "det/num_boxes"}
  for k, v in want.items():
    assert got[f"det/{k}"] == pytest.approx(v, abs=1e-12)
  assert got["det/num_images"] == 2 and got["det/num_boxes"] == 2


@pytest.mark.parametrize(
  ("crowd", "on_crowd", "want"),
  [
    (1.0, True, 1.0),  # the detection on the crowd box is no false positive
    (1.0, False, 1.0),  # the crowd box is not missed
    (1.0, "away", 0.5),  # control: the same detection elsewhere is a false positive (FP, TP)
    (0.0, False, 51 / 101),  # control: an ordinary box left unfound halves recall
  ],
)
def test_crowd_boxes_are_neither_found_nor_missed(crowd, on_crowd, want):
  labels = [[_row([0, 0, 30, 30], crowd=crowd), _row([40, 40, 50, 50])]]
  dets = [[[*_row([40, 40, 50, 50])[:4], 0.8, 0], [0] * 6]]
  if on_crowd:
    where = [2, 2, 28, 28] if on_crowd is True else [10, 35, 30, 55]
    dets[0][1] = [*_row(where)[:4], 0.9, 0]
  got = _evaluate(dets, labels, [[64, 64]])
  assert got["det/AP"] == pytest.approx(want, abs=1e-12)


def test_masked_rows_never_count():
  dets, labels, sizes = _random_case(2)
  want = _evaluate(dets, labels, sizes, num_classes=3, batch_size=5)
  # Skipped rows carry image 0's boxes and eight confident detections elsewhere: counted, they
  # would be missed boxes and false positives.
  pad = (dets[0] * 0 + np.array([0.1, 0.1, 0.6, 0.6, 0.99, 1]), labels[0])
  got = _evaluate(dets, labels, sizes, num_classes=3, batch_size=5, pad_with=pad)
  assert got == want
  assert got["det/num_images"] == len(dets)
  assert 0.1 < want["det/AP"] < 0.95


def _coco_dicts(dets, labels, sizes, num_classes):
  """The COCO ground-truth dict and results of images 0..N-1, written out here."""
  images, anns, results = [], [], []
  for i, (h, w) in enumerate(np.asarray(sizes)):
    images.append({"id": i, "height": int(h), "width": int(w)})
    for row in labels[i]:
      if row[4] >= 0:
        bbox = detection.to_coco_bbox(row[:4], h, w).tolist()
        anns.append(
          dict(id=len(anns) + 1, image_id=i, category_id=int(row[4]) + 1, bbox=bbox)
          | dict(area=bbox[2] * bbox[3], iscrowd=int(row[5]))
        )
    for d in dets[i]:
      if d[4] > 0:
        bbox = detection.to_coco_bbox(d[:4], h, w).tolist()
        results.append(dict(image_id=i, category_id=int(d[5]) + 1, bbox=bbox, score=float(d[4])))
  cats = [{"id": k + 1, "name": str(k)} for k in range(num_classes)]
  return {"images": images, "annotations": anns, "categories": cats}, results


@pytest.mark.parametrize("sharded", [False, True])
def test_evaluator_is_coco_metrics_of_its_dicts(sharded):
  dets, labels, sizes = _random_case(3, n=21)
  sharding = None
  if sharded:  # global arrays split over the test's eight devices
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  got = _evaluate(dets, labels, sizes, num_classes=3, batch_size=8, sharding=sharding)
  gt, results = _coco_dicts(dets, labels, sizes, 3)
  want = detection.coco_metrics(gt, results)
  assert got == {f"det/{k}": v for k, v in want.items()} | {
    "det/num_images": 21.0,
    "det/num_boxes": float(len(gt["annotations"])),
  }
  assert set(want) == set(detection.METRICS)


def _reference_ap(gt, results, thresholds):
  """COCO box AP over `thresholds` (all areas, at most 100 detections per image and class), for
  ground truth without crowd boxes, written with numpy in float64 from the protocol: per image and
  class, detections by descending score each take the unmatched box of highest IoU >= t; then,
  per class, the ranked detections' precision, made non-increasing, is read at recalls 0:0.01:1."""

  def iou(a, b):  # [x, y, w, h]
    ix = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)

  recalls = np.linspace(0, 1, 101)
  aps = []
  for t in thresholds:
    per_class = []
    for c in sorted({a["category_id"] for a in gt["annotations"]}):
      scored = []  # (score, is TP)
      for img in gt["images"]:
        boxes = [
          a["bbox"]
          for a in gt["annotations"]
          if (a["image_id"], a["category_id"]) == (img["id"], c)
        ]
        ds = [r for r in results if (r["image_id"], r["category_id"]) == (img["id"], c)]
        ds = sorted(ds, key=lambda r: -r["score"])[:100]
        taken = [False] * len(boxes)
        for r in ds:
          best, best_iou = -1, min(t, 1 - 1e-10)
          for g, b in enumerate(boxes):
            v = iou(r["bbox"], b)
            if not taken[g] and v >= best_iou:
              best, best_iou = g, v
          if best >= 0:
            taken[best] = True
          scored.append((r["score"], best >= 0))
      total = sum(a["category_id"] == c for a in gt["annotations"])
      scored.sort(key=lambda s: -s[0])
      tp = np.cumsum([s[1] for s in scored], dtype=np.float64)
      precision = tp / np.arange(1, len(tp) + 1)
      precision = np.maximum.accumulate(precision[::-1])[::-1] if len(tp) else precision
      rank = np.searchsorted(tp / total, recalls, side="left")
      per_class.append(np.mean([precision[k] if k < len(tp) else 0.0 for k in rank]))
    aps.append(np.mean(per_class))
  return float(np.mean(aps))


def test_coco_metrics_equals_an_independent_reference():
  dets, labels, sizes = _random_case(4, n=15, crowd=False)
  gt, results = _coco_dicts(dets, labels, sizes, 3)
  got = detection.coco_metrics(gt, results)
  ious = np.linspace(0.5, 0.95, 10)
  assert got["AP"] == pytest.approx(_reference_ap(gt, results, ious), abs=1e-12)
  assert got["AP50"] == pytest.approx(_reference_ap(gt, results, [0.5]), abs=1e-12)
  assert got["AP75"] == pytest.approx(_reference_ap(gt, results, [0.75]), abs=1e-12)
  assert 0.05 < got["AP75"] < got["AP"] < got["AP50"] < 1.0  # the thresholds matter here


def test_no_detections_give_zero_ap():
  dets, labels, sizes = _random_case(5)
  dets[..., 4] = 0.0
  got = _evaluate(dets, labels, sizes, num_classes=3)
  assert {f"det/{k}" for k in detection.METRICS} <= set(got)
  assert all(got[f"det/{k}"] == 0.0 for k in detection.METRICS)
  gt, results = _coco_dicts(dets, labels, sizes, 3)
  assert results == [] and detection.coco_metrics(gt, []) == dict.fromkeys(detection.METRICS, 0.0)


def test_build_makes_and_runs_a_detection_evaluator():
  dets, labels, sizes = _random_case(6, n=10, num_classes=2)

  def make_data(dataset, split, batch_size):
    return _source(dets, labels, sizes, batch_size)

  evals = dict(val=dict(type="detection", every_steps=1, class_names=("cat", "dog")))
  (ev,) = evaluators.build(
    evals, model=_Detector(), batch_size=4, make_data=make_data, num_classes=lambda ds: 2
  )
  assert isinstance(ev, detection.DetectionEvaluator) and ev.every_steps == 1
  got = ev.run({})
  gt, results = _coco_dicts(dets, labels, sizes, 2)
  want = detection.coco_metrics(gt, results)
  assert {k: got[f"val/{k}"] for k in want} == want
  assert got["val/num_images"] == 10
  # max_examples stops after the first batch holding that many rows
  ev.max_examples = 5
  assert ev.run({})["val/num_images"] == 8
