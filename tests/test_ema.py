"""Polyak averaging: the update rule against float64, the trainer's average against a direct
computation from every step's parameters, and a SIGKILLed run with EMA that resumes bitwise."""

import jax
import numpy as np
import pytest
import test_train  # tests/: the SIGKILL-resume harness and the small pretrain config
from test_train import compilation_cache  # noqa: F401 (autouse: compiled steps on disk)

from vit_jax import ema, train
from vit_jax.checkpoint import train_state


def test_update_equals_float64_average():
  rng = np.random.default_rng(0)
  steps = [{"w": rng.normal(size=(5, 3)).astype(np.float32)} for _ in range(40)]
  decay = 0.9
  average = steps[0]
  for p in steps[1:]:
    average = ema.update(average, p, decay)
  # Direct: d^(k-1) p_0 + Σ_t (1 − d) d^(k-1-t) p_t, in float64.
  k = len(steps)
  direct = decay ** (k - 1) * steps[0]["w"].astype(np.float64)
  for t in range(1, k):
    direct += (1 - decay) * decay ** (k - 1 - t) * steps[t]["w"].astype(np.float64)
  assert average["w"].dtype == np.float32
  # 39 float32 updates of values ~1: each rounds by ~1 ulp; 64 ulps of the largest bounds it.
  np.testing.assert_allclose(average["w"], direct, rtol=0, atol=64 * np.finfo(np.float32).eps * 4)


def test_decay_is_checked():
  assert not ema.enabled(0.0) and not ema.enabled(None) and ema.enabled(0.9999)
  with pytest.raises(ValueError, match="ema_decay=1.5"):
    ema.enabled(1.5)


def ema_config():
  """test_train's SIGKILL config with Polyak averaging (child processes build it by name)."""
  config = test_train.sigkill_config()
  config.ema_decay = 0.6
  return config


def test_trainer_average_equals_direct_computation(tmp_path):
  config = test_train.small_config(total_steps=5, every_steps=1)
  config.accum_steps = 1
  config.ema_decay = 0.6
  train.run(config, str(tmp_path), devices=jax.devices()[:1])
  steps = [test_train._initial_params(config)]
  steps += [
    train_state.restore_params(tmp_path / "checkpoints" / str(s), ema=False) for s in range(1, 6)
  ]
  direct = jax.tree_util.tree_map(lambda p: 0.6**5 * np.float64(p), steps[0])
  for t in range(1, 6):
    direct = jax.tree_util.tree_map(
      lambda d, p, t=t: d + 0.4 * 0.6 ** (5 - t) * np.float64(p), direct, steps[t]
    )
  exported = train_state.restore_params(tmp_path)  # the average, what later stages read
  # Five float32 updates: a few ulps of the largest parameter.
  test_train._assert_trees(exported, direct, atol=1e-6)
  assert not np.allclose(exported["head"]["kernel"], steps[-1]["head"]["kernel"])
  # The raw parameters are kept too, and a checkpoint without an average says so.
  test_train._assert_trees(train_state.restore_params(tmp_path, ema=False), steps[-1], exact=True)


def test_no_average_without_ema(tmp_path):
  checkpointer = train_state.Checkpointer(str(tmp_path), every_steps=1, keep=1)
  state = {"step": np.int32(1), "params": {"w": np.ones(3, np.float32)}}
  checkpointer.save(1, jax.device_put(state), {"process_states": []}, force=True)
  checkpointer.wait()
  checkpointer.close()
  np.testing.assert_array_equal(train_state.restore_params(tmp_path)["w"], np.ones(3))
  with pytest.raises(ValueError, match="no parameter average"):
    train_state.restore_params(tmp_path, ema=True)


@pytest.mark.slow  # three trainer runs in child processes
def test_sigkill_with_ema_resumes_bitwise(tmp_path):
  config = ema_config()
  train.run(config, str(tmp_path / "reference"))
  workdir = tmp_path / "killed"
  test_train.run_child("save", 4, workdir, config_fn="test_ema:ema_config")
  train.run(config, str(workdir))  # resumes at step 4 and finishes
  for average in (True, False):
    test_train._assert_trees(
      train_state.restore_params(workdir, ema=average),
      train_state.restore_params(tmp_path / "reference", ema=average),
      exact=True,
    )
