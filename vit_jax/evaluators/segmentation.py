"""Mean IoU and pixel accuracy (overall and per class) of a segmentation model over a split.

Per batch, one jitted function adds the confusion matrix [true class, predicted class] of the
pixels that count (label not the ignore label, example mask 1) to a running sum on device; the
host reads it once at the end. From the matrix C (classes K):

  IoU_k            C[k, k] / (row_k + column_k − C[k, k]), for classes present in the labels or
                   the predictions (a class in neither has no IoU and is left out of the mean)
  mean IoU         the mean of those IoUs
  pixel accuracy   trace(C) / sum(C)
  accuracy_k       C[k, k] / row_k (the class's recall), for classes present in the labels

Metrics: `{name}/miou`, `{name}/pixel_accuracy`, `{name}/mean_class_accuracy`,
`{name}/num_pixels`, and per class `{name}/iou/<class>` and `{name}/accuracy/<class>` (class
names from the dataset, else the index).
"""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.evaluators import _utils

IGNORE_LABEL = 255


def confusion(
  predictions: jax.Array, labels: jax.Array, weights: jax.Array, num_classes: int
) -> jax.Array:
  """float32 [K, K]: weighted counts of (label, prediction) pairs; pixels labelled outside
  [0, K) (the ignore label) count nothing. predictions, labels int [...]; weights like them."""
  valid = (labels >= 0) & (labels < num_classes)
  w = (weights * valid).astype(jnp.float32).reshape(-1)
  pairs = jnp.where(valid, labels, 0).reshape(-1) * num_classes + predictions.reshape(-1)
  counts = jnp.zeros(num_classes * num_classes, jnp.float32).at[pairs].add(w)
  return counts.reshape(num_classes, num_classes)


def metrics_from_confusion(
  matrix: np.ndarray, class_names: Sequence[str] | None = None, prefix: str = ""
) -> dict[str, float]:
  """The module docstring's metrics of a confusion matrix [true, predicted] (numpy)."""
  matrix = np.asarray(matrix, np.float64)
  k = matrix.shape[0]
  names = list(class_names) if class_names else [str(i) for i in range(k)]
  tp = np.diag(matrix)
  rows, cols = matrix.sum(axis=1), matrix.sum(axis=0)
  union = rows + cols - tp
  total = matrix.sum()
  out = {
    f"{prefix}pixel_accuracy": float(tp.sum() / total) if total else 0.0,
    f"{prefix}num_pixels": float(total),
  }
  present = union > 0
  iou = np.where(present, tp / np.maximum(union, 1), np.nan)
  acc = np.where(rows > 0, tp / np.maximum(rows, 1), np.nan)
  out[f"{prefix}miou"] = float(np.nanmean(iou)) if present.any() else 0.0
  out[f"{prefix}mean_class_accuracy"] = float(np.nanmean(acc)) if (rows > 0).any() else 0.0
  for i, name in enumerate(names):
    if present[i]:
      out[f"{prefix}iou/{name}"] = float(iou[i])
    if rows[i] > 0:
      out[f"{prefix}accuracy/{name}"] = float(acc[i])
  return out


class SegmentationEvaluator(_utils.OnSplit):
  """Mean IoU and pixel accuracy of `fn(params, images) -> logits [B, H, W, K]`."""

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
    self.num_classes = int(num_classes)
    self.class_names = list(class_names) if class_names else None
    super().__init__(fn, data, name=name, **kwargs)

  def metrics(self, logits, batch):
    labels = batch["label"]
    weights = jnp.broadcast_to(batch["mask"][:, None, None], labels.shape)
    return confusion(jnp.argmax(logits, -1), labels, weights, self.num_classes)

  def run(self, params: Any) -> dict[str, float]:
    matrix = jnp.zeros((self.num_classes, self.num_classes), jnp.float32)
    rows = 0
    for batch in self.data():
      matrix = self._accumulate(matrix, params, batch)
      rows += int(np.shape(batch["mask"])[0])
      if self.max_examples and rows >= self.max_examples:
        break
    matrix = _utils.to_host(matrix)
    return metrics_from_confusion(matrix, self.class_names, prefix=f"{self.name}/")
