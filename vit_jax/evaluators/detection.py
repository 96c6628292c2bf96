"""COCO box AP of a detection model over a split, and the conversions to COCO's formats.

The model's `out['detections']` holds `boxes` [B, D, 4] (ymin, xmin, ymax, xmax) normalized to
[0, 1], `scores` [B, D] (0: no detection) and `classes` [B, D] (0..K-1). A batch's `label`
[B, M, 6] rows are (ymin, xmin, ymax, xmax, class, crowd) normalized the same way (class -1:
unused row), `size` [B, 2] is each original image's (height, width) in pixels and `mask` [B]
marks the rows that count.

COCO's boxes are [x, y, width, height] in the original image's pixels: `to_coco_bbox` is the one
conversion, used for the ground truth and the detections here and for predict's JSON, so a JSON
rescored with `coco_metrics` gives this evaluator's AP. `coco_metrics` is pycocotools' COCOeval
(iouType 'bbox'): AP over IoU 0.5:0.95, AP50, AP75 and AP of small, medium and large boxes, with
COCO's 101-point interpolated precision and crowd boxes neither found nor missed.

Metrics: `{name}/AP`, `{name}/AP50`, `{name}/AP75`, `{name}/APs`, `{name}/APm`, `{name}/APl`
(a size with no ground-truth box is left out), `{name}/num_images`, `{name}/num_boxes` (ground-
truth boxes, crowd ones included).
"""

import contextlib
import copy
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vit_jax.evaluators import _utils

# COCOeval's stats[0..5] (maxDets 100), in order.
METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


def to_coco_bbox(boxes: Any, height: Any, width: Any) -> np.ndarray:
  """float64 [..., 4] COCO boxes [x, y, w, h] in pixels of normalized `boxes` [..., 4] (ymin,
  xmin, ymax, xmax) of images `height` x `width` (scalars or arrays broadcasting to [...])."""
  b = np.asarray(boxes, np.float64)
  h, w = np.asarray(height, np.float64), np.asarray(width, np.float64)
  ymin, xmin, ymax, xmax = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
  return np.stack([xmin * w, ymin * h, (xmax - xmin) * w, (ymax - ymin) * h], axis=-1)


def coco_results(
  image_ids: Sequence[int],
  detections: tuple[Any, Any, Any],
  sizes: Any,
  category_ids: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
  """COCO result dicts {image_id, category_id, bbox, score} of the detections with score > 0.

  `detections`: (boxes [N, D, 4], scores [N, D], classes [N, D]) as the model gives them, of the
  images `image_ids` [N] whose (height, width) are `sizes` [N, 2]; class k is category
  `category_ids[k]` (None: k + 1).
  """
  boxes, scores, classes = (np.asarray(x) for x in detections)
  sizes = np.asarray(sizes)
  if not (len(image_ids) == len(boxes) == len(scores) == len(classes) == len(sizes)):
    raise ValueError(
      f"coco_results: {len(image_ids)} image ids, {len(boxes)} boxes, {len(scores)} scores, "
      f"{len(classes)} classes, {len(sizes)} sizes; expected one of each per image"
    )
  bbox = to_coco_bbox(boxes, sizes[:, 0, None], sizes[:, 1, None])
  keep = scores > 0
  classes = classes.astype(np.int64)
  if category_ids is not None and keep.any():
    bad = classes[keep][(classes[keep] < 0) | (classes[keep] >= len(category_ids))]
    if bad.size:
      raise ValueError(f"coco_results: class {bad[0]} has no category (0..{len(category_ids) - 1})")
  out = []
  for i, d in zip(*np.nonzero(keep), strict=True):
    k = int(classes[i, d])
    out.append(
      {
        "image_id": int(image_ids[i]),
        "category_id": int(category_ids[k]) if category_ids is not None else k + 1,
        "bbox": [float(v) for v in bbox[i, d]],
        "score": float(scores[i, d]),
      }
    )
  return out


def coco_metrics(
  ground_truth: Mapping[str, Any], results: Sequence[Mapping[str, Any]]
) -> dict[str, float]:
  """COCOeval's box metrics (`METRICS`: its stats[0..5]) of `results` (COCO result dicts) on
  `ground_truth` (a COCO instances dict: images, annotations, categories); a metric COCO gives
  as -1 (no ground truth of that size) is left out. Neither argument is modified."""
  from pycocotools.coco import COCO  # only where detection is evaluated
  from pycocotools.cocoeval import COCOeval

  with contextlib.redirect_stdout(io.StringIO()):  # COCO's progress and summary table
    gt = COCO()
    gt.dataset = copy.deepcopy(dict(ground_truth))  # COCOeval writes into the annotations
    gt.createIndex()
    if results:
      dt = gt.loadRes(copy.deepcopy(list(results)))
    else:  # loadRes cannot take an empty list: an empty result set, every AP 0
      dt = COCO()
      dt.dataset = {**copy.deepcopy(gt.dataset), "annotations": []}
      dt.createIndex()
    coco_eval = COCOeval(gt, dt, iouType="bbox")
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
  stats = coco_eval.stats
  return {key: float(stats[i]) for i, key in enumerate(METRICS) if stats[i] != -1}


def ground_truth_dict(
  labels: np.ndarray, sizes: np.ndarray, class_names: Sequence[str]
) -> dict[str, Any]:
  """The COCO instances dict of images 0..N-1 of sizes [N, 2] (height, width) and their label
  rows [N, M, 6] (class -1: unused); class k is category k + 1, named `class_names[k]`."""
  images, annotations = [], []
  for i, ((h, w), rows) in enumerate(zip(sizes, labels, strict=True)):
    images.append({"id": i, "height": int(h), "width": int(w)})
    rows = rows[rows[:, 4] >= 0]
    for (x, y, bw, bh), row in zip(to_coco_bbox(rows[:, :4], h, w), rows, strict=True):
      k = int(row[4])
      if k >= len(class_names):
        raise ValueError(f"label class {k} of image {i}: expected 0..{len(class_names) - 1}")
      annotations.append(
        {
          "id": len(annotations) + 1,  # COCOeval reads id 0 as "unmatched"
          "image_id": i,
          "category_id": k + 1,
          "bbox": [float(x), float(y), float(bw), float(bh)],
          "area": float(bw * bh),
          "iscrowd": int(row[5] > 0),
        }
      )
  categories = [{"id": k + 1, "name": name} for k, name in enumerate(class_names)]
  return {"images": images, "annotations": annotations, "categories": categories}


class DetectionEvaluator(_utils.OnSplit):
  """COCO box AP of `fn(params, images) -> {'boxes', 'scores', 'classes'}` (the model's
  `out['detections']`) against each batch's `label` boxes of its original image `size`. COCO's
  matching runs on the host, so `run` gathers every batch's real rows there (no on-device sums)."""

  reads = "detections"
  needs = ("num_classes", "class_names")

  def __init__(
    self,
    fn: _utils.ArrayFn,
    data: _utils.DataSource,
    num_classes: int,
    *,
    class_names: Sequence[str] | None = None,
    name: str = "val",
    **kwargs,
  ):
    """`kwargs`: `_utils.OnSplit`'s."""
    self.fn, self.num_classes = fn, int(num_classes)
    if class_names and len(class_names) != self.num_classes:
      raise ValueError(f"evals.{name}: {len(class_names)} class_names for {num_classes} classes")
    self.class_names = list(class_names) if class_names else [str(k) for k in range(num_classes)]
    super().__init__(fn, data, name=name, **kwargs)

  def collect(self, params: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One pass over the split: (ground-truth instances dict, COCO results) of its real rows,
    image ids in the order read."""
    labels, sizes, dets = [], [], []
    rows = 0
    for batch in self.data():
      out = self.fn(params, batch["image"])
      mask = _utils.to_host(batch["mask"]).astype(bool)
      labels.append(_utils.to_host(batch["label"])[mask])
      sizes.append(_utils.to_host(batch["size"])[mask])
      dets.append(tuple(_utils.to_host(out[k])[mask] for k in ("boxes", "scores", "classes")))
      rows += len(mask)
      if self.max_examples and rows >= self.max_examples:
        break
    if not labels:
      raise ValueError(f"evals.{self.name}: the data source yielded no batches")
    sizes = np.concatenate(sizes)
    detections = tuple(np.concatenate(x) for x in zip(*dets, strict=True))
    gt = ground_truth_dict(np.concatenate(labels), sizes, self.class_names)
    ids = np.arange(len(sizes))
    return gt, coco_results(ids, detections, sizes, range(1, self.num_classes + 1))

  def run(self, params: Any) -> dict[str, float]:
    gt, results = self.collect(params)
    metrics = coco_metrics(gt, results)
    metrics.update(num_images=len(gt["images"]), num_boxes=len(gt["annotations"]))
    return {f"{self.name}/{k}": float(v) for k, v in metrics.items()}
