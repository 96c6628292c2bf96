"""vit_jax.runtime.startup: a stage's first import in a command runs without the cyclic garbage
collector, which is on again afterwards, with what the import made frozen out of its reach; the
library (vit_jax.stages) imports without touching the collector."""

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


def test_the_library_imports_a_stage_without_touching_the_collector(
  module_dir, monkeypatch, tmp_path
):
  """stages.run imports the trainer (or the linear probe) as any import: nothing frozen."""
  from vit_jax.configs import pretrain

  directory, freezes = module_dir
  (directory / "startup_probe.py").write_text(_MODULE + "def run(config, workdir):\n  return {}\n")
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  assert stages.module_name("pretrain") == "vit_jax.train.loop"
  assert stages.module_name("linear_probe") == "vit_jax.linear_probe"
  with pytest.raises(ValueError, match="config.stage='nothing'"):
    stages.module_name("nothing")
  monkeypatch.setattr(stages, "module_name", lambda stage: "startup_probe")
  assert stages.run(config, str(tmp_path / "w")) == {}
  assert sys.modules["startup_probe"].COLLECTOR_ON is True
  assert freezes == []


def test_the_command_imports_the_stage_through_it(monkeypatch, tmp_path):
  """`python -m vit_jax.main` imports the stage's module through startup.import_module."""
  import types

  from vit_jax import main
  from vit_jax.configs import linear_probe

  imported, ran = [], []
  monkeypatch.setattr(startup, "import_module", imported.append)
  monkeypatch.setattr(stages, "run_and_record", lambda config, workdir: ran.append(config.stage))
  monkeypatch.setattr(main.cli, "run_stages", lambda body, *args, **kwargs: body())
  value = types.SimpleNamespace
  f = value(
    config=value(value=linear_probe.get_config("dataset=fashion_mnist,runlocal")),
    workdir=value(value=str(tmp_path / "w")),
    distributed=None,
    verbose=value(value=True),
    break_lock=value(value=False),
  )
  main.main(["vit_jax.main"], f)
  assert imported == ["vit_jax.linear_probe"] and ran == ["linear_probe"]
