"""The transfer suite runner: the VTAB-1k plan, costs, choice and table with each run's metrics
made up; end to end (slow, ~2.5 min): two VTAB-1k tasks on mock tfds data with runlocal budgets
and a grid of two (choice on minival, final run, results.json and the table, a rerun that skips
finished runs and resumes an unfinished one), and the offline suite with its pixel baselines."""

import json
import pathlib

import jax
import jax.numpy as jnp
import pytest
import test_vtab  # tests/: mock records for the VTAB builders
from tensorflow_datasets.testing import mocking as tfds_mocking
from test_train import compilation_cache  # noqa: F401 (autouse: compiled steps on disk)

from vit_jax import checkpoint, models
from vit_jax.tools import transfer


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A 'testing' ViT's initial weights as a published-layout .npz (what runlocal fine-tunes)."""
  model = models.get_model("testing", num_classes=10)
  params = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)["params"]
  path = str(tmp_path_factory.mktemp("pretrained") / "testing.npz")
  checkpoint.save(jax.device_get(params), path)
  return path


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


@pytest.mark.slow
def test_two_vtab_tasks_end_to_end(tmp_path, pretrained, capsys):
  kwargs = dict(
    suite="vtab/dtd,vtab/clevr_count",
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
  assert "2 datasets, 6 runs (grid + final per dataset), 288 training images" in out
  assert "vtab/dtd grid 1/2 lr=0.01: 3 steps, 48 training images" in out
  assert "python -m vit_jax.main --config=configs/finetune.py:dataset=vtab/dtd,lr=0.01," in out
  assert (
    f"--config.model_init={pretrained}" in out and "--config.checkpoint.asynchronous=false" in out
  )
  for name in ("vtab/dtd", "vtab/clevr_count"):
    r = results["datasets"][name]
    assert set(r["grid"]) == {0.01, 0.03} and r["lr"] == max(
      r["grid"], key=lambda lr: (r["grid"][lr], -lr)
    )
    assert 0 <= r["minival"] <= 1 and 0 <= r["test"] <= 1
    slug = name.replace("/", "_")
    final = json.loads((tmp_path / slug / "final" / "final_metrics.json").read_text())
    assert final["val/accuracy"] == r["test"] and final["step"] == 3
    saved = json.loads((tmp_path / slug / "final" / "config.json").read_text())
    assert saved["dataset"]["train_split"].startswith("train[:800]+")  # train800val200
  assert results["vtab"] == {}  # group means need every task of a group
  assert json.loads((tmp_path / "results.json").read_text())["datasets"].keys() == {
    "vtab/dtd",
    "vtab/clevr_count",
  }
  table = (tmp_path / "table.md").read_text()
  with capsys.disabled():
    print(table)  # shown with -s: the table a closing note quotes
  assert "| dataset | lr | minival top-1 | test top-1 | paper |" in table
  dtd = results["datasets"]["vtab/dtd"]
  assert (
    f"| vtab/dtd | {dtd['lr']:g} | {100 * dtd['minival']:.2f} | {100 * dtd['test']:.2f} |" in table
  )

  # A rerun skips the finished runs; a run that lost its final_metrics.json (interrupted before
  # it was written) runs again from its checkpoint.
  (tmp_path / "vtab_dtd" / "lr0.03" / "final_metrics.json").unlink()
  with tfds_mocking.mock_data(**mock):
    again = transfer.run_suite(**kwargs)
  out = capsys.readouterr().out
  assert out.count("finished earlier") == 5
  assert "vtab/dtd grid 2/2 lr=0.03: 3 steps" in out
  assert again["datasets"]["vtab/clevr_count"] == results["datasets"]["vtab/clevr_count"]


@pytest.mark.slow
def test_offline_suite(tmp_path, pretrained):
  results = transfer.run_suite(
    "offline", pretrained, str(tmp_path), grid=[0.03, 0.1], runlocal=True
  )
  assert set(results["datasets"]) == {"animal_mnist", "mnist_5k"}
  for r in results["datasets"].values():
    assert 0 < r["logreg"] <= 1 and 0 < r["knn3"] <= 1 and 0 <= r["test"] <= 1
  table = (tmp_path / "table.md").read_text()
  assert "logreg (pixels) | kNN-3 (pixels) |" in table and "| mnist_5k |" in table
