"""The train step's arithmetic and the trainer's guards around a workdir.

Gradient accumulation equals one big batch; metrics are window means; multi-label accuracy is
precision@1; a finetune without weights, or a resume with another config, stops before anything
in the workdir is touched.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.helpers import this_thread
from vit_jax import models, sharding, train
from vit_jax.checkpoint.state import train_state
from vit_jax.configs import finetune, pretrain
from vit_jax.objectives import supervised
from vit_jax.runtime import logging_util, workdir
from vit_jax.train import optim


def _step_fn(accum_steps, loss="softmax_xent", multi_label=False, num_classes=4, **mixing):
  model = models.get_model("testing", num_classes=num_classes)
  # SGD: the update is the gradient itself (Adam's normalisation would magnify float noise of
  # near-zero gradients, which is not what this compares).
  config = finetune.get_config("dataset=animal_mnist")
  schedule = optax.constant_schedule(0.1)
  tx = optim.make_optimizer(config.optimizer, schedule, grad_clip_norm=1.0)
  mesh = sharding.make_mesh(pretrain.common.mesh_config(), jax.devices()[:1])
  smoothing = mixing.pop("label_smoothing", 0.0)
  objective = supervised.Supervised(loss, num_classes, multi_label, label_smoothing=smoothing)
  fn = train.make_train_step(
    objective, model, tx, schedule, accum_steps, mesh, num_classes=num_classes, **mixing
  )
  params = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)["params"]
  state = dict(step=jnp.int32(0), params=params, opt_state=tx.init(params), rng=jax.random.key(1))
  return jax.jit(fn), state


def _batch(n=8, num_classes=4, seed=0):
  rng = np.random.default_rng(seed)
  return dict(
    image=rng.uniform(-1, 1, (n, 16, 16, 3)).astype(np.float32),
    label=rng.integers(0, num_classes, n).astype(np.int32),
    mask=np.ones(n, np.float32),
  )


@pytest.mark.parametrize(
  "regularisers",
  [
    {},
    # The step's mixing happens on the global batch before the split into micro-batches.
    dict(cutmix_alpha=1.0),
    dict(mixup_alpha=0.4, cutmix_alpha=1.0, label_smoothing=0.1),
  ],
  ids=["plain", "cutmix", "mixup_cutmix_smoothing"],
)
def test_two_micro_batches_equal_one_batch(regularisers):
  batch = _batch()
  out = {}
  for accum in (1, 2):
    step, state = _step_fn(accum, **regularisers)
    window = train.empty_window()
    for _ in range(2):
      state, window, _ = step(state, batch, window)
    out[accum] = (state["params"], train.window_metrics(window))
  leaves = [jax.tree_util.tree_leaves(out[a][0]) for a in (1, 2)]
  for a, b in zip(*leaves, strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  for key in ("loss", "accuracy", "grad_norm", "examples"):
    np.testing.assert_allclose(out[1][1][key], out[2][1][key], rtol=1e-6)


def test_cutmix_changes_the_step_and_a_negative_alpha_stops_the_build():
  batch = _batch()
  plain, state = _step_fn(1)
  cut, _ = _step_fn(1, cutmix_alpha=1.0)
  # Steps 0 and 1 (keys of the step): at least one pastes a non-empty box.
  losses = []
  for step in (plain, cut):
    window, s = train.empty_window(), state
    for _ in range(2):
      s, window, _ = step(s, batch, window)
    losses.append(train.window_metrics(window)["loss"])
  assert losses[0] != losses[1]
  with pytest.raises(ValueError, match=r"config\.dataset\.cutmix_alpha=-1\.0 must be >= 0"):
    _step_fn(1, cutmix_alpha=-1.0)


def test_window_metrics_are_means_over_the_logging_window():
  step, state = _step_fn(1)
  window = train.empty_window()
  losses, hits, norms = [], [], []
  for seed in range(3):
    batch = _batch(seed=seed)
    # The loss and accuracy of this step alone, from a fresh window.
    _, alone, _ = step(state, batch, train.empty_window())
    alone = train.window_metrics(alone)
    losses.append(alone["loss"])
    hits.append(alone["accuracy"])
    norms.append(alone["grad_norm"])
    state, window, _ = step(state, batch, window)
  mean = train.window_metrics(window)
  np.testing.assert_allclose(mean["loss"], np.mean(losses), rtol=1e-5)
  np.testing.assert_allclose(mean["accuracy"], np.mean(hits), rtol=1e-6)
  np.testing.assert_allclose(mean["grad_norm"], np.mean(norms), rtol=1e-5)
  assert mean["examples"] == 24


def test_multi_label_accuracy_is_precision_at_1():
  num_classes = 4
  step, state = _step_fn(1, loss="sigmoid_xent", multi_label=True, num_classes=num_classes)
  batch = _batch(num_classes=num_classes)
  # The (zero-initialised) head scores every class alike: argmax picks class 0 for every image.
  labels = np.zeros((8, num_classes), np.float32)
  labels[:3, 0] = 1  # 3 images carry class 0 among their labels
  labels[:, 2] = 1  # all carry class 2, which top-1 accuracy against argmax(labels) would count
  batch["label"] = labels
  _, window, _ = step(state, batch, train.empty_window())
  assert train.window_metrics(window)["accuracy"] == pytest.approx(3 / 8)


def test_throughput_counts_only_the_accounts_training_phases(monkeypatch, tmp_path):
  from vit_jax.runtime import goodput

  clock, real = iter([0.0, 1.0, 10.0, 14.0, 18.0, 20.0]), goodput.time.perf_counter
  fake = this_thread.only(lambda: next(clock), real)  # the time module is every thread's
  monkeypatch.setattr(goodput.time, "perf_counter", fake)
  account = goodput.Account(str(tmp_path))  # t=0: startup
  account.enter("step")  # t=1
  throughput = logging_util.Throughput(account, batch_size=100, flops_per_step=None)
  throughput(0)  # t=10: 9 s of steps before the meter's start
  with account.phase("eval"):  # t=14 .. 18: an evaluation
    pass
  out = throughput(2)  # t=20: 2 steps in 20 - 10 - 4 seconds of training
  assert out["images_per_sec"] == pytest.approx(2 * 100 / 6)


def test_finetune_without_weights_is_refused(tmp_path):
  config = finetune.get_config("dataset=animal_mnist,runlocal")
  with pytest.raises(ValueError, match="init_from_scratch"):
    train.run(config, str(tmp_path / "ft"))
  assert not (tmp_path / "ft").exists()


def _tiny(total_steps=2):
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  config.evals = {}
  config.total_steps = total_steps
  config.checkpoint.every_steps = 2
  return config


def test_resume_with_another_config_is_refused_and_nothing_is_touched(tmp_path):
  run_dir = tmp_path / "run"
  train.run(_tiny(), str(run_dir), devices=jax.devices()[:1])
  before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
  saved = (run_dir / "config.json").read_text()

  changed = _tiny()
  changed.model.hidden_size = 48
  changed.optimizer.weight_decay = 0.5
  with pytest.raises(ValueError) as error:
    train.run(changed, str(run_dir), devices=jax.devices()[:1])
  message = str(error.value)
  assert "\n" not in message
  assert "model.hidden_size: 32 -> 48" in message and "optimizer.weight_decay" in message
  assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before
  assert (run_dir / "config.json").read_text() == saved

  # What may change on resume does not stop it: a longer run, other eval/log frequencies.
  longer = _tiny(total_steps=4)
  longer.log_every_steps = 1
  train.run(longer, str(run_dir), devices=jax.devices()[:1])
  assert json.loads((run_dir / "config.json").read_text())["total_steps"] == 4


def test_config_differences_list_only_frozen_fields():
  config = _tiny()
  saved = json.loads(config.to_json_best_effort())
  assert workdir.differences(saved, config) == []
  config.total_steps = 100
  config.mesh.fsdp = 2
  config.evals.val = dict(type="classification", every_steps=5)
  assert workdir.differences(saved, config) == []
  config.dataset.image_size = 24
  assert workdir.differences(saved, config) == ["dataset.image_size: 16 -> 24"]


def test_a_run_from_before_a_field_existed_resumes_with_the_field_off():
  config = _tiny()
  saved = json.loads(config.to_json_best_effort())
  del saved["label_smoothing"], saved["dataset"]["cutmix_alpha"]
  assert workdir.differences(saved, config) == []
  config.label_smoothing = 0.1  # on: not what the run was trained with
  assert workdir.differences(saved, config) == ["label_smoothing: '<absent>' -> 0.1"]


def test_every_added_field_is_a_config_field_whose_default_is_the_old_behaviour():
  from vit_jax.configs import pretrain

  fields = workdir.flatten(json.loads(pretrain.get_config("dataset=imagenet21k").to_json()))
  assert {key: fields.get(key, "<absent>") for key in workdir.ADDED_FIELDS} == workdir.ADDED_FIELDS


def test_write_json_is_atomic(tmp_path):
  path = tmp_path / "x.json"
  workdir.write_json(path, {"a": 1})
  workdir.write_json(path, {"a": 2})
  assert json.loads(path.read_text()) == {"a": 2}
  assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary left behind


def test_committed_steps_ignore_half_written_ones(tmp_path):

  train.run(_tiny(total_steps=4), str(tmp_path), devices=jax.devices()[:1])
  # A save cut short: Orbax's temporary directory of step 6, with a state inside.
  partial = tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp-1234"
  (partial / "state").mkdir(parents=True)
  assert train_state.committed_steps(tmp_path) == [2, 4]
  checkpointer = train_state.Checkpointer(str(tmp_path), every_steps=2, keep=3)
  assert checkpointer.latest_step() == 4
  checkpointer.close()
  params = train_state.restore_params(tmp_path)  # the latest committed step: 4
  step4 = train_state.restore_params(tmp_path / "checkpoints" / "4")
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(step4), strict=True):
    np.testing.assert_array_equal(a, b)


def test_small_replicated_arrays_are_saved_without_a_slice_per_replica(tmp_path, monkeypatch):
  """Orbax spreads the saving of an array replicated over 8 devices by cutting it into one
  slice per replica on the devices (a compiled program per shape, slice and device). Below
  train_state.MIN_REPLICA_SLICE_BYTES per slice an array is written whole by one replica; a
  larger one is still cut. Both restore exactly."""
  sliced = []
  slice_in_dim = jax.lax.slice_in_dim

  def spy(operand, *args, **kwargs):
    sliced.append(operand.shape)
    return slice_in_dim(operand, *args, **kwargs)

  monkeypatch.setattr(jax.lax, "slice_in_dim", spy)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  # 8 rows: one per replica. Small: 4 KiB per slice; big: just over the bound per slice.
  big_columns = train_state.MIN_REPLICA_SLICE_BYTES // 4 + 27
  values = {
    "small": np.arange(8 * 1013, dtype=np.float32).reshape(8, 1013),
    "big": np.arange(8 * big_columns, dtype=np.float32).reshape(8, big_columns),
  }
  state = {name: jax.device_put(x, replicated) for name, x in values.items()}
  checkpointer = train_state.Checkpointer(str(tmp_path), 1, 1, asynchronous=False)
  checkpointer.save(1, state, {"position": 0}, force=True)
  checkpointer.wait()
  assert sliced and set(sliced) == {(8, big_columns)}, sliced
  abstract = {
    name: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated) for name, x in values.items()
  }
  restored, data_state = checkpointer.restore(1, abstract)
  checkpointer.close()
  assert data_state == {"position": 0}
  for name, x in values.items():
    np.testing.assert_array_equal(np.asarray(restored[name]), x, err_msg=name)


def test_tensor_parallel_mesh_keeps_attention_in_xla():
  """cuDNN's fused attention cannot be split along heads: on a mesh with a 'model' axis the
  trainer builds the model with attention_kernel='xla'; otherwise the config's choice stands."""
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  assert config.model.attention_kernel == "auto"
  kernels = {}
  for model_axis in (1, 2):
    config.mesh.update(data=1, fsdp=-1, model=model_axis)
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:2])
    kernels[model_axis] = train.build(config, mesh, 10).model.attention_kernel
  assert kernels == {1: "auto", 2: "xla"}
  assert config.model.attention_kernel == "auto"  # the stage config itself is not changed


def test_checkpoint_load_model_reads_a_workdir_a_step_and_its_npz(tmp_path):
  """`checkpoint.load` / `load_model` take what `model_init` takes: the trainer's workdir (its
  latest step), one step directory, or an `.npz`; the model comes from the saved config."""
  from vit_jax import checkpoint

  config = _tiny(total_steps=4)
  train.run(config, str(tmp_path), devices=jax.devices()[:1])
  latest = train_state.restore_params(tmp_path)
  for path in (tmp_path, tmp_path / "checkpoints" / "4"):
    params = checkpoint.load(path)
    jax.tree.map(np.testing.assert_array_equal, params, latest)
  loaded = checkpoint.load_model(tmp_path)
  assert loaded.config.model.hidden_size == config.model.hidden_size
  assert loaded.model.num_classes == 10 and loaded.model.hidden_size == config.model.hidden_size
  size = config.dataset.image_size
  images = np.random.default_rng(0).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
  logits = loaded.model.apply({"params": loaded.params}, images, train=False)[0]
  assert logits.shape == (2, 10)
  (tmp_path / "exported").mkdir()
  checkpoint.save(loaded.params, tmp_path / "exported" / "model.npz")
  # No config.json beside it: the architecture comes from the parameter shapes.
  from_npz = checkpoint.load_model(tmp_path / "exported" / "model.npz")
  assert from_npz.config is None and from_npz.model.num_layers == config.model.num_layers
  np.testing.assert_allclose(
    from_npz.model.apply({"params": from_npz.params}, images, train=False)[0],
    logits,
    rtol=1e-6,
    atol=1e-6,
  )
