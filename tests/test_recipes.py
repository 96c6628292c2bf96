"""configs/recipes.py: the paper's, AugReg's and the 2022 plain-ViT recipes as config presets."""

import json
import sys

import numpy as np
import pytest

from tests.helpers import REPO
from tests.helpers.libtpu_process import needs_libtpu, run_with_libtpu
from vit_jax.configs import pretrain, recipes
from vit_jax.train import optim

# The planner's v3-8 figures for plain2022's ImageNet-1k ViT-S/16 (docs/training.md).
S16_PLAN = REPO / "experiments/results/plain2022_s16_i1k/plan_v3_8.json"


def _pretrain(arg):
  return pretrain.get_config(arg)


def test_the_papers_recipe_is_the_default_and_changes_nothing():
  assert (
    _pretrain("dataset=imagenet21k").to_dict()
    == _pretrain("dataset=imagenet21k,recipe=paper").to_dict()
  )


def test_plain2022_on_imagenet_is_big_visions_vit_s16_config():
  c = _pretrain("dataset=imagenet2012,model=S/16,recipe=plain2022")
  assert c.batch_size == 1024
  assert c.dataset.train_split == "train[:99%]"
  # 90 epochs of 99% of ImageNet-1k's 1,281,167 training images at batch 1024.
  assert c.total_steps == round(90 * 1_281_167 * 0.99 / 1024)
  assert c.dataset.pp_train.split("|")[-2:] == ["randaugment(2, 10)", "value_range(-1, 1)"]
  assert c.dataset.mixup_alpha == 0.2
  assert (c.model.classifier, c.model.posemb) == ("gap", "sincos2d")
  assert c.model.dropout_rate == 0.0
  assert (c.schedule.name, c.schedule.base_lr, c.schedule.warmup_steps) == (
    "warmup_cosine",
    1e-3,
    10_000,
  )
  assert (c.optimizer.weight_decay, c.optimizer.mu_dtype, c.grad_clip_norm) == (
    0.1,
    "bfloat16",
    1.0,
  )
  assert c.loss == "softmax_xent"


def test_our_weight_decay_of_the_recipes_is_big_visions_1e_4():
  """big_vision: p ← p − s_t·(lr·u + 1e-4·p); ours: p ← p − lr·s_t·wd·p. With a zero gradient
  (u = 0) at the schedule's peak (s_t = 1: no warm-up) one step must remove 1e-4·p."""
  c = _pretrain("dataset=imagenet2012,model=S/16,recipe=plain2022")
  c.schedule.warmup_steps = 0
  schedule = optim.make_schedule(c.schedule, c.total_steps)
  assert float(schedule(0)) == pytest.approx(1e-3)
  tx = optim.make_optimizer(c.optimizer, schedule, c.grad_clip_norm)
  kernel = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)
  params = {"Dense_0": {"kernel": kernel}}
  zeros = {"Dense_0": {"kernel": np.zeros_like(kernel)}}
  updates, _ = tx.update(zeros, tx.init(params), params)
  expected = -1e-4 * kernel.astype(np.float64)
  np.testing.assert_allclose(np.asarray(updates["Dense_0"]["kernel"]), expected, rtol=1e-6)


@pytest.mark.parametrize(
  "arg,level",
  [
    ("dataset=imagenet2012,model=B/16,recipe=augreg", "medium2"),
    ("dataset=imagenet2012,model=Ti/16,recipe=augreg,lr=3e-3,epochs=300", "light1"),
    ("dataset=imagenet21k,model=B/16,recipe=augreg", "light2"),
    ("dataset=imagenet21k,model=B/16,recipe=augreg,aug=strong2", "strong2"),
    ("dataset=imagenet2012,model=S/16,recipe=plain2022,aug=none", "none"),
  ],
)
def test_augregs_levels_set_randaugment_and_mixup(arg, level):
  c = _pretrain(arg)
  randaug, mixup = recipes.AUG_LEVELS[level]
  ops = c.dataset.pp_train.split("|")
  assert [o for o in ops if o.startswith("randaugment")] == (
    [f"randaugment({randaug[0]}, {randaug[1]})"] if randaug else []
  )
  assert c.dataset.mixup_alpha == mixup


def test_a_given_lr_wins_over_the_recipes():
  c = _pretrain("dataset=imagenet2012,model=Ti/16,recipe=augreg,lr=3e-3,epochs=300")
  assert c.schedule.base_lr == 3e-3
  assert c.total_steps == round(300 * 1_281_167 / 4096)


def test_a_bit_resnet_takes_the_recipes_optimizer_and_data_only():
  c = _pretrain("dataset=jft,model=R50x1,recipe=plain2022")
  assert "classifier" not in c.model and "posemb" not in c.model
  assert c.dataset.mixup_alpha == 0.2 and c.schedule.base_lr == 1e-3


@pytest.mark.parametrize(
  "arg,culprit",
  [
    ("dataset=imagenet21k,recipe=deit", "recipe='deit'"),
    ("dataset=imagenet21k,recipe=augreg,aug=heavy", "aug='heavy'"),
    ("dataset=imagenet21k,aug=light1", "aug='light1' needs recipe=augreg or plain2022"),
    ("dataset=imagenet21k,model=Ti/16,recipe=augreg", "give epochs="),
  ],
)
def test_a_bad_recipe_argument_is_one_line_naming_it(arg, culprit):
  with pytest.raises(ValueError, match="^[^\\n]*$") as e:
    _pretrain(arg)
  assert culprit in str(e.value)


def test_randaugment_goes_before_value_range_or_at_the_end():
  assert recipes.with_randaugment("decode|resize|value_range(-1, 1)", 2, 15) == (
    "decode|resize|randaugment(2, 15)|value_range(-1, 1)"
  )
  assert recipes.with_randaugment("decode|resize", 2, 0) == "decode|resize|randaugment(2, 0)"


def test_the_committed_s16_plan_is_of_todays_config():
  plan = json.loads(S16_PLAN.read_text())
  config = _pretrain("dataset=imagenet2012,model=S/16,recipe=plain2022")
  assert plan["total_steps"] == config.total_steps
  assert plan["settings"]["batch_size"] == config.batch_size
  assert "dataset=imagenet2012,model=S/16,recipe=plain2022" in plan["command"]


@pytest.mark.slow  # one compile of ViT-S/16's step for a v3-8 with libtpu, about 30 s
@needs_libtpu
def test_the_committed_s16_plan_is_what_the_planner_compiles_today():
  """The file's memory, FLOPs and collectives are the compiler's for today's code (its command,
  rerun); a change of the step or the recipe that moves them fails here until the file is
  written again."""
  plan = json.loads(S16_PLAN.read_text())
  out = run_with_libtpu([sys.executable, *plan["command"].split()[1:]], timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  today = json.loads(out.stdout)
  for key in ("fits", "settings", "mesh", "model_flops", "stats", "step_seconds"):
    assert today[key] == plan[key], key
