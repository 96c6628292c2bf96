"""Helpers shared by the evaluators: host transfer of (global) arrays and feature extraction.

Batches are dicts with `image` [B, H, W, 3], `label` ([B] int or [B, K] one/multi-hot) and an
optional `mask` [B] (0 marks padding added to fill the last batch; such rows never count). They
may be numpy arrays or global `jax.Array`s sharded over the mesh: `to_host` gathers the latter
from every process, so each host ends up with the whole batch.
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

# A data source is called once per evaluation and returns a fresh pass over the split.
DataSource = Callable[[], Iterable[Mapping[str, Any]]]
# fn(params, images [B, H, W, 3]) -> representation [B, R] (or logits [B, K]).
ArrayFn = Callable[[Any, Any], jax.Array]


class OnSplit:
  """What the evaluators of one split share: the model's logits `fn(params, images)` over
  `data`, each batch's `metrics(logits, batch)` summed on device (`summing`); `max_examples`
  stops a pass after the first batches holding that many rows (a quick look, not the metric;
  0 / None: the whole split)."""

  reads, splits, needs = "logits", {"data": "split"}, ()

  def __init__(
    self,
    fn: ArrayFn,
    data: DataSource,
    *,
    name: str,
    every_steps: int = 0,
    max_examples: int | None = None,
  ):
    self.data, self.name, self.every_steps = data, name, every_steps
    self.max_examples = max_examples or None
    self._accumulate = summing(fn, self.metrics)

  def metrics(self, logits: jax.Array, batch: Mapping[str, Any]) -> Any:
    raise NotImplementedError


class Probe:
  """What the few-shot and linear probes share: `fn(params, images) -> [B, R]` (the model's
  pre-logits) read over a training and a test split of `num_classes` classes; `max_examples`
  caps how much of each split is read (0 / None: the whole splits)."""

  reads = "pre_logits"
  splits = {"train_data": "train_split", "test_data": "test_split"}
  needs = ("num_classes",)

  def __init__(
    self,
    fn: ArrayFn,
    train_data: DataSource,
    test_data: DataSource,
    num_classes: int,
    *,
    name: str,
    every_steps: int = 0,
    seed: int = 0,
    max_examples: int | None = None,
  ):
    self.fn, self.train_data, self.test_data = fn, train_data, test_data
    self.num_classes, self.name, self.every_steps, self.seed = num_classes, name, every_steps, seed
    self.max_examples = max_examples or None


def to_host(x: Any) -> np.ndarray:
  """Returns `x` as a numpy array on this host, gathering a multi-host global array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def take_rows(x: Any, rows: np.ndarray) -> np.ndarray:
  """Host copies of `x[rows]`; of a multi-host global array only those rows are gathered."""
  if not (isinstance(x, jax.Array) and not x.is_fully_addressable):
    return np.asarray(x)[rows]
  return gather_rows(x, rows)


def gather_rows(x: jax.Array, rows: np.ndarray) -> np.ndarray:
  """`x[rows]` of a global array sharded on a mesh, replicated to every process."""
  n = len(rows)
  bucket = 1 << max(n - 1, 0).bit_length()  # few distinct shapes, few compilations
  padded = np.concatenate([rows, np.zeros(bucket - n, rows.dtype)])
  replicated = jax.sharding.NamedSharding(x.sharding.mesh, jax.sharding.PartitionSpec())
  out = jax.jit(lambda a, i: a[i], out_shardings=replicated)(x, padded)
  return np.asarray(out.addressable_data(0))[:n]


def summing(fn: ArrayFn, metrics: Callable[[jax.Array, Mapping[str, Any]], Any]):
  """Jitted accumulate(sums, params, batch) -> sums + metrics(fn(params, images), batch), the
  sums any tree of arrays (they stay on device: no host round trip per batch)."""

  @jax.jit
  def accumulate(sums, params, batch):
    return jax.tree.map(jnp.add, sums, metrics(fn(params, batch["image"]), batch))

  return accumulate


def sum_over_split(
  data: DataSource,
  accumulate: Callable[[dict, Any, dict], dict],
  params: Any,
  sums: dict[str, Any],
  max_examples: int | None = None,
) -> dict[str, float]:
  """Folds `accumulate(sums, params, batch)` over one pass of `data` (stopping once
  `max_examples` rows were read; None: the whole split); the sums as host floats."""
  rows = 0
  for batch in data():
    if max_examples is not None and rows >= max_examples:
      break
    batch = {k: batch[k] for k in ("image", "label", "mask") if k in batch}
    sums = accumulate(sums, params, batch)
    rows += len(batch["label"])
  return {k: float(to_host(v)) for k, v in sums.items()}


def labels_and_mask(batch: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
  """Returns integer labels [B] and a boolean mask [B] of the real examples of a batch."""
  labels = to_host(batch["label"])
  if labels.ndim == 2:  # one-hot or multi-hot: the first positive class
    labels = np.argmax(labels, axis=-1)
  labels = labels.astype(np.int32)
  if "mask" in batch:
    mask = to_host(batch["mask"]).astype(bool)
  else:
    mask = np.ones(labels.shape, bool)
  return labels, mask


def extract_features(
  fn: ArrayFn, params: Any, source: DataSource, max_examples: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """Runs `fn` over a split and returns host arrays (features [N, R] float32, labels [N] int32).

  Padded examples (mask 0) are dropped; with `max_examples` the pass stops early.
  """
  feats, labels = [], []
  count = 0
  for batch in source():
    y, mask = labels_and_mask(batch)
    f = to_host(fn(params, batch["image"]))
    feats.append(f[mask].astype(np.float32))
    labels.append(y[mask])
    count += int(mask.sum())
    if max_examples is not None and count >= max_examples:
      break
  if not feats:
    raise ValueError("the data source yielded no batches")
  x, y = np.concatenate(feats), np.concatenate(labels)
  if max_examples is not None:
    x, y = x[:max_examples], y[:max_examples]
  return x, y


def batched_apply(
  fn: ArrayFn, params: Any, images: np.ndarray, batch_size: int, sharding: Any = None
) -> np.ndarray:
  """Applies `fn` to host `images` in batches of exactly `batch_size` (the last one padded).

  Every process must hold the same `images`; with `sharding` (e.g. the trainer's data sharding)
  each batch becomes a global array split over the mesh, otherwise it is passed as numpy.
  """
  out = []
  for start in range(0, len(images), batch_size):
    chunk = images[start : start + batch_size]
    n = len(chunk)
    if n < batch_size:  # one shape, one compilation
      pad = np.zeros((batch_size - n, *chunk.shape[1:]), chunk.dtype)
      chunk = np.concatenate([chunk, pad])
    if sharding is not None:
      chunk = jax.device_put(chunk, sharding)
    out.append(to_host(fn(params, chunk))[:n])
  return np.concatenate(out).astype(np.float32)
