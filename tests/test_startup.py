"""vit_jax.runtime.startup: a stage's first import runs without the cyclic garbage collector,
which is on again afterwards, with what the import made frozen out of its reach."""

import gc
import sys

import pytest

from vit_jax import stages
from vit_jax.runtime import startup

_MODULE = """
import gc
COLLECTOR_ON = gc.isenabled()
"""


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(str(tmp_path))
  freezes = []
  monkeypatch.setattr(gc, "freeze", lambda: freezes.append(gc.isenabled()))
  yield tmp_path, freezes
  for name in ("startup_probe", "startup_broken"):
    sys.modules.pop(name, None)


def test_the_first_import_runs_without_the_collector_then_freezes(module_dir):
  directory, freezes = module_dir
  (directory / "startup_probe.py").write_text(_MODULE)
  assert gc.isenabled()
  module = startup.import_module("startup_probe")
  assert module.COLLECTOR_ON is False
  assert gc.isenabled()
  assert freezes == [True]  # once, after the collector is back on
  assert startup.import_module("startup_probe") is module
  assert freezes == [True]  # imported already: nothing frozen again


def test_a_collector_turned_off_by_the_caller_stays_off(module_dir):
  directory, _ = module_dir
  (directory / "startup_probe.py").write_text(_MODULE)
  gc.disable()
  try:
    startup.import_module("startup_probe")
    assert not gc.isenabled()
  finally:
    gc.enable()


def test_a_failing_import_turns_the_collector_back_on(module_dir):
  directory, freezes = module_dir
  (directory / "startup_broken.py").write_text("raise RuntimeError('broken module')\n")
  with pytest.raises(RuntimeError, match="broken module"):
    startup.import_module("startup_broken")
  assert gc.isenabled()
  assert freezes == []


def test_stages_import_their_module_through_it(monkeypatch, tmp_path):
  """stages.run imports the trainer (or the linear probe) through startup.import_module."""
  from vit_jax.configs import pretrain

  imported = []

  class Stage:
    @staticmethod
    def run(config, workdir):
      return {"stage": config.stage}

  def fake_import(name):
    imported.append(name)
    return Stage

  monkeypatch.setattr(startup, "import_module", fake_import)
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  assert stages.run(config, str(tmp_path / "w")) == {"stage": "pretrain"}
  config.stage = "linear_probe"
  stages.run(config, str(tmp_path / "w"))
  assert imported == ["vit_jax.train", "vit_jax.linear_probe"]
