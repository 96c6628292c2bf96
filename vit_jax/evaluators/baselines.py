"""Raw-pixel baselines: logistic regression and kNN-3 on pixels / 255 (scikit-learn).

Every accuracy this project reports stands next to these, computed on the same split in the same
run: the demo, the experiments and the transfer suite's offline table use them.
"""

import warnings
from typing import Any

import numpy as np


def pixel_baselines(
  dataset: str,
  train_split: str = "train",
  train_rows: Any | None = None,
  test_split: str = "test",
  max_iter: int = 1000,
) -> dict[str, float]:
  """{'logreg', 'knn3'} top-1 on `test_split` of a builtin dataset, whether the logistic
  regression converged within `max_iter`, and the example counts.

  `dataset` is a vit_jax.input_pipeline.sources.builtin name; splits may be slices
  ('train[:98%]'); `train_rows`: positions within `train_split` to train on (None: all).
  `max_iter`: 1000 converges on the downstream sets, 100 keeps Fashion-MNIST to ~15 s on 2 cores.
  """
  from vit_jax.input_pipeline.sources import builtin

  x, y = builtin.get_split(dataset, train_split)
  if train_rows is not None:
    x, y = x[train_rows], y[train_rows]
  xt, yt = builtin.get_split(dataset, test_split)
  return pixel_scores(x, y, xt, yt, max_iter)


def pixel_scores(
  x: np.ndarray, y: np.ndarray, xt: np.ndarray, yt: np.ndarray, max_iter: int = 1000
) -> dict[str, float]:
  """The baselines (see `pixel_baselines`) of any uint8 images `x` [N, ...] with labels `y`
  (pixels / 255, scikit-learn), scored on `xt`, `yt`."""
  from sklearn.exceptions import ConvergenceWarning
  from sklearn.linear_model import LogisticRegression
  from sklearn.neighbors import KNeighborsClassifier

  def flat(a):
    return a.reshape(len(a), -1).astype(np.float32) / 255.0

  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", ConvergenceWarning)
    logreg = LogisticRegression(max_iter=max_iter).fit(flat(x), y)
  knn = KNeighborsClassifier(n_neighbors=min(3, len(y))).fit(flat(x), y)
  return dict(
    logreg=float(logreg.score(flat(xt), yt)),
    knn3=float(knn.score(flat(xt), yt)),
    logreg_converged=not any(issubclass(w.category, ConvergenceWarning) for w in caught),
    train_examples=len(y),
    test_examples=len(yt),
  )
