"""Trees compared leaf by leaf: the same paths, and every array bitwise equal; a mismatch names
its path."""

import jax
import numpy as np

from vit_jax.checkpoint.state import train_state


def assert_equal(a, b, what: str = "") -> None:
  """`a` and `b` have the same leaf paths and bitwise equal leaves."""
  left, right = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
  assert [p for p, _ in left] == [p for p, _ in right], f"{what}: the trees' paths differ"
  for (path, x), (_, y) in zip(left, right, strict=True):
    np.testing.assert_array_equal(x, y, err_msg=f"{what} {jax.tree_util.keystr(path)}".strip())


def assert_same_params(workdir, reference, ema: bool = False) -> None:
  """The latest parameters (or their EMA) of two trainer workdirs are bitwise the same."""
  assert_equal(
    train_state.restore_params(workdir, ema=ema),
    train_state.restore_params(reference, ema=ema),
    f"ema={ema}" if ema else "",
  )
