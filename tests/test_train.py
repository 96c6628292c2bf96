"""The trainer: each stage runs, meshes train as accurately as one device (against a float64
run), NaN stops cleanly, SIGKILL-and-resume is exact, Orbax keeps the last K steps, a bfloat16
model trains, a short run learns, and the linear probe's fits match scikit-learn's.

Runs use the 'testing' model on 16px Fashion-MNIST / Animal-MNIST (the offline `builtin`
datasets), on one of conftest.py's 8 simulated CPU devices unless the mesh is the subject.
"""

import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from tests.helpers import REPO, xla_env
from vit_jax import sharding, stages, train
from vit_jax.checkpoint.state import train_state
from vit_jax.configs import finetune, pretrain


def small_config(total_steps=6, every_steps=3, **mesh):
  """Pretrain demo config shrunk by runlocal, without evaluators, deterministic preprocessing."""
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  config.evals = {}
  config.total_steps = total_steps
  config.checkpoint.every_steps = every_steps
  config.checkpoint.keep = 10
  config.model.dropout_rate = 0.1
  config.accum_steps = 2
  config.mesh.update(mesh)
  return config


def _params(workdir):
  return train_state.restore_params(workdir)


def _assert_trees(a, b, exact=False, atol=1e-5):
  la, lb = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
  assert [p for p, _ in la] == [p for p, _ in lb]
  for (path, x), (_, y) in zip(la, lb, strict=True):
    if exact:
      np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))
    else:
      np.testing.assert_allclose(x, y, atol=atol, rtol=0, err_msg=jax.tree_util.keystr(path))


def test_stages_run_a_few_steps(tmp_path, trainer_on_one_device):
  """pretrain (with its evaluators) → finetune from its Orbax checkpoint at another resolution."""
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  config.evals.fewshot_animal_mnist.every_steps = 0  # at the end only
  del config.evals["fewshot_mnist_5k"]
  metrics = stages.run(config, str(tmp_path / "pretrain"))
  assert np.isfinite(metrics["loss"])
  # Few-shot on the downstream set, not on the pretraining data.
  assert "val/accuracy" in metrics and "fewshot_animal_mnist/1shot" in metrics
  assert (tmp_path / "pretrain" / "config.json").exists()
  assert train_state.Checkpointer(str(tmp_path / "pretrain"), 3, 2).latest_step() == 6

  config = finetune.get_config("dataset=animal_mnist,runlocal")
  config.model_init = str(tmp_path / "pretrain")
  config.dataset.image_size = 24  # 6×6 patches instead of 4×4: position embeddings resized
  metrics = stages.run(config, str(tmp_path / "finetune"))
  assert np.isfinite(metrics["loss"]) and "val/accuracy" in metrics
  params = _params(tmp_path / "finetune")
  assert params["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 37, 32)
  assert "pre_logits" not in params


def test_linear_probe_stage_runs(tmp_path, monkeypatch, trainer_on_one_device):
  """The probe's accuracies are those of scikit-learn's fits on the same features."""
  config = small_config(total_steps=2, every_steps=2)
  train.run(config, str(tmp_path / "pretrain"))
  from sklearn.linear_model import LogisticRegression, RidgeClassifier

  from vit_jax import evaluators, linear_probe
  from vit_jax.configs import linear_probe as probe_config

  features = []
  score = evaluators.LinearProbeEvaluator.score

  def spy(self, *args):
    features.append(args)
    return score(self, *args)

  monkeypatch.setattr(evaluators.LinearProbeEvaluator, "score", spy)
  config = probe_config.get_config("dataset=fashion_mnist,runlocal")
  config.model_init = str(tmp_path / "pretrain")
  returned = stages.run(config, str(tmp_path / "probe"))
  saved = linear_probe.read_results(tmp_path / "probe")
  assert saved["model_init"] == config.model_init and saved["dataset"] == "fashion_mnist"
  # The probe read the pre-logits of the pretrained backbone (width 32 under runlocal).
  assert saved["linear_probe/representation_size"] == 32
  for name in ("ridge_accuracy", "logreg_accuracy"):
    assert saved[f"linear_probe/{name}"] == returned[f"linear_probe/{name}"]

  ((x_train, y_train, x_test, y_test),) = features
  assert len(x_train) == len(x_test) == config.probe.max_examples
  # Ridge (one l2 value under runlocal, so no held-out choice): to {-1, +1} targets with an
  # intercept, on features centred by the training mean and scaled to unit norm per example.
  (ridge_l2,), (logreg_l2,) = config.probe.ridge_l2_regs, config.probe.logreg_l2_regs
  mean = x_train.mean(0)

  def unit(x):
    return (x - mean) / np.linalg.norm(x - mean, axis=1, keepdims=True)

  ridge = RidgeClassifier(alpha=ridge_l2).fit(unit(x_train), y_train)
  ridge_accuracy = np.mean(ridge.predict(unit(x_test)) == y_test)
  # Softmax regression on standardised features: mean cross-entropy + l2/2 |W|^2 is sklearn's
  # objective divided by C * n.
  mu, sigma = x_train.mean(0), x_train.std(0) + 1e-6
  logreg = LogisticRegression(C=1 / (logreg_l2 * len(x_train)), tol=1e-8, max_iter=10_000)
  logreg.fit((x_train - mu) / sigma, y_train)
  logreg_accuracy = np.mean(logreg.predict((x_test - mu) / sigma) == y_test)
  print(
    f"probe ridge {saved['linear_probe/ridge_accuracy']:.4f} (sklearn {ridge_accuracy:.4f})"
    f", logreg {saved['linear_probe/logreg_accuracy']:.4f} (sklearn {logreg_accuracy:.4f})"
  )
  # Two float32 solvers against float64 ones: an example whose two best classes tie to rounding
  # may go either way, hence one test example of slack.
  slack = 1.0 / len(x_test) + 1e-9
  assert abs(saved["linear_probe/ridge_accuracy"] - ridge_accuracy) <= slack
  assert abs(saved["linear_probe/logreg_accuracy"] - logreg_accuracy) <= slack
  # Measured 0.504 (ridge) and 0.516 (logreg) after 2 pretraining steps; chance is 0.1.
  assert min(ridge_accuracy, logreg_accuracy) > 0.3


@pytest.mark.slow  # BiT's compilations: minutes on 2 shared cores
def test_bit_stages_run_and_chain(tmp_path):
  """A BiT ResNet through the same stages: pretrain with its evaluators on an fsdp mesh →
  fine-tune from its Orbax checkpoint (new head) → linear probe and predict from it."""
  config = pretrain.get_config("dataset=fashion_mnist,model=R26x1,runlocal")
  assert config.model.name == "BiT-R26x1" and "dropout_rate" not in config.model
  config.total_steps = 2
  for name in config.evals:  # val and each downstream few-shot set: at the end only
    config.evals[name].every_steps = 0
  config.mesh.update(data=4, fsdp=2)
  metrics = stages.run(config, str(tmp_path / "pretrain"))
  assert (
    np.isfinite(metrics["loss"])
    and "val/accuracy" in metrics
    and "fewshot_animal_mnist/1shot" in metrics
  )
  pretrained = _params(tmp_path / "pretrain")
  assert pretrained["head"]["conv2d"]["kernel"].shape == (1, 1, 1024, 10)

  config = finetune.get_config("dataset=animal_mnist,model=R26x1,runlocal")
  config.model_init = str(tmp_path / "pretrain")
  config.total_steps = 2
  metrics = stages.run(config, str(tmp_path / "finetune"))
  assert np.isfinite(metrics["loss"]) and "val/accuracy" in metrics
  from vit_jax import inference
  from vit_jax.configs import linear_probe

  probe = linear_probe.get_config("dataset=mnist_5k,runlocal")
  probe.model_init = str(tmp_path / "pretrain")
  results = stages.run(probe, str(tmp_path / "probe"))  # config.json gives the architecture
  assert results["linear_probe/representation_size"] == 1024
  classifier = inference.Classifier(str(tmp_path / "finetune"))
  assert classifier.num_classes == 10 and classifier.image_size == 16


def test_checkpoints_keep_the_last_k_steps(tmp_path, monkeypatch):
  config = small_config(total_steps=5, every_steps=1)
  config.checkpoint.keep = 2
  # A relative workdir, as users type it (Orbax refuses relative checkpoint paths).
  monkeypatch.chdir(tmp_path)
  train.run(config, "run", devices=jax.devices()[:1])
  checkpointer = train_state.Checkpointer("run", 1, 2)
  assert checkpointer.all_steps() == [4, 5]
  checkpointer.close()
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["4", "5"]
  assert train_state.committed_steps("run") == [4, 5]
  assert jax.tree_util.tree_leaves(train_state.restore_params("run"))


def test_bfloat16_model_trains_and_resumes(tmp_path):
  """config.model.dtype='bfloat16': the loss falls from ln(10) (the zero-initialised head's),
  parameters stay float32, and the run resumes from its checkpoint."""
  config = small_config(total_steps=8, every_steps=8)
  config.model.dtype = "bfloat16"
  config.model.dropout_rate = 0.0
  config.log_every_steps = 4
  config.schedule.base_lr = 1e-2
  one = jax.devices()[:1]
  train.run(config, str(tmp_path), devices=one)
  params = _params(tmp_path)
  assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {np.dtype(np.float32)}
  config.total_steps = 16
  metrics = train.run(config, str(tmp_path), devices=one)  # resumes at step 8
  print(f"bfloat16: loss over steps 13-16 {metrics['loss']:.4f}")
  assert train_state.committed_steps(tmp_path) == [8, 16]
  # Measured 2.073 (2 CPU cores, AVX2); the zero-initialised head starts at ln(10) = 2.303.
  assert np.isfinite(metrics["loss"]) and metrics["loss"] < np.log(10) - 0.1


def test_training_learns_fashion_mnist(tmp_path):
  """A short run of the testing ViT on 16px Fashion-MNIST is well above chance (10%)."""
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  del config.evals["fewshot_animal_mnist"], config.evals["fewshot_mnist_5k"]
  config.total_steps = 300
  config.batch_size = 64
  config.log_every_steps = 100
  config.schedule.update(base_lr=3e-3, warmup_steps=20)
  config.checkpoint.every_steps = 300
  config.eval_batch_size = 250
  config.evals.val.update(every_steps=0, max_examples=1000)
  metrics = train.run(config, str(tmp_path), devices=jax.devices()[:1])
  print(f"learns: loss over steps 201-300 {metrics['loss']:.4f}, val {metrics['val/accuracy']:.4f}")
  # Pinned from a measured run (2 CPU cores, AVX2): val accuracy 0.698 on 1000 test images and a
  # training loss of 0.969 over the last 100 steps, down from ln(10) = 2.303 (the zero-initialised
  # head's); the bounds leave a margin for other CPUs' rounding of the same 300 steps.
  assert metrics["val/accuracy"] > 0.6
  assert metrics["loss"] < 1.2


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, trainer_on_one_device):
  config = small_config(total_steps=6, every_steps=1)
  config.log_every_steps = 100  # the check before each checkpoint must catch it on its own
  config.schedule.name = "constant"
  config.schedule.base_lr = 1e38  # step 1 gives finite params near float32's max, step 2 inf
  with pytest.raises(FloatingPointError, match=r"at step 2\b"):
    train.run(config, str(tmp_path))
  checkpointer = train_state.Checkpointer(str(tmp_path), 1, 10)
  assert checkpointer.all_steps() == [1]
  params = _params(tmp_path)
  assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(params))


_CHILD = textwrap.dedent(
  """
  import importlib, os, signal, sys
  sys.path[:0] = [{repo!r}, {tests!r}]
  from vit_jax.runtime import startup
  loop = startup.import_module("vit_jax.train.loop")  # as a command imports it
  from vit_jax import input_pipeline
  from vit_jax.checkpoint.state import train_state
  module, factory = {config_fn!r}.split(":")
  config = getattr(importlib.import_module(module), factory)()

  mode, at = sys.argv[1], int(sys.argv[2])
  if mode == "save":  # killed right after an asynchronous save of step `at` started
    save = train_state.Checkpointer.save
    def killing_save(self, step, *args, **kwargs):
      out = save(self, step, *args, **kwargs)
      if step == at:
        os.kill(os.getpid(), signal.SIGKILL)
      return out
    train_state.Checkpointer.save = killing_save
  else:  # killed when fetching the `at`-th batch of this process, between two steps
    fetch = input_pipeline.TrainIterator.__next__
    count = [0]
    def killing_next(self):
      count[0] += 1
      if count[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
      return fetch(self)
    input_pipeline.TrainIterator.__next__ = killing_next
  loop.run(config, sys.argv[3])
  """
)


def sigkill_config():
  """The config of test_sigkill_and_resume_is_exact (its child processes build it by name)."""
  return small_config(total_steps=8, every_steps=2, data=2, fsdp=2, model=2)


def run_child(mode, at, workdir, config_fn="test_train:sigkill_config"):
  """Runs `config_fn` ('module:factory' under tests/) in a child on 8 CPU devices, which
  SIGKILLs itself after the save of step `at` starts (mode 'save') or at its `at`-th batch
  (mode 'batch')."""
  code = _CHILD.format(repo=str(REPO), tests=str(REPO / "tests"), config_fn=config_fn)
  env = xla_env.child_env(8)
  proc = subprocess.run(
    [sys.executable, "-c", code, mode, str(at), str(workdir)],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


@pytest.mark.parametrize(
  "kills",
  [
    # Dies while step 4 is being written: in the default run with masked patch prediction
    # (test_mpp.py), here in the slow one.
    pytest.param([("save", 4)], marks=pytest.mark.slow),
    pytest.param([("batch", 3), ("save", 4), ("batch", 2)], marks=pytest.mark.slow),
  ],
)
def test_sigkill_and_resume_is_exact(tmp_path, kills):
  config = sigkill_config()
  train.run(config, str(tmp_path / "reference"))

  workdir = tmp_path / "killed"
  for mode, at in kills:
    run_child(mode, at, workdir)
  train.run(config, str(workdir))  # resumes and finishes
  _assert_trees(_params(workdir), _params(tmp_path / "reference"), exact=True)


def test_partition_rules_cover_params_and_optimizer_state():
  import ml_collections
  import optax
  from jax.sharding import PartitionSpec as P

  from vit_jax import models

  mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(data=2, fsdp=2, model=2)))
  for scan in (False, True):
    model = models.get_model("testing", 10, scan=scan, representation_size=32)
    params = jax.eval_shape(
      lambda m=model: m.init(jax.random.PRNGKey(0), np.zeros((1, 16, 16, 3)), train=False)
    )["params"]
    specs = jax.tree_util.tree_map(lambda s: s.spec, sharding.tree_shardings(params, mesh))
    block = specs["Transformer"]["encoderblock" if scan else "encoderblock_0"]
    lead = (None,) if scan else ()
    assert block["MultiHeadDotProductAttention_1"]["query"]["kernel"] == P(
      *lead, "fsdp", "model", None
    )
    assert block["MultiHeadDotProductAttention_1"]["out"]["kernel"] == P(
      *lead, "model", None, "fsdp"
    )
    assert block["MlpBlock_3"]["Dense_0"]["kernel"] == P(*lead, "fsdp", "model")
    assert block["MlpBlock_3"]["Dense_1"]["kernel"] == P(*lead, "model", "fsdp")
    assert all(a is None for a in block["LayerNorm_0"]["scale"])  # replicated
    assert specs["head"]["kernel"] == P("fsdp", None)
    assert all(a is None for a in specs["head"]["bias"])  # replicated
    opt_state = jax.eval_shape(optax.adam(1e-3).init, params)
    opt_specs = jax.tree_util.tree_map(lambda s: s.spec, sharding.tree_shardings(opt_state, mesh))
    assert opt_specs[0].mu == specs and opt_specs[0].nu == specs
    assert opt_specs[0].count == P()  # a scalar
  # BiT: convs shard their output channels, the head its input channels, GroupNorm replicated.
  model = models.get_model("R26x1", 10)
  params = jax.eval_shape(
    lambda: model.init(jax.random.PRNGKey(0), np.zeros((1, 32, 32, 3)), train=False)
  )["params"]
  specs = jax.tree_util.tree_map(lambda s: s.spec, sharding.tree_shardings(params, mesh))
  unit = specs["block1"]["unit01"]
  assert unit["b"]["standardized_conv2d"]["kernel"] == P(None, None, None, "fsdp")
  assert unit["a"]["proj"]["standardized_conv2d"]["kernel"] == P(None, None, None, "fsdp")
  assert specs["root_block"]["standardized_conv2d"]["kernel"] == P(None, None, None, "fsdp")
  assert all(a is None for a in unit["a"]["group_norm"]["gamma"])
  assert specs["head"]["conv2d"]["kernel"] == P(None, None, "fsdp", None)


def test_schedules_and_weight_decay():
  import ml_collections
  import optax

  from vit_jax.train import optim

  sched = optim.make_schedule(
    ml_collections.ConfigDict(dict(name="warmup_linear", base_lr=1.0, warmup_steps=10, end_lr=0.0)),
    110,
  )
  np.testing.assert_allclose(
    [sched(0), sched(5), sched(10), sched(60), sched(110)], [0, 0.5, 1, 0.5, 0], atol=1e-6
  )
  sched = optim.make_schedule(
    ml_collections.ConfigDict(dict(name="warmup_cosine", base_lr=1.0, warmup_steps=10, end_lr=0.0)),
    110,
  )
  np.testing.assert_allclose([sched(10), sched(60), sched(110)], [1, 0.5, 0], atol=1e-6)
  # Decoupled decay: zero gradients still shrink kernels by lr·wd, never biases.
  tx = optim.make_optimizer(
    ml_collections.ConfigDict(dict(name="adam", b1=0.9, b2=0.999, weight_decay=0.1)),
    optax.constant_schedule(0.5),
    grad_clip_norm=1.0,
  )
  params = {"kernel": np.ones((2, 2), np.float32), "bias": np.ones(2, np.float32)}
  grads = jax.tree_util.tree_map(np.zeros_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(updates["kernel"], -0.05)
  np.testing.assert_allclose(updates["bias"], 0.0)
