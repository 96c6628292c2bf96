"""DeiT distillation: the distillation token of vit_jax.models.vit and the hard-label objective
of vit_jax.objectives.distill, through the trainer.

The token adds `dist_token` and `head_dist` and nothing else (off, the tree and the outputs are
today's); at inference the model predicts the average of its two heads; the loss is a float64
numpy reference's; the teacher's parameters are an argument of the step, not part of its state
or checkpoint; a bad teacher is one line naming `distill.teacher`; a student trains, evaluates
and resumes bitwise (in-process with an `.npz` teacher; slow: through `python -m vit_jax.main`
with a BiT ResNet teacher trained by the same trainer, then fine-tuned at another resolution); a
distilled checkpoint fine-tunes with both heads new and both prefix slots of its position
embeddings kept.
"""

import json
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.helpers import REPO, trees, xla_env
from vit_jax import checkpoint, inference, models, objectives, sharding, train
from vit_jax.checkpoint.state import train_state
from vit_jax.configs import finetune, pretrain
from vit_jax.objectives import distill, supervised
from vit_jax.runtime import goodput
from vit_jax.train import optim

ONE = jax.devices()[:1]


def _init(model, size=16, seed=0):
  x = jnp.zeros((1, size, size, 3))
  return model.init(jax.random.key(seed), x, train=False)["params"]


def _perturbed(params, seed=1, scale=0.05):
  """`params` plus noise: zero-initialised heads would make every logit 0."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [
    x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys, strict=True)
  ]
  return jax.tree_util.tree_unflatten(treedef, noisy)


def _images(n=8, seed=0):
  return np.random.default_rng(seed).uniform(-1, 1, (n, 16, 16, 3)).astype(np.float32)


def _save_teacher(path, num_classes=10, width=48):
  """A 'testing'-shaped ViT of another width (so none of its arrays can pass for the student's)
  as an `.npz` without a config: the loader infers its architecture."""
  model = models.get_model("testing", num_classes, hidden_size=width, mlp_dim=2 * width)
  checkpoint.save(jax.tree.map(np.asarray, _perturbed(_init(model), scale=0.2)), str(path))
  return str(path)


def _student_config(teacher, **fields):
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  config.evals = {}
  config.distill.teacher = teacher
  config.model.distill_token = True
  for key, value in fields.items():
    config[key] = value
  return config


# ---------------------------------------------------------------------------------------------
# The token.


def test_distill_token_adds_dist_token_and_head_dist_only():
  off = _init(models.get_model("testing", 10))
  on = _init(models.get_model("testing", 10, distill_token=True))
  flat_off, flat_on = checkpoint.flatten_params(off), checkpoint.flatten_params(on)
  assert set(flat_on) - set(flat_off) == {"dist_token", "head_dist/kernel", "head_dist/bias"}
  assert set(flat_off) <= set(flat_on)
  assert flat_on["dist_token"].shape == (1, 1, 32)
  assert np.std(flat_on["dist_token"]) > 0  # DeiT's normal(0.02), not zeros like `cls`
  # The same initialisation as `head` (zero kernel, head_bias_init bias).
  for leaf in ("kernel", "bias"):
    np.testing.assert_array_equal(flat_on[f"head_dist/{leaf}"], flat_on[f"head/{leaf}"])
  # 2 + 16 patches: the position embedding covers both tokens.
  assert flat_on[checkpoint.POSEMB].shape == (1, 18, 32)
  assert flat_off[checkpoint.POSEMB].shape == (1, 17, 32)
  # Every other parameter is what the model without the token initialises, bit for bit.
  for name, value in flat_off.items():
    if name != checkpoint.POSEMB:
      np.testing.assert_array_equal(flat_on[name], value, err_msg=name)
  assert checkpoint.num_prefix_tokens(on) == 2 and checkpoint.num_prefix_tokens(off) == 1


def test_without_the_token_the_tree_and_outputs_are_todays():
  assert models.get_model_config("testing").distill_token is False
  default, off = (
    models.get_model("testing", 10),
    models.get_model("testing", 10, distill_token=False),
  )
  params = _perturbed(_init(default))
  assert jax.tree_util.tree_structure(_init(off)) == jax.tree_util.tree_structure(params)
  assert sorted(params) == ["Transformer", "cls", "embedding", "head"]
  x = _images(4)
  for train_mode in (True, False):
    a, out_a = default.apply({"params": params}, x, train=train_mode)
    b, _ = off.apply({"params": params}, x, train=train_mode)
    assert a.shape == (4, 10) and "dist_logits" not in out_a  # one head, also in training
    np.testing.assert_array_equal(a, b)


def test_inference_is_the_average_of_the_two_heads(tmp_path):
  model = models.get_model("testing", 10, distill_token=True, representation_size=24)
  params = _perturbed(_init(model))
  x = _images(4)
  _, out = model.apply({"params": params}, x, train=True)
  cls_logits, dist_logits = out["class_logits"], out["dist_logits"]
  assert cls_logits.shape == dist_logits.shape == (4, 10)
  assert np.abs(cls_logits - dist_logits).max() > 1e-3  # two different heads
  predicted, out = model.apply({"params": params}, x, train=False)  # no dropout: the same tokens
  np.testing.assert_array_equal(predicted, (cls_logits + dist_logits) / 2)

  # The representation is the class token's pre-logits: the input of `head`.
  rep = np.asarray(out["pre_logits"])
  head = jax.tree.map(np.float64, params["head"])
  np.testing.assert_allclose(rep @ head["kernel"] + head["bias"], cls_logits, atol=1e-5)
  # Token maps leave both prefix tokens out.
  assert out["tokens"].shape == (4, 16, 32)
  assert out["blocks"][-1].shape == (4, 4, 4, 32)

  # A distilled `.npz` (the published layout plus the two names) loads with its architecture.
  path = tmp_path / "deit.npz"
  checkpoint.save(jax.tree.map(np.asarray, params), str(path))
  loaded = checkpoint.load_model(str(path))
  assert loaded.model_config.distill_token is True
  np.testing.assert_array_equal(
    loaded.model.apply({"params": loaded.params}, x, train=False)[0], predicted
  )
  assert inference.native_image_size(loaded.params, loaded.model) == 16
  with pytest.raises(ValueError, match="distill_token=True needs classifier='token'"):
    _init(models.get_model("testing", 10, distill_token=True, classifier="gap"))


def test_fine_tuning_a_distilled_checkpoint_replaces_both_heads(tmp_path):
  """load_pretrained at another resolution and number of classes: the position embeddings are
  resized on the grid behind both prefix slots (kept bit for bit), and `head_dist` is new like
  `head`."""
  old = _perturbed(_init(models.get_model("testing", 10, distill_token=True)))
  path = tmp_path / "deit.npz"
  checkpoint.save(jax.tree.map(np.asarray, old), str(path))
  config = models.get_model_config("testing")
  config.distill_token = True
  new = _perturbed(_init(models.get_model(config, 5), size=24), seed=7)
  adapted = checkpoint.load_pretrained(str(path), new, config)
  posemb = adapted["Transformer"]["posembed_input"]["pos_embedding"]
  assert posemb.shape == (1, 2 + 36, 32)
  old_posemb = old["Transformer"]["posembed_input"]["pos_embedding"]
  np.testing.assert_array_equal(posemb[:, :2], old_posemb[:, :2])
  np.testing.assert_array_equal(adapted["dist_token"], old["dist_token"])
  for head in ("head", "head_dist"):
    trees.assert_equal(adapted[head], jax.tree.map(np.asarray, new[head]))


# ---------------------------------------------------------------------------------------------
# The loss.


def _log_softmax64(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(axis=-1, keepdims=True)
  return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("token", [True, False], ids=["token", "class-head"])
@pytest.mark.parametrize("mixed", [False, True], ids=["labels", "mixed"])
def test_loss_matches_a_float64_reference(token, mixed):
  n, k, w = 8, 10, 0.3
  teacher_model = models.get_model("testing", k, hidden_size=48, mlp_dim=96)
  teacher_params = _perturbed(_init(teacher_model, seed=3), scale=0.3)
  teacher = distill.Teacher("<memory>", teacher_model, teacher_params, k)
  objective = distill.Distill(supervised.Supervised("softmax_xent", k), teacher, w)
  model = models.get_model("testing", k, distill_token=token)
  params = _perturbed(_init(model), scale=0.2)
  rng = np.random.default_rng(0)
  labels = rng.integers(0, k, n).astype(np.int32)
  if mixed:  # mixup's dense targets
    labels = 0.7 * np.eye(k)[labels] + 0.3 * np.eye(k)[rng.integers(0, k, n)]
  batch = dict(image=_images(n), label=labels, index=jnp.arange(n))
  loss, correct = objective.per_example(model, params, batch, jax.random.key(0), teacher_params)

  logits, out = model.apply({"params": params}, batch["image"], train=True)
  z_cls, z_dist = (out["class_logits"], out["dist_logits"]) if token else (logits, logits)
  y_t = teacher_model.apply({"params": teacher_params}, batch["image"], train=False)[0]
  y_t = np.argmax(y_t, -1)
  targets = np.eye(k)[labels] if not mixed else labels
  assert (y_t != np.argmax(targets, -1)).any()  # the two terms' labels differ
  ce_label = -(targets * _log_softmax64(z_cls)).sum(-1)
  ce_teacher = -_log_softmax64(z_dist)[np.arange(n), y_t]
  reference = (1 - w) * ce_label + w * ce_teacher
  np.testing.assert_allclose(loss, reference, rtol=1e-5, atol=1e-6)
  average = (np.float64(z_cls) + np.float64(z_dist)) / 2
  np.testing.assert_array_equal(correct, np.argmax(average, -1) == np.argmax(targets, -1))


# ---------------------------------------------------------------------------------------------
# The teacher in the step.


def test_teacher_params_are_a_step_argument_not_state(tmp_path):
  teacher_path = _save_teacher(tmp_path / "teacher.npz")
  config = _student_config(teacher_path)
  mesh = sharding.make_mesh(config.mesh, ONE)
  built = train.build(config, mesh, 10)
  assert isinstance(built.objective, distill.Distill)
  assert set(built.abstract_state) == {"step", "params", "opt_state", "rng"}
  # No array of the width-48 teacher in the state: the optimizer holds Adam's two moments of
  # the student's parameters and nothing else.
  sizes = lambda tree: sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(tree))  # noqa: E731
  params_size = sizes(built.abstract_state["params"])
  moments = [x for x in jax.tree_util.tree_leaves(built.abstract_state["opt_state"]) if x.ndim]
  assert sum(np.prod(x.shape) for x in moments) == 2 * params_size
  assert all(48 not in x.shape for x in jax.tree_util.tree_leaves(built.abstract_state))
  # Lowered with the teacher as shapes only: it is an argument of the program, not a constant.
  abstract = lambda tree, shardings: jax.tree.map(  # noqa: E731
    lambda x, s: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=s), tree, shardings
  )
  teacher = abstract(built.objective.teacher.params, built.teacher_shardings)
  batch = dict(
    image=jax.ShapeDtypeStruct((16, 16, 16, 3), jnp.float32),
    label=jax.ShapeDtypeStruct((16,), jnp.int32),
    mask=jax.ShapeDtypeStruct((16,), jnp.float32),
  )
  state = train_state.abstract_tree(built.abstract_state, built.state_shardings)
  lowered = built.jit_step(batch).lower(state, batch, train.abstract_window(mesh), teacher)
  args, _ = lowered.args_info
  assert len(args) == 4
  assert len(jax.tree_util.tree_leaves(args[3])) == len(jax.tree_util.tree_leaves(teacher)) > 20


def test_a_step_with_a_teacher_accumulates_like_one_batch(tmp_path):
  """The trainer's step (make_train_step) with the objective: micro-batches give the one-batch
  result, and the teacher's parameters are read, not changed."""
  teacher_path = _save_teacher(tmp_path / "teacher.npz")
  config = _student_config(teacher_path)
  objective = objectives.get(config, 10)
  model = objective.model(config.model, None)
  schedule = optax.constant_schedule(0.1)
  tx = optim.make_optimizer(pretrain.common.sgd_config(), schedule, grad_clip_norm=1.0)
  mesh = sharding.make_mesh(config.mesh, ONE)
  params = _perturbed(_init(model))
  rng = np.random.default_rng(0)
  batch = dict(
    image=_images(8),
    label=rng.integers(0, 10, 8).astype(np.int32),
    mask=np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float32),
  )
  teacher = jax.tree.map(jnp.asarray, objective.teacher.params)
  before = jax.tree.map(np.array, teacher)
  out = {}
  for accum in (1, 2):
    step = jax.jit(train.make_train_step(objective, model, tx, schedule, accum, mesh))
    state = dict(step=jnp.int32(0), params=params, opt_state=tx.init(params), rng=jax.random.key(1))
    window = train.empty_window()
    for _ in range(2):
      state, window, _ = step(state, batch, window, teacher)
    out[accum] = (state["params"], train.window_metrics(window))
  for a, b in zip(*(jax.tree_util.tree_leaves(out[a][0]) for a in (1, 2)), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  np.testing.assert_allclose(out[1][1]["loss"], out[2][1]["loss"], rtol=1e-6)
  trees.assert_equal(jax.tree.map(np.asarray, teacher), before)


def test_bad_teacher_configs_fail_in_one_line(tmp_path):
  def error(config):
    with pytest.raises(ValueError) as e:
      objectives.get(config, 10)
    assert "\n" not in str(e.value)
    return str(e.value)

  missing = str(tmp_path / "nowhere")
  assert (
    error(_student_config(missing)) == f"distill.teacher={missing!r}: no such file or directory"
  )
  seven = _save_teacher(tmp_path / "seven.npz", num_classes=7)
  assert error(_student_config(seven)) == (
    f"distill.teacher={seven!r} predicts 7 classes but the dataset has 10"
  )
  config = _student_config("")
  assert "model.distill_token=True without distill.teacher" in error(config)
  ten = _save_teacher(tmp_path / "ten.npz")
  config = _student_config(ten)
  config.distill.weight = 1.5
  assert error(config) == "distill.weight=1.5; expected a number in [0, 1]"
  config = _student_config(ten, loss="mpp")
  assert "distillation needs a classification loss" in error(config)
  # A preset for a checkpoint without config: the 'testing' preset is not this width-48 teacher.
  config = _student_config(ten)
  config.distill.teacher_model = "testing"
  assert error(config) == (
    f"distill.teacher={ten!r} does not fit teacher_model='testing': "
    "'Transformer/encoder_norm/bias' is (48,) there, (32,) in the model"
  )


# ---------------------------------------------------------------------------------------------
# Through the trainer.


def test_a_student_trains_evaluates_and_resumes_bitwise(tmp_path):
  """In-process, on one device, an `.npz` teacher: the run evaluates the averaged heads, saves
  no teacher, and a rerun from its step-3 checkpoint reproduces step 6 bit for bit."""
  teacher_path = _save_teacher(tmp_path / "teacher.npz")
  config = _student_config(teacher_path)
  config.evals = {"val": dict(type="classification", every_steps=0, max_examples=32)}
  config.accum_steps = 2
  workdir = tmp_path / "student"
  metrics = train.run(config, str(workdir), devices=ONE)
  assert np.isfinite(metrics["loss"]) and 0 <= metrics["val/accuracy"] <= 1
  assert train_state.committed_steps(workdir) == [3, 6]
  final = train_state.restore_params(workdir)
  assert {"dist_token", "head_dist", "head", "cls"} <= set(final)
  assert all(48 not in np.shape(x) for x in jax.tree_util.tree_leaves(final))
  shutil.rmtree(workdir / "checkpoints" / "6")
  train.run(config, str(workdir), devices=ONE)  # resumes at step 3, the teacher reloaded
  assert _start_steps(workdir) == [0, 3]
  resumed = train_state.restore_params(workdir)
  trees.assert_equal(resumed, final)


def _start_steps(workdir):
  """The step each attempt of the run started from (vit_jax.runtime.goodput's ledger)."""
  ledger = json.loads((workdir / goodput.FILE).read_text())
  return [attempt["start_step"] for attempt in ledger["attempts"]]


@pytest.mark.slow  # a BiT teacher, two runs of the entry point, a fine-tune: 56 s (2-core EPYC)
def test_a_bit_teacher_through_the_entry_point(tmp_path):
  """A BiT ResNet trained by this trainer teaches a ViT with a distillation token, run as users
  run it (`python -m vit_jax.main ... --config.distill.teacher=<workdir>`); killed after its
  last checkpoint is lost, the rerun resumes at step 3 and ends at the same parameters."""
  teacher = pretrain.get_config("dataset=fashion_mnist,model=R26x1,runlocal")
  teacher.evals = {}
  teacher.total_steps = 2
  train.run(teacher, str(tmp_path / "teacher"), devices=ONE)

  workdir = tmp_path / "student"
  command = [
    sys.executable,
    "-m",
    "vit_jax.main",
    "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
    f"--config.distill.teacher={tmp_path / 'teacher'}",
    "--config.model.distill_token=True",
    "--config.evals.fewshot_animal_mnist.every_steps=-1",
    "--config.evals.fewshot_mnist_5k.every_steps=-1",
    f"--workdir={workdir}",
  ]
  env = xla_env.child_env(1, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")

  def main():
    proc = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((workdir / "final_metrics.json").read_text())

  metrics = main()
  assert np.isfinite(metrics["loss"]) and "val/accuracy" in metrics
  final = train_state.restore_params(workdir)
  assert "dist_token" in final and "head_dist" in final and "root_block" not in final
  shutil.rmtree(workdir / "checkpoints" / "6")
  (workdir / "final_metrics.json").unlink()
  main()
  assert _start_steps(workdir) == [0, 3]
  trees.assert_equal(train_state.restore_params(workdir), final)

  # The next stage: fine-tuned from the student at 24px (its architecture, both heads new), the
  # same teacher at the new resolution.
  config = finetune.get_config("dataset=animal_mnist,runlocal")
  config.model_init = str(workdir)
  config.dataset.image_size = 24
  config.distill.teacher = str(tmp_path / "teacher")
  config.evals = {}
  metrics = train.run(config, str(tmp_path / "finetune"), devices=ONE)
  tuned = train_state.restore_params(tmp_path / "finetune")
  assert np.isfinite(metrics["loss"]) and tuned["head_dist"]["kernel"].shape == (32, 10)
  assert tuned["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 2 + 36, 32)
