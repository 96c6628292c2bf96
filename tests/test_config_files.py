"""The `--config` flag's file resolution (vit_jax.runtime.config_files) and its misspelt-field lines."""

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO
from vit_jax.configs import common, pretrain
from vit_jax.runtime import config_files


def test_shipped_configs_are_one_module_each_however_named(tmp_path, monkeypatch):
  shipped = os.path.join(REPO, "configs", "pretrain.py")
  assert config_files.load(shipped) is pretrain
  monkeypatch.chdir(tmp_path)  # no configs/ here: the name still means the shipped file
  assert config_files.load("configs/pretrain.py") is pretrain
  assert config_files.load("configs/pretrain_mpp.py").pretrain is pretrain
  assert pretrain.common is common
  with pytest.raises(FileNotFoundError, match=r"configs/nope.py: no such file \(shipped: "):
    config_files.load("configs/nope.py")
  # A configs/ folder of the user's own is theirs: loaded from its path.
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "pretrain.py").write_text("def get_config(arg=None):\n  return arg\n")
  mine = config_files.load("configs/pretrain.py")
  assert mine is not pretrain and mine.get_config("x") == "x"


def test_a_users_config_builds_on_the_shipped_ones(tmp_path):
  path = tmp_path / "mine.py"
  path.write_text(
    "from vit_jax.configs import common, pretrain\n\n\n"
    "def get_config(arg=None):\n"
    "  config = pretrain.get_config(arg)\n"
    "  config.total_steps = 7\n"
    "  return config, common\n"
  )
  config, its_common = config_files.load(str(path)).get_config("dataset=fashion_mnist,runlocal")
  assert config.total_steps == 7 and config.stage == "pretrain" and its_common is common


def test_the_top_level_name_is_refused():
  out = subprocess.run(
    [sys.executable, "-c", "import configs"], cwd=REPO, capture_output=True, text=True
  )
  assert out.returncode == 1
  assert "import the stage configs as vit_jax.configs, not as 'configs'" in out.stderr


def test_a_misspelt_field_names_the_nearest_one():
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  assert config_files.unknown_field(config, "model.name") is None
  assert config_files.unknown_field(config, "evals.val.every_steps") is None
  near = {
    "modle.name": ("modle", "model.name"),
    "schedule.base_lx": ("schedule.base_lx", "schedule.base_lr"),
    "evals.val.every_step": ("evals.val.every_step", "evals.val.every_steps"),
    "learning_rat": ("learning_rat", "schedule.base_lr"),  # the metric's name
  }
  for field, (missing, nearest) in near.items():
    assert config_files.unknown_field(config, field) == (
      f"the config has no field {missing!r}; did you mean {nearest!r}?"
    )
  far = config_files.unknown_field(config, "model.zzzz")
  assert far.startswith("the config has no field 'model.zzzz' (model's fields: ")
  assert "hidden_size" in far


def test_overrides_are_read_in_every_spelling():
  argv = ["main", "--config=c.py", "--config.a.b=1", "--config.c", "2", "--noconfig.d", "--cfg.e"]
  assert config_files.override_paths(argv) == ["a.b", "c", "d"]
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  with pytest.raises(config_files.UnknownFieldError, match=r"^--config\.modle\.name: the config"):
    config_files.check_overrides(config, ["main", "--config.seed=1", "--config.modle.name=x"])
  config_files.check_overrides(config, ["main", "--config.seed=1", "--config.model.name=x"])
