"""The transfer suite runner: the VTAB-1k plan, costs, choice and table with each run's metrics
made up; the command itself (`python -m vit_jax.tools.transfer`, a child process) on mock tfds
ImageNet with its ReaL labels, a tiny model and a grid of two (its flags, the runs it prints,
results.json and table.md against the runs' own metrics, the paper column, `--config_override`,
and one line for an unknown dataset); end to end (slow): a VTAB-1k task on mock tfds data (a
rerun that skips finished runs and resumes an unfinished one), and the offline suite with its
pixel baselines."""

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest
import test_vtab  # tests/: mock records for the VTAB builders
from tensorflow_datasets.testing import mocking as tfds_mocking

from tests.helpers import REPO, random_weights, xla_env
from vit_jax.tools import transfer


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A 'testing' ViT as a published-layout .npz (what runlocal fine-tunes)."""
  return random_weights.random_npz(
    str(tmp_path_factory.mktemp("pretrained") / "testing.npz"), seed=0
  )


def test_bad_suite_and_overrides_are_named():
  with pytest.raises(ValueError, match="unknown dataset 'vtab/nope'"):
    transfer.suite_datasets("cifar10,vtab/nope")
  assert len(transfer.suite_datasets("vtab")) == 19
  options = dict(checkpoint="x.npz", workdir="/w", model="", runlocal=True, overrides=["nope=1"])
  with pytest.raises(ValueError, match="no field 'nope'"):
    transfer.Run("cifar10", 0.01, True, options)
  options["overrides"] = ["checkpoint.asynchronous=yes"]
  with pytest.raises(ValueError, match="is a bool"):
    transfer.Run("cifar10", 0.01, True, options)
  options["overrides"] = ["checkpoint.keep=5", "dataset.data_dir=/data"]
  run = transfer.Run("cifar10", 0.01, True, options)
  assert run.config.checkpoint.keep == 5 and run.config.dataset.data_dir == "/data"
  assert len(transfer.suite_datasets("table2")) == 24


def test_vtab_suite_plan_choice_and_table(tmp_path, monkeypatch, capsys):
  # The whole VTAB-1k suite at the paper's budgets, each run replaced by one that records
  # made-up metrics: minival is best at lr 0.003 for every task, except dtd (0.01).
  def execute(run):
    lr, holdout = run.config.schedule.base_lr, "minival" in run.config.evals
    best = 0.01 if run.config.dataset.vtab_task == "dtd" else 0.003
    metrics = {"minival/accuracy": 0.9 - abs(lr - best)} if holdout else {"val/accuracy": lr * 10}
    (pathlib.Path(run.workdir)).mkdir(parents=True)
    (pathlib.Path(run.workdir) / "final_metrics.json").write_text(json.dumps(metrics))
    return metrics

  monkeypatch.setattr(transfer.Run, "execute", execute)
  results = transfer.run_suite("vtab", "gs://b/ViT-L_16.npz", str(tmp_path), model="L/16")
  out = capsys.readouterr().out
  # What a pod user sees first: 19 × (4 grid + 1 final) runs of 2,500 steps at batch 512.
  assert "suite vtab: 19 datasets, 95 runs (grid + final per dataset), 121,600,000 training" in out
  assert "vtab/svhn grid 3/4 lr=0.01: 2,500 steps, 1,280,000 training images" in out
  assert "--config=configs/finetune.py:dataset=vtab/svhn,lr=0.01,holdout=true,model=L/16" in out
  assert results["datasets"]["vtab/dtd"]["lr"] == 0.01
  assert results["datasets"]["vtab/kitti_dist"]["lr"] == 0.003
  assert results["datasets"]["vtab/kitti_dist"]["test"] == pytest.approx(0.03)
  assert results["vtab"]["mean"] == pytest.approx((18 * 0.03 + 0.1) / 19)
  assert results["vtab"]["natural"] == pytest.approx((6 * 0.03 + 0.1) / 7)
  table = (tmp_path / "table.md").read_text()
  assert "| vtab/dtd | 0.01 | 90.00 | 10.00 |  |" in table
  assert f"| VTAB-1k mean (19 tasks) | | | {100 * results['vtab']['mean']:.2f} |" in table
  # A rerun runs nothing.
  monkeypatch.setattr(transfer.Run, "execute", lambda run: pytest.fail(run.workdir))
  again = transfer.run_suite("vtab", "gs://b/ViT-L_16.npz", str(tmp_path), model="L/16")
  assert again["datasets"] == results["datasets"]
  assert capsys.readouterr().out.count("finished earlier") == 95


# `python -m vit_jax.tools.transfer` (its own flag parsing, console and exit status) inside
# tfds.testing.mock_data: tfds imagenet2012 is 40 random 20px images of classes 0-4 for every
# training split (the grid's, minival, the final run's), 40 others for validation;
# imagenet2012_real the validation images with ReaL sets {label, label + 1}, the last 10 with
# none (ReaL leaves those out). So minival, val and ReaL top-1 differ.
_CHILD = textwrap.dedent(
  """
  import runpy, sys
  import numpy as np
  import tensorflow as tf
  from tensorflow_datasets.testing import mocking

  def records(self, split, decoders=None, read_config=None, **kwargs):
    validation = str(getattr(split, "split", split)).startswith("validation")
    rng = np.random.default_rng(int(validation))
    images = [tf.io.encode_png(rng.integers(0, 256, (20, 20, 3), np.uint8)) for _ in range(40)]
    labels = rng.integers(0, 5, 40)
    features = dict(image=tf.stack(images), label=labels)
    if self.name == "imagenet2012_real":
      sets = [[int(y), (int(y) + 1) % 5] if i < 30 else [] for i, y in enumerate(labels)]
      features["real_label"] = tf.ragged.constant(sets, dtype=tf.int64)
    return tf.data.Dataset.from_tensor_slices(features)

  with mocking.mock_data(policy=mocking.MockPolicy.USE_CODE, as_dataset_fn=records):
    sys.argv[0] = "vit_jax.tools.transfer"
    runpy.run_module("vit_jax.tools.transfer", run_name="__main__", alter_sys=True)
  """
)
GRID = (0.01, 0.03)


def _transfer(args, cache_dir, code=None):
  """The transfer command in a child process (one CPU device) from the repository root."""
  env = xla_env.child_env(
    1, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", TF_CPP_MIN_LOG_LEVEL="2"
  )
  # The final run compiles the step of a grid run again: the test session's cache (conftest.py)
  # if it has one, else one of this module's.
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_dir))
  argv = ["-c", code] if code else ["-m", "vit_jax.tools.transfer"]
  return subprocess.run(
    [sys.executable, *argv, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=600
  )


@pytest.fixture(scope="module")
def imagenet_suite(tmp_path_factory):
  """One run of the command over mock ImageNet: (the process, its workdir, the checkpoint)."""
  root = tmp_path_factory.mktemp("transfer_cli")
  # A one-layer 'testing' ViT: only the --config_override below makes the runs' model fit it.
  path = random_weights.random_npz(str(root / "one_layer.npz"), seed=0, num_layers=1)
  workdir = root / "suite"
  args = [
    f"--checkpoint={path}",
    "--model=B/16",  # a preset name on the config string (runlocal then picks 'testing')
    "--suite=imagenet2012",
    f"--grid={','.join(map(str, GRID))}",
    "--runlocal",
    "--paper=L/16-i21k",
    f"--workdir={workdir}",
    "--config_override=model.num_layers=1",
    "--config_override=total_steps=3",  # one save and one evaluation per run
    # Synchronous saves: an asynchronous write could be in flight while mock_data swaps tfds.
    "--config_override=checkpoint.asynchronous=false",
  ]
  proc = _transfer(args, root / "jax_cache", code=_CHILD)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  return proc, workdir, path


def _metrics(workdir: pathlib.Path, run: str) -> dict:
  return json.loads((workdir / "imagenet2012" / run / "final_metrics.json").read_text())


def _config(workdir: pathlib.Path, run: str) -> dict:
  return json.loads((workdir / "imagenet2012" / run / "config.json").read_text())


@pytest.mark.slow  # the command end to end (with the next test); the default tier plans and tables
def test_command_runs_the_grid_and_the_final_run(imagenet_suite):
  proc, workdir, path = imagenet_suite
  out = proc.stdout
  # 2 grid runs + 1 final, 3 steps (the override) of batch 16 (runlocal) each.
  assert "suite imagenet2012: 1 datasets, 3 runs (grid + final per dataset), 144 training " in out
  assert "== imagenet2012 grid 2/2 lr=0.03: 3 steps, 48 training images" in out
  assert "finished earlier" not in out
  for lr in GRID:
    assert (
      f"--config=configs/finetune.py:dataset=imagenet2012,lr={lr:g},holdout=true,model=B/16,"
      "runlocal" in out
    )
  assert f"--config.model_init={path}" in out and "--config.model.num_layers=1" in out
  runs = {f"lr{lr:g}": True for lr in GRID} | {"final": False}
  for run, holdout in runs.items():
    config, metrics = _config(workdir, run), _metrics(workdir, run)
    # Every override reached every run; the ImageNet preset's averaging and ReaL are on.
    assert config["total_steps"] == 3 and metrics["step"] == 3
    assert config["model"]["num_layers"] == 1 and config["checkpoint"]["asynchronous"] is False
    assert config["ema_decay"] == 0.9999 and config["evals"]["real"]["type"] == "real"
    # The grid trains without the minival slice and scores it; the final run trains on it all.
    assert config["dataset"]["train_split"] == ("train[:99%]" if holdout else "train")
    assert ("minival/accuracy" in metrics) == holdout == ("minival" in config["evals"])
    assert metrics["val/num_examples"] == 40 and metrics["real/num_examples"] == 30


def _pct(x: float) -> str:
  return f"{100 * x:.2f}"


@pytest.mark.slow
def test_results_and_table_follow_from_the_runs(imagenet_suite):
  proc, workdir, path = imagenet_suite
  results = json.loads((workdir / "results.json").read_text())
  assert results["runs"] == 3 and results["suite"] == "imagenet2012"
  assert results["checkpoint"] == path and results["model"] == "B/16"
  assert results["paper"] == transfer.PAPER["L/16-i21k"] and results["vtab"] == {}
  assert list(results["datasets"]) == ["imagenet2012"]
  r = results["datasets"]["imagenet2012"]
  # The grid's minival top-1 are the grid runs' own; the best rate (the smaller on a tie) won.
  grid = {float(lr): acc for lr, acc in r["grid"].items()}
  assert grid == {lr: _metrics(workdir, f"lr{lr:g}")["minival/accuracy"] for lr in GRID}
  assert r["lr"] in GRID and r["lr"] == max(GRID, key=lambda lr: (grid[lr], -lr))
  assert r["minival"] == grid[r["lr"]]
  final = _metrics(workdir, "final")
  assert _config(workdir, "final")["schedule"]["base_lr"] == r["lr"]
  assert r["test"] == final["val/accuracy"] and r["real"] == final["real/accuracy"]
  assert len({r["minival"], r["test"], r["real"]}) == 3  # the mock's splits and labels differ
  # table.md (also printed): the paper's Table 2 row L/16-i21k beside val and ReaL.
  table = (workdir / "table.md").read_text()
  assert table in proc.stdout
  assert table.splitlines() == [
    f"Transfer of `{path}` (B/16), suite imagenet2012; top-1 in %.",
    "",
    "| dataset | lr | minival top-1 | test top-1 | paper |",
    "|---|---|---|---|---|",
    f"| imagenet2012 | {r['lr']:g} | {_pct(r['minival'])} | {_pct(r['test'])} | 85.30 |",
    f"| imagenet2012 ReaL | {r['lr']:g} | | {_pct(r['real'])} | 88.62 |",
  ]


def test_an_unknown_dataset_ends_in_one_line(tmp_path):
  workdir = tmp_path / "suite"
  args = [f"--checkpoint={tmp_path / 'x.npz'}", "--suite=imagenet2012,imagenet2013"]
  proc = _transfer([*args, f"--workdir={workdir}"], tmp_path / "jax_cache")
  assert proc.returncode == 1 and proc.stdout == ""
  lines = proc.stderr.splitlines()
  # The log file's name first, then the one line naming the culprit; no traceback.
  assert len(lines) == 2 and lines[0].startswith("vit_jax: full log in "), proc.stderr[-3000:]
  assert lines[1].startswith(
    "vit_jax: error: ValueError: --suite: unknown dataset 'imagenet2013'; suites "
  )
  assert [p.name for p in workdir.iterdir()] == ["logs"]  # before any run started


@pytest.mark.slow
def test_a_vtab_task_end_to_end(tmp_path, pretrained, capsys):
  # The tool's code over a VTAB-1k task through tfds (test_vtab builds every task's data), a
  # rerun that skips finished runs, and one that resumes a run interrupted before its metrics.
  # results.json, table.md and the choice are checked on the command's run above.
  kwargs = dict(
    suite="vtab/dtd",
    checkpoint=pretrained,
    workdir=str(tmp_path),
    grid=[0.01, 0.03],
    runlocal=True,
    paper="L/16-i21k",
    # Synchronous saves: mock_data swaps the file system while a tfds dataset is opened, which
    # an asynchronous Orbax write in flight at that moment would write into.
    # 3 steps: one evaluation and one save per run.
    overrides=["checkpoint.asynchronous=false", "total_steps=3"],
  )
  mock = dict(policy=tfds_mocking.MockPolicy.USE_CODE, as_dataset_fn=test_vtab._records)
  with tfds_mocking.mock_data(**mock):
    results = transfer.run_suite(**kwargs)
  out = capsys.readouterr().out
  assert "1 datasets, 3 runs (grid + final per dataset), 144 training images" in out
  assert "vtab/dtd grid 1/2 lr=0.01: 3 steps, 48 training images" in out
  assert "python -m vit_jax.main --config=configs/finetune.py:dataset=vtab/dtd,lr=0.01," in out
  assert (
    f"--config.model_init={pretrained}" in out and "--config.checkpoint.asynchronous=false" in out
  )
  r = results["datasets"]["vtab/dtd"]
  assert set(r["grid"]) == {0.01, 0.03} and r["lr"] == max(
    r["grid"], key=lambda lr: (r["grid"][lr], -lr)
  )
  assert r["minival"] == r["grid"][r["lr"]]  # the chosen learning rate's held-out top-1
  final = json.loads((tmp_path / "vtab_dtd" / "final" / "final_metrics.json").read_text())
  assert final["val/accuracy"] == r["test"] and final["step"] == 3
  saved = json.loads((tmp_path / "vtab_dtd" / "final" / "config.json").read_text())
  assert saved["dataset"]["train_split"].startswith("train[:800]+")  # train800val200
  assert results["vtab"] == {}  # group means need every task of a group
  table = (tmp_path / "table.md").read_text()
  with capsys.disabled():
    print(table)  # shown with -s: the table a closing note quotes
  assert (
    f"| vtab/dtd | {r['lr']:g} | {100 * r['minival']:.2f} | {100 * r['test']:.2f} |  |" in table
  )

  # A rerun skips the finished runs; a run that lost its final_metrics.json (interrupted before
  # it was written) runs again from its checkpoint: its final state evaluated again, the same.
  (tmp_path / "vtab_dtd" / "lr0.03" / "final_metrics.json").unlink()
  with tfds_mocking.mock_data(**mock):
    again = transfer.run_suite(**kwargs)
  out = capsys.readouterr().out
  assert out.count("finished earlier") == 2
  assert "vtab/dtd grid 2/2 lr=0.03: 3 steps" in out
  assert again["datasets"]["vtab/dtd"] == r


@pytest.mark.slow
def test_offline_suite(tmp_path, pretrained):
  results = transfer.run_suite(
    "offline", pretrained, str(tmp_path), grid=[0.03, 0.1], runlocal=True
  )
  assert set(results["datasets"]) == {"animal_mnist", "mnist_5k"}
  for name, r in results["datasets"].items():
    # Pixel baselines of 10-class digits and animals: far above chance (0.1) on any machine.
    assert r["logreg"] > 0.3 and r["knn3"] > 0.3, (name, r)
    final = json.loads((tmp_path / name / "final" / "final_metrics.json").read_text())
    assert r["test"] == final["val/accuracy"] and r["minival"] == r["grid"][r["lr"]]
  table = (tmp_path / "table.md").read_text()
  assert "logreg (pixels) | kNN-3 (pixels) |" in table and "| mnist_5k |" in table
