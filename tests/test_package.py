"""The package as a user installs it: a wheel built from this checkout (offline, setuptools),
installed outside it, runs a stage and the transfer tool with the configs it ships."""

import os
import shutil
import site
import subprocess
import sys
import zipfile

import pytest

from tests.helpers import REPO, xla_env

# What setup.py reads to build the wheel.
SOURCES = ("setup.py", "README.md", "LICENSE", "vit_jax", "configs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
  """The wheel of a copy of the checkout (a build writes build/ and *.egg-info in its tree)."""
  root = tmp_path_factory.mktemp("package")
  src = root / "src"
  src.mkdir()
  ignore = shutil.ignore_patterns("__pycache__", "*.so", "build", "*.egg-info")
  for name in SOURCES:
    path = os.path.join(REPO, name)
    if os.path.isdir(path):
      shutil.copytree(path, src / name, symlinks=True, ignore=ignore)
    else:
      shutil.copy(path, src / name)
  subprocess.run(
    [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    + ["--no-index", "-w", str(root / "dist"), str(src)],
    check=True,
    capture_output=True,
    env=dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1"),
    timeout=300,
  )
  (built,) = (root / "dist").glob("vit_jax-*.whl")
  return str(built)


def test_every_config_file_and_the_license_ship_in_the_wheel(wheel):
  names = set(zipfile.ZipFile(wheel).namelist())
  configs = sorted(f for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".py"))
  assert {"__init__.py", "common.py", "pretrain.py", "finetune.py"} <= set(configs)
  assert {f"vit_jax/configs/{f}" for f in configs} <= names
  assert not [n for n in names if n.startswith("configs/")]  # no top-level `configs` package
  kernels = sorted(
    f for f in os.listdir(os.path.join(REPO, "vit_jax", "kernels")) if f.endswith((".cc", ".h"))
  )
  assert kernels and {f"vit_jax/kernels/{f}" for f in kernels} <= names
  # setuptools < 77 writes <dist-info>/LICENSE, later ones <dist-info>/licenses/LICENSE (the
  # timm extra's torch brings setuptools 84).
  (license_file,) = [n for n in names if n.endswith((".dist-info/LICENSE", "licenses/LICENSE"))]
  assert "Apache License" in zipfile.ZipFile(wheel).read(license_file).decode()


def _installed(wheel, tmp_path) -> tuple[str, dict[str, str]]:
  """The wheel installed into a directory outside the checkout; (cwd, env) to run it from."""
  target = tmp_path / "site"
  subprocess.run(
    [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
    + ["--target", str(target), wheel],
    check=True,
    capture_output=True,
    env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"),
    timeout=300,
  )
  # `python -S`: no site-packages, so not the development install of the checkout; the
  # dependencies come from this environment's site-packages, after the installed package.
  path = [str(target), *site.getsitepackages()]
  env = xla_env.child_env(1, PYTHONPATH=os.pathsep.join(path), TF_CPP_MIN_LOG_LEVEL="2")
  cwd = tmp_path / "elsewhere"
  cwd.mkdir()
  return str(cwd), env


def _python(cwd, env, *args) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
  )


@pytest.mark.slow  # two 2-3 step runlocal stages and the transfer tool outside the checkout: 50-75 s
def test_the_installed_package_runs_its_configs_outside_a_checkout(wheel, tmp_path):
  cwd, env = _installed(wheel, tmp_path)
  site_dir = env["PYTHONPATH"].split(os.pathsep)[0]
  # The transfer tool finds its fine-tuning config in the package, and prints commands that
  # name it as configs/finetune.py, which vit_jax.main resolves from here too.
  probe = _python(
    cwd,
    env,
    "-c",
    "import vit_jax; from vit_jax.runtime import config_files; from vit_jax.tools import transfer\n"
    "options = dict(model='', runlocal=True, checkpoint='/x', overrides=[], workdir='/w')\n"
    "run = transfer.Run('animal_mnist', 0.1, True, options)\n"
    "flag = run.command().split()[3]\n"
    "print(vit_jax.__file__, transfer.finetune_module().__file__, run.config.stage, flag)\n"
    "print(config_files.load(flag.split('=')[1].split(':')[0]).__name__)",
  )
  assert probe.returncode == 0, probe.stderr[-3000:]
  (package, finetune, stage, flag), (loaded,) = [
    line.split() for line in probe.stdout.split("\n")[:2]
  ]
  assert package == os.path.join(site_dir, "vit_jax", "__init__.py")
  assert finetune == os.path.join(site_dir, "vit_jax", "configs", "finetune.py")
  assert stage == "finetune" and flag.startswith(
    "--config=configs/finetune.py:dataset=animal_mnist"
  )
  assert loaded == "vit_jax.configs.finetune"

  # A user's own config beside the run, building on a shipped one by import.
  with open(os.path.join(cwd, "my_pretrain.py"), "w") as f:
    f.write(
      "from vit_jax.configs import pretrain\n\n\n"
      "def get_config(arg=None):\n"
      "  config = pretrain.get_config(arg)\n"
      "  config.total_steps = 3\n"
      "  return config\n"
    )
  for config, steps, workdir in [
    ("configs/pretrain.py:dataset=fashion_mnist,runlocal --config.total_steps=2", 2, "shipped"),
    ("my_pretrain.py:dataset=fashion_mnist,runlocal", 3, "own"),
  ]:
    out = _python(
      cwd,
      env,
      "-m",
      "vit_jax.main",
      *f"--config={config}".split(),
      "--config.checkpoint.every_steps=2",
      *(f"--config.evals.{name}.every_steps=0" for name in ("val", "fewshot_animal_mnist")),
      f"--workdir={os.path.join(cwd, workdir)}",
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert os.path.exists(os.path.join(cwd, workdir, "final_metrics.json"))
    assert f"step {steps}/{steps}" in out.stdout + out.stderr
