"""Polyak averaging: the update rule against float64, the trainer's average against a direct
computation from every step's parameters, the evaluators scoring the average (not the raw
parameters), fine-tuning starting the average at the pretrained weights (from an .npz, and from a
workdir whose average is what a later stage reads), the imagenet2012 preset's decay, and a
SIGKILLed run with EMA that resumes bitwise."""

import jax
import numpy as np
import pytest
import test_train  # tests/: the SIGKILL-resume harness and the small pretrain config

from tests.helpers import random_weights
from vit_jax import checkpoint, evaluators, sharding, train
from vit_jax.checkpoint.state import train_state
from vit_jax.configs import finetune
from vit_jax.train import ema, loop, model_init


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


def test_no_average_without_ema(tmp_path):
  checkpointer = train_state.Checkpointer(str(tmp_path), every_steps=1, keep=1)
  state = {"step": np.int32(1), "params": {"w": np.ones(3, np.float32)}}
  checkpointer.save(1, jax.device_put(state), {"process_states": []}, force=True)
  checkpointer.wait()
  checkpointer.close()
  np.testing.assert_array_equal(train_state.restore_params(tmp_path)["w"], np.ones(3))
  with pytest.raises(ValueError, match="no parameter average"):
    train_state.restore_params(tmp_path, ema=True)


DECAY = 0.6  # far from 1: after a few steps the average is far from the raw parameters
STEPS = 5


def _finetune_config(model_init: str):
  """Animal-MNIST fine-tuning shrunk by runlocal, with Polyak averaging, a checkpoint after every
  step and the preset's evaluators (minival and val) after the last step."""
  config = finetune.get_config("dataset=animal_mnist,runlocal")
  config.model_init = model_init
  config.ema_decay = DECAY
  config.total_steps = STEPS
  config.checkpoint.update(every_steps=1, keep=STEPS, asynchronous=False)
  for entry in config.evals.values():
    entry.every_steps = 0
  return config


def _host(tree):
  """A host copy of a state tree (the trainer donates its buffers to the next step)."""
  return jax.tree_util.tree_map(lambda x: np.array(jax.device_get(x), copy=True), tree)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
  """A random 'testing' ViT (not the trainer's initialisation) saved as an .npz and fine-tuned
  from it with averaging on one device: (config, workdir, the .npz's params, the run's metrics,
  its state before the first step)."""
  root = tmp_path_factory.mktemp("ema_finetune")
  path = random_weights.random_npz(str(root / "pretrained.npz"), seed=1)
  config = _finetune_config(path)
  seen, report = [], loop._report_compiled

  def recording_report(compiled, state, *args):
    seen.append(_host(state))  # called once, with the state the first step starts from
    return report(compiled, state, *args)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(loop, "_report_compiled", recording_report)
    metrics = train.run(config, str(root / "run"), devices=jax.devices()[:1])
  (state0,) = seen
  return config, root / "run", checkpoint.load(path), metrics, state0


def test_trainer_average_equals_direct_computation(finetuned):
  _, workdir, _, _, state0 = finetuned
  steps = [state0["params"]]
  steps += [
    train_state.restore_params(workdir / "checkpoints" / str(s), ema=False)
    for s in range(1, STEPS + 1)
  ]
  # Direct: d^k p_0 + Σ_t (1 − d) d^(k-t) p_t, in float64, from the step-0 (loaded) parameters.
  direct = jax.tree_util.tree_map(lambda p: DECAY**STEPS * np.float64(p), steps[0])
  for t in range(1, STEPS + 1):
    direct = jax.tree_util.tree_map(
      lambda d, p, t=t: d + (1 - DECAY) * DECAY ** (STEPS - t) * np.float64(p), direct, steps[t]
    )
  exported = train_state.restore_params(workdir)  # the average, what later stages read
  # Five float32 updates: a few ulps of the largest parameter.
  test_train._assert_trees(exported, direct, atol=1e-6)
  assert not np.allclose(exported["head"]["kernel"], steps[-1]["head"]["kernel"])
  # The raw parameters are kept too.
  test_train._assert_trees(train_state.restore_params(workdir, ema=False), steps[-1], exact=True)


def test_a_run_from_scratch_starts_the_average_at_its_initialisation():
  config = _finetune_config("")
  config.init_from_scratch = True
  built = train.build(config, sharding.make_mesh(config.mesh, jax.devices()[:1]), 10)
  state = _host(jax.jit(built.init_state, out_shardings=built.state_shardings)(built.init_key))
  test_train._assert_trees(state["ema"], state["params"], exact=True)


def _evaluate(config, *trees) -> list[dict[str, float]]:
  """config's evaluators run on each parameter tree outside the trainer (on one device, as the
  run)."""
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  evals = evaluators.build(
    config.evals,
    model=train.build(config, mesh, num_classes=10).model,
    dataset=config.dataset,
    batch_size=config.eval_batch_size,
    mesh=mesh,
    data_axes=sharding.BATCH_AXES,
  )
  return [{k: v for e in evals for k, v in e.run(params).items()} for params in trees]


def test_evaluators_score_the_average(finetuned):
  config, workdir, _, metrics, _ = finetuned
  average = train_state.restore_params(workdir)
  raw = train_state.restore_params(workdir, ema=False)
  on_average, on_raw = _evaluate(config, average, raw)
  for name in ("minival", "val"):
    # What the trainer reported is the average's score (to float32 summation order) ...
    assert metrics[f"{name}/loss"] == pytest.approx(on_average[f"{name}/loss"], rel=1e-6, abs=0)
    assert metrics[f"{name}/accuracy"] == on_average[f"{name}/accuracy"]
    # ... not the raw parameters' (five steps at decay 0.6 move the loss by far more).
    assert abs(on_raw[f"{name}/loss"] - on_average[f"{name}/loss"]) > 1e-3
  # checkpoint.load, what the tools and a later stage read, is the average too.
  test_train._assert_trees(checkpoint.load(workdir), average, exact=True)


def _without_head(tree):
  return {k: v for k, v in tree.items() if k != "head"}


def test_finetuning_starts_the_average_at_the_pretrained_weights(finetuned):
  _, workdir, pretrained, _, state0 = finetuned
  assert int(state0["step"]) == 0
  # From an .npz: the average is the loaded parameters (the pretrained body and the new,
  # zero-initialised head), not the random initialisation the trainer builds first.
  test_train._assert_trees(state0["ema"], state0["params"], exact=True)
  test_train._assert_trees(_without_head(state0["params"]), _without_head(pretrained), exact=True)
  assert not np.any(state0["params"]["head"]["kernel"])
  later = _finetune_config(str(workdir))  # the same model and seed
  built = train.build(later, sharding.make_mesh(later.mesh, jax.devices()[:1]), 10)
  random_init = _host(jax.jit(built.init_params)(built.init_key))
  assert not np.allclose(state0["ema"]["embedding"]["kernel"], random_init["embedding"]["kernel"])
  # From the workdir of a run with averaging, a later stage loads that run's average (not its
  # raw parameters), with its own new head.
  head = random_init["head"]
  loaded = _host(
    model_init.load_init_params(
      later, built.abstract_state["params"], head, built.state_shardings["params"]
    )
  )
  average, raw = train_state.restore_params(workdir), train_state.restore_params(workdir, ema=False)
  assert not np.allclose(average["embedding"]["kernel"], raw["embedding"]["kernel"])
  test_train._assert_trees(_without_head(loaded), _without_head(average), exact=True)
  test_train._assert_trees(loaded["head"], head, exact=True)


def test_imagenet_preset_averages_with_decay_0_9999():
  # The paper's Table 2 ImageNet setting, also under runlocal (what the transfer suite's test
  # runs); the other presets do not average.
  for arg in ("dataset=imagenet2012", "dataset=imagenet2012,holdout=false,runlocal"):
    config = finetune.get_config(arg)
    assert config.ema_decay == 0.9999 and ema.enabled(config.ema_decay)
  for dataset in ("cifar10", "oxford_iiit_pet", "vtab/dtd", "animal_mnist"):
    assert not ema.enabled(finetune.get_config(f"dataset={dataset}").ema_decay)


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
