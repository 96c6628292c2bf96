"""The input iterators' states of all processes, as a checkpoint keeps them, and back.

Every process's iterator is at the same stream position; the states differ in per-host counters
(skipped examples). This module must not import TensorFlow (the trainer imports it at its start).
"""

from typing import Any

import jax
import numpy as np

from vit_jax.runtime import distributed


def gather(local: dict[str, int]) -> dict[str, Any]:
  """Every process's `local` iterator state, gathered (the same result on every process)."""
  keys = sorted(local)
  gathered = distributed.gather(np.asarray([int(local[k]) for k in keys], np.int64))
  return {"process_states": [dict(zip(keys, map(int, row), strict=True)) for row in gathered]}


def local(saved: dict[str, Any] | None) -> dict[str, int] | None:
  """This process's iterator state out of `gather`'s (None: start of the data).

  Every process saved the same stream position, from which any number of processes resumes
  (input_pipeline.TrainIterator); on another number, process 0 carries the old processes'
  skipped-example counts, summed, and the others start theirs at 0.
  """
  if not saved:
    return None
  states = saved["process_states"]
  if len(states) == jax.process_count():
    return states[jax.process_index()]
  skipped = sum(int(s["num_skipped"]) for s in states) if jax.process_index() == 0 else 0
  return dict(states[0], num_skipped=skipped)
