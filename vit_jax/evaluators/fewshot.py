"""Few-shot linear evaluation on frozen representations (ViT paper, §4.1 "Metrics").

For each shot count k, k training examples per class are drawn (seeded; the subsets are nested,
so the 5-shot set contains the 1-shot set), and a regularised least-squares regression maps
their representations to {-1, +1}^K targets in closed form. Top-1 of the argmax on the test
split is reported. The solve (`ridge_fit`, `ridge_scores`, `fewshot_accuracy`) is jittable and
runs in float32 at HIGHEST matmul precision (TPUs default to bf16 passes otherwise).

Features are first centred with the mean of the k-shot training features and scaled to unit L2
norm, so one `l2_reg` suits representations of any scale; the intercept is not regularised.
"""

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from vit_jax.evaluators import _utils

_HIGHEST = jax.lax.Precision.HIGHEST


def _normalise(x: jax.Array, mean: jax.Array) -> jax.Array:
  z = x - mean
  return z / jnp.maximum(jnp.linalg.norm(z, axis=-1, keepdims=True), 1e-12)


def ridge_fit(
  x: jax.Array, labels: jax.Array, num_classes: int, l2_reg: float | jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Closed-form ridge regression of features onto {-1, +1}^K targets.

  Solves min_{W, b} ||Z W + b - T||^2 + l2_reg ||W||^2 with Z the normalised features.

  x: features [N, R], labels: int [N]. Returns (w [R, K], b [K], mean [R]) for `ridge_scores`.
  """
  x = x.astype(jnp.float32)
  mean = jnp.mean(x, axis=0)
  z = _normalise(x, mean)
  t = 2.0 * jax.nn.one_hot(labels, num_classes, dtype=jnp.float32) - 1.0
  z_bar, t_bar = jnp.mean(z, axis=0), jnp.mean(t, axis=0)
  zc, tc = z - z_bar, t - t_bar
  n, r = zc.shape
  if n < r:  # dual form: an [N, N] system instead of [R, R], same solution
    gram = jnp.matmul(zc, zc.T, precision=_HIGHEST) + l2_reg * jnp.eye(n, dtype=zc.dtype)
    w = jnp.matmul(zc.T, jnp.linalg.solve(gram, tc), precision=_HIGHEST)
  else:
    cov = jnp.matmul(zc.T, zc, precision=_HIGHEST) + l2_reg * jnp.eye(r, dtype=zc.dtype)
    w = jnp.linalg.solve(cov, jnp.matmul(zc.T, tc, precision=_HIGHEST))
  b = t_bar - jnp.matmul(z_bar, w, precision=_HIGHEST)
  return w, b, mean


def ridge_scores(x: jax.Array, w: jax.Array, b: jax.Array, mean: jax.Array) -> jax.Array:
  """Class scores [N, K] of features [N, R] under a `ridge_fit` solution."""
  return jnp.matmul(_normalise(x.astype(jnp.float32), mean), w, precision=_HIGHEST) + b


@functools.partial(jax.jit, static_argnames=("num_classes",))
def fewshot_accuracy(
  x_train: jax.Array,
  y_train: jax.Array,
  x_test: jax.Array,
  y_test: jax.Array,
  num_classes: int,
  l2_reg: float | jax.Array,
) -> jax.Array:
  """Top-1 on (x_test, y_test) of the ridge classifier fitted on (x_train, y_train)."""
  w, b, mean = ridge_fit(x_train, y_train, num_classes, l2_reg)
  preds = jnp.argmax(ridge_scores(x_test, w, b, mean), axis=-1)
  return jnp.mean(preds == y_test)


class _ReservoirPerClass:
  """Uniform sampling of up to `capacity` examples per class from one pass over a stream."""

  def __init__(self, num_classes: int, capacity: int, seed: int):
    self.capacity = capacity
    self.rng = np.random.default_rng(seed)
    self.seen = np.zeros(num_classes, np.int64)
    self.slots: list[list[Any]] = [[] for _ in range(num_classes)]

  def add(self, label: int, item: Any) -> int | None:
    """Offers `item`; returns the slot it now occupies, or None if it was not taken."""
    # Algorithm R: the i-th item of a class replaces a random slot with probability capacity/i.
    self.seen[label] += 1
    slots = self.slots[label]
    if len(slots) < self.capacity:
      slots.append(item)
      return len(slots) - 1
    j = int(self.rng.integers(self.seen[label]))
    if j < self.capacity:
      slots[j] = item
      return j
    return None


class FewShotEvaluator(_utils.Probe):
  """Few-shot linear top-1 of the representation `fn(params, images) -> [B, R]`.

  The first `run` reads the training split once and keeps a seeded, uniform sample of
  max(shots) examples per class (the images when they fit in `max_cache_bytes`, otherwise
  their positions, and the split is re-read each run). The test split is read every run.
  """

  needs = ("num_classes", "sharding")

  def __init__(
    self,
    *args,
    shots: Sequence[int] = (1, 5, 10, 25),
    l2_reg: float = 1.0,
    name: str = "fewshot",
    max_cache_bytes: int = 2**30,
    sharding: Any = None,
    **kwargs,
  ):
    """`sharding` places cached image batches on the mesh."""
    super().__init__(*args, name=name, **kwargs)
    self.shots = tuple(sorted(shots))
    self.l2_reg = l2_reg
    self.max_cache_bytes = max_cache_bytes
    self.sharding = sharding
    self._positions: np.ndarray | None = None  # [M] positions in the split, in sample order
    self._labels: np.ndarray | None = None  # [M]
    self._images: np.ndarray | None = None  # [M, H, W, 3] when cached
    self._batch_size = 0

  def _sample(self) -> None:
    """One pass over the training split: reservoir-samples max(shots) examples per class."""
    capacity = self.shots[-1]
    positions = _ReservoirPerClass(self.num_classes, capacity, self.seed)
    images: list[list[Any]] = [[None] * capacity for _ in range(self.num_classes)]
    keep_images = True
    position = 0
    for batch in self.train_data():
      labels, mask = _utils.labels_and_mask(batch)
      if not self._batch_size:
        self._batch_size = len(labels)
        shape, dtype = batch["image"].shape, np.dtype(batch["image"].dtype)
        per_image = int(np.prod(shape[1:])) * dtype.itemsize
        keep_images = per_image * capacity * self.num_classes <= self.max_cache_bytes
        if not keep_images:
          logging.info("%s: sample too large to cache; re-reading the split each run", self.name)
      taken = []  # (row, class, slot) in stream order
      for i in np.flatnonzero(mask):
        slot = positions.add(int(labels[i]), position + int(i))
        if slot is not None:
          taken.append((int(i), int(labels[i]), slot))
      if keep_images and taken:
        # Only the rows that entered the sample travel to the host (not the whole split).
        rows = _utils.take_rows(batch["image"], np.array([i for i, _, _ in taken]))
        for (_, c, slot), row in zip(taken, rows, strict=True):
          images[c][slot] = row
      position += len(labels)
      if self.max_examples is not None and position >= self.max_examples:
        break
    rng = np.random.default_rng(self.seed + 1)
    order = []  # (class, slot): per class a random order, whose first k are a k-shot sample
    for c, slots in enumerate(positions.slots):
      if 0 < len(slots) < capacity:
        logging.warning("%s: class %d has only %d training examples", self.name, c, len(slots))
      order += [(c, int(j)) for j in rng.permutation(len(slots))]
    self._labels = np.array([c for c, _ in order], np.int32)
    self._positions = np.array([positions.slots[c][j] for c, j in order], np.int64)
    if keep_images:
      self._images = np.stack([images[c][j] for c, j in order])

  def subset(self, k: int) -> np.ndarray:
    """Indices into the sample of the k-shot subset (the first k of each class's order)."""
    rank = np.zeros(len(self._labels), np.int64)
    for c in range(self.num_classes):
      members = np.flatnonzero(self._labels == c)
      rank[members] = np.arange(len(members))
    return np.flatnonzero(rank < k)

  def sample(self) -> tuple[np.ndarray, np.ndarray]:
    """(positions in the training split [M], labels [M]) of the sample; reads it if needed."""
    if self._positions is None:
      self._sample()
    return self._positions, self._labels

  def _train_features(self, params: Any) -> np.ndarray:
    if self._images is not None:
      return _utils.batched_apply(self.fn, params, self._images, self._batch_size, self.sharding)
    wanted = {int(p): j for j, p in enumerate(self._positions)}
    feats = np.zeros((len(wanted), 0), np.float32)
    position = 0
    for batch in self.train_data():
      if position > max(wanted):
        break
      n = len(batch["label"])
      hits = [(p - position, wanted[p]) for p in range(position, position + n) if p in wanted]
      if hits:
        f = _utils.to_host(self.fn(params, batch["image"]))
        if feats.shape[1] == 0:
          feats = np.zeros((len(wanted), f.shape[-1]), np.float32)
        for i, j in hits:
          feats[j] = f[i]
      position += n
    return feats

  def run(self, params: Any) -> dict[str, float]:
    self.sample()
    x_train = self._train_features(params)
    x_test, y_test = _utils.extract_features(self.fn, params, self.test_data, self.max_examples)
    results = {}
    for k in self.shots:
      idx = self.subset(k)
      acc = fewshot_accuracy(
        x_train[idx], self._labels[idx], x_test, y_test, self.num_classes, self.l2_reg
      )
      results[f"{self.name}/{k}shot"] = float(acc)
    return results
