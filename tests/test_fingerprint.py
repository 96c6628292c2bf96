"""experiments/fingerprint.py: what it compares, with which tolerance, and that a change of the
data path (the resize filter of before a8be51a) moves the inputs' part beyond its tolerance."""

import json

import pytest

from experiments import demo, fingerprint
from tests.helpers import REPO
from vit_jax.input_pipeline.ops import preprocess

RESULTS = {
  "quick": True,
  "pretrain": {"loss": 2.0, "val/accuracy": 0.25, "step": 30.0, "wall_seconds": 41.0,
               "images_per_sec": 300.0, "pixels": {"logreg": 0.8, "train_examples": 2000}},
  "inputs": {"pretrain": {"train/image_sum": -1234.5}},
  "seconds": {"total": 100.0},
  "provenance": {"commit": "abc", "machine": {"cores": 2}},
}  # fmt: skip


def test_numbers_are_the_codes_not_the_machines():
  assert fingerprint.numbers(RESULTS) == {
    "pretrain/loss": 2.0,
    "pretrain/val/accuracy": 0.25,
    "pretrain/step": 30.0,
    "pretrain/pixels/logreg": 0.8,
    "pretrain/pixels/train_examples": 2000.0,
    "inputs/pretrain/train/image_sum": -1234.5,
  }
  assert [fingerprint.kind(k) for k in ("inputs/a/train/image_sum", "pretrain/step",
                                        "pretrain/val/loss", "labels/100/finetune")] == [
    "inputs", "count", "relative", "accuracy"
  ]  # fmt: skip


@pytest.mark.parametrize(
  "key, today, moved",
  [
    ("pretrain/val/accuracy", 0.25 + 0.01, False),  # 2 of 200 images: another CPU class
    ("pretrain/val/accuracy", 0.25 + 0.02, True),
    ("pretrain/loss", 2.0 * (1 + 5e-4), False),
    ("pretrain/loss", 2.0 * (1 + 2e-3), True),
    ("pretrain/step", 31.0, True),
    ("inputs/pretrain/train/image_sum", -1234.5 * (1 + 1e-12), False),
    ("inputs/pretrain/train/image_sum", -1234.5 + 2 / 255, True),  # one pixel one level
  ],
)
def test_differences_tolerate_the_cpu_class_and_nothing_more(key, today, moved):
  committed = fingerprint.numbers(RESULTS)
  lines = fingerprint.differences(committed, committed | {key: today})
  assert bool(lines) == moved and all(line.startswith(key) for line in lines)


def test_check_names_the_command_and_every_number_that_moved():
  committed = dict(RESULTS, fingerprint=fingerprint.numbers(RESULTS))
  fingerprint.check(committed, RESULTS, "python -m experiments.demo")
  today = json.loads(json.dumps(RESULTS))
  today["pretrain"]["loss"] = 2.5
  del today["pretrain"]["pixels"]["logreg"]
  today["pretrain"]["new"] = 1.0
  with pytest.raises(AssertionError) as e:
    fingerprint.check(committed, today, "python -m experiments.demo")
  message = str(e.value)
  assert "regenerate them with `python -m experiments.demo`" in message
  assert "pretrain/loss: committed 2, today 2.5" in message
  assert "pretrain/pixels/logreg: only in the committed fingerprint" in message
  assert "pretrain/new: only in today's run" in message
  with pytest.raises(AssertionError, match="no fingerprint: regenerate them"):
    fingerprint.check(RESULTS, RESULTS, "python -m experiments.demo")


def test_the_committed_demo_results_carry_a_fingerprint_of_their_quick_profile():
  committed = json.loads((REPO / "experiments/results/demo/results.json").read_text())
  keys = set(committed["fingerprint"])
  assert {"pretrain/val/accuracy", "pretrain/loss", "labels/200/finetune"} <= keys
  assert {"inputs/pretrain/train/image_sum", "inputs/finetune_200/eval/image_projection"} <= keys
  assert committed["fingerprint"]["pretrain/step"] == demo.QUICK.pretrain_steps


def test_the_resize_filter_of_before_moves_the_inputs(monkeypatch):
  """The demo's pretraining input today, then with the resize of before a8be51a (antialiased
  also where it enlarges: to float rounding the same filter, 0.5% of uint8 pixels one level
  apart): the inputs' part of the fingerprint tells them apart."""
  flags = demo.pretrain_flags(demo.QUICK, quick=True)
  today = fingerprint.data(flags)
  assert fingerprint.data(flags) == today  # the same pipeline, the same numbers
  monkeypatch.setattr(preprocess, "_shrinks", lambda *args: True)
  before = fingerprint.data(flags)
  lines = fingerprint.differences(
    {f"inputs/pretrain/{k}": v for k, v in today.items()},
    {f"inputs/pretrain/{k}": v for k, v in before.items()},
  )
  assert any("train/image_sum" in line for line in lines), lines
  assert not any("label_sum" in line or "mask_sum" in line for line in lines), lines


def test_a_default_the_quick_profile_overrides_is_caught_by_the_configs():
  """The demo's --quick sets its own pretraining steps, so its numbers cannot see the full
  profile's `total_steps`; the configs of the full run can."""
  from experiments import demo

  committed = dict(configs=fingerprint.configs(demo.stage_flags(demo.FULL, demo.WORKDIR)))
  fingerprint.check_configs(committed, dict(committed["configs"]), "cmd")
  today = dict(committed["configs"], **{"pretrain/total_steps": 3000})
  with pytest.raises(AssertionError, match=r"pretrain/total_steps: committed 6000, today 3000"):
    fingerprint.check_configs(committed, today, "cmd")


def test_a_field_added_at_its_neutral_value_is_no_config_difference():
  committed = {"configs": {"finetune/ViT/1of1/model.hidden_size": 64}}
  today = {"finetune/ViT/1of1/model.hidden_size": 64, "finetune/ViT/1of1/model.window_size": 0}
  fingerprint.check_configs(committed, today, "python -m experiments.x")  # workdir.ADDED_FIELDS
  today["finetune/ViT/1of1/model.window_size"] = 14  # added, but at a value that changes things
  with pytest.raises(AssertionError, match="model.window_size: committed '<absent>', today 14"):
    fingerprint.check_configs(committed, today, "python -m experiments.x")
