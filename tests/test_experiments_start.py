"""Every experiment's main code path, run in the default suite on the smallest sizes.

A function that an experiment calls and that moved fails only when the line calling it runs
(`python -m experiments.scale_study --quick` once ended in an AttributeError on
`common.pixel_baselines`, after the baselines had moved to vit_jax/evaluators/baselines.py, while every test
that merely imported it passed). So each check here calls the experiment's real `main`, on its
quickest profile made smaller still: its size constants monkeypatched (a step or two, a few
examples, a narrower model), nothing else of it replaced. `monkeypatch.setattr` raises for an
attribute that is not there, so a renamed constant or function fails here as well. One thing
makes the runs cheaper than the command line: the trainer (`vit_jax.train.run`) runs on one
device of this process (tests/conftest.py gives it eight, over which every compile and checkpoint
save of a tiny model costs more). The stages of `common.run_stage` run in this process, as they
do from the command line.

Covered elsewhere in the default suite, each through its real main on a quick setting:
  demo          tests/test_demo.py::test_quick_demo_then_predict (the --quick profile as is)
  ablate_step   tests/test_ablate_step.py::test_variants_patch_the_step_and_restore_the_model
  inside_vit    tests/test_analysis.py::test_inside_vit_experiment_writes_the_readme_figures
benchmark_model is tests/test_benchmark_model.py's. The experiments' full `--quick` runs from the
command line, outputs checked against their workdirs, are the slow tests of test_scale_study.py,
test_mpp_study.py and test_folder_transfer.py.
"""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import pytest
from absl import flags

from vit_jax.checkpoint.state import train_state
from vit_jax.runtime import cli

# A ViT of the 'testing' preset's width with one block: what the checks train and fine-tune in
# place of the demo's model (the 'demo' preset: 64 wide, 4 blocks).
TINY_MODEL = dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1)


@pytest.fixture
def in_process(trainer_on_one_device):
  """The trainer on one device (see the module docstring); absl's log level restored afterwards
  (mpp_study lowers it)."""
  from absl import logging

  verbosity = logging.get_verbosity()
  yield
  logging.set_verbosity(verbosity)


# ---------------------------------------------------------------------------------------------
# The studies.


@pytest.mark.slow  # an experiment's whole quick profile; its parts are tested in test_scale_study
def test_scale_study_quick_profile_runs_main(tmp_path, in_process, monkeypatch):
  """scale_study.main --quick: the ViT's pretraining and fine-tuning stages, its train step's
  FLOPs, few-shot transfer of the final and intermediate checkpoints, test top-1, the raw-pixel
  baselines, the table and both plots. BiT's stages are left out for time (R26x1 compiles
  several times longer than the ViT); test_scale_study.py checks its flags against the configs,
  and the slow end-to-end test runs it."""
  from experiments import scale_study

  quick = dataclasses.replace(
    scale_study.QUICK, pretrain_steps=2, batch_size=8, finetune_steps=1, shots=1, curve_points=1
  )
  monkeypatch.setattr(scale_study, "QUICK", quick)
  monkeypatch.setattr(scale_study, "FAMILIES", {"ViT": dict(preset="testing", flags=TINY_MODEL)})
  # Fine-tuning (and its pixel baselines) on 20 examples; the few-shot and test top-1 of the
  # pretrained and fine-tuned models on 100 test images of each downstream set.
  monkeypatch.setattr(scale_study, "FINETUNE_TRAIN", "train[:20]")
  dataset = scale_study._dataset
  monkeypatch.setattr(
    scale_study, "_dataset", lambda *a: dict(dataset(*a), eval_split="test[:100]")
  )
  out = tmp_path / "out"
  results = cli.call(scale_study, ["--quick", f"--workdir={tmp_path}", f"--out={out}"])

  assert set(results["runs"]) == {"ViT/1of16"}
  run = results["runs"]["ViT/1of16"]
  assert run["pretrain_examples"] == 3750 and run["pretrain_flops"] > 0
  # The upstream top-1 is the pretraining stage's val evaluation: one eval batch (runlocal's
  # 64 rows are in the first).
  stage = json.loads((tmp_path / "pretrain" / "ViT" / "1of16" / "metrics.json").read_text())
  assert stage["val/num_examples"] == quick.eval_batch_size
  assert run["upstream_val_accuracy"] == stage["val/accuracy"]
  assert run["finetune"]["animal_mnist"]["learning_rate"] == 0.01
  # One point on the compute curve: the last checkpoint, which is the run's own result.
  assert [c["step"] for c in run["fewshot_curve"]] == [2]
  assert run["fewshot_curve"][0]["fewshot"] == run["fewshot"]
  assert run["fewshot_curve"][0]["flops"] == run["pretrain_flops"]
  base = results["baselines"]
  assert base["animal_mnist"]["1shot"]["train_examples"] == 10  # the evaluator's 1 per class
  assert base["mnist_5k"]["1shot"]["train_examples"] == 10
  assert base["animal_mnist"]["finetune"]["train_examples"] == 20  # FINETUNE_TRAIN
  assert (out / "results.md").read_text().count("\n| ViT |") == 2  # 2 downstream sets
  for name in ("accuracy_vs_data.png", "accuracy_vs_compute.png"):
    assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # an experiment's whole quick profile; its parts are tested in test_mpp_study
def test_mpp_study_quick_profile_runs_main(tmp_path, in_process, monkeypatch):
  """mpp_study.main --quick: masked-patch-prediction pretraining, fine-tuning from it, the
  raw-pixel baselines, the table and the plot, on one downstream set. The other inits' configs
  (supervised pretraining, fine-tuning from scratch) are built here without training; the slow
  test of test_mpp_study.py trains all three."""
  from experiments import mpp_study

  quick = dataclasses.replace(
    mpp_study.QUICK,
    pretrain_steps=1,
    pretrain_batch=8,
    finetune_steps=1,
    finetune_batch=8,
    max_train_examples=40,
    max_test_examples=16,
  )
  monkeypatch.setattr(mpp_study, "QUICK", quick)
  monkeypatch.setattr(mpp_study, "INITS", ("mpp",))
  monkeypatch.setattr(mpp_study, "DOWNSTREAM", ("animal_mnist",))
  out = tmp_path / "results"
  results = cli.call(mpp_study, ["--quick", f"--workdir={tmp_path}", f"--out={out}"])

  assert set(results["pretrain"]) == {"mpp"} and set(results["finetune"]["animal_mnist"]) == {"mpp"}
  base = results["baselines"]["animal_mnist"]
  assert (base["train_examples"], base["test_examples"]) == (40, 16)
  assert json.loads((out / "results.json").read_text())["finetune"] == results["finetune"]
  table = (out / "table.md").read_text()
  assert "| MPP-pretrained |" in table and table == mpp_study._table(results)
  assert "MPP corrupted-patch accuracy" in mpp_study._budgets(results)  # printed under it
  assert (out / "plot.png").read_bytes()[:4] == b"\x89PNG"
  # Fine-tuning from the MPP workdir dropped its head and [mask] embedding for a new head.
  tuned = train_state.restore_params(tmp_path / "finetune_animal_mnist_mpp")
  assert "mpp_head" not in tuned and "mask_embedding" not in tuned
  assert tuned["head"]["kernel"].shape == (32, 10)  # the 'testing' preset's width, 10 classes
  supervised = mpp_study.pretrain_config("supervised", quick)
  assert supervised.total_steps == 1 and supervised.model.representation_size is None
  scratch = mpp_study.finetune_config("mnist_5k", "scratch", quick, "")
  assert scratch.init_from_scratch and scratch.dataset.eval_split == "test[:16]"


def _pretrained_workdir(path, model_config, image_size: int) -> str:
  """What a pretraining run of `model_config` leaves (checkpoints/<step>/ and config.json), with
  the initial weights: the input of folder_transfer, not what it tests."""
  from vit_jax import models
  from vit_jax.checkpoint.state import train_state

  model = models.get_model(model_config, 10)
  images = jnp.zeros((1, image_size, image_size, 3))
  params = jax.jit(lambda: model.init(jax.random.key(0), images, train=False)["params"])()
  checkpointer = train_state.Checkpointer(str(path), every_steps=1, keep=1, asynchronous=False)
  state = dict(step=jnp.int32(1), params=params, opt_state={}, rng=jax.random.PRNGKey(0))
  checkpointer.save(1, state, {"num_records": 0}, force=True)
  checkpointer.wait()
  checkpointer.close()
  config = dict(
    stage="pretrain",
    model=model_config.to_dict(),
    dataset=dict(name="fashion_mnist", image_size=image_size, pp_eval="decode|resize|value_range"),
  )
  (path / "config.json").write_text(json.dumps(config))
  return str(path)


def _digits_folder(root, train: int, test: int) -> str:
  """`root/{train,test}/<digit>/<i>.png`: the first `train` / `test` of the bundled digits'
  splits (8x8 grey), an image folder as a user's would be."""
  from PIL import Image

  from vit_jax.input_pipeline.sources import builtin

  for split, n in (("train", train), ("test", test)):
    images, labels = builtin.get_split("digits", f"{split}[:{n}]")
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
      folder = root / split / builtin.DIGIT_CLASSES[label]
      folder.mkdir(parents=True, exist_ok=True)
      Image.fromarray(image[..., 0]).save(folder / f"{i}.png")
  return str(root)


def test_folder_transfer_quick_profile_runs_main(tmp_path, in_process, monkeypatch):
  """folder_transfer.main --quick --no_scratch on an image folder: the demo's fine-tuning stage
  on it from a pretrained workdir, the pixel baselines read back from the files, the table. The
  folder is 100 + 50 of the bundled digits (the default writes all 1,797, whose logistic
  regression alone takes seconds; test_folder_transfer.py checks that writing)."""
  from experiments import folder_transfer
  from vit_jax import models

  monkeypatch.setattr(folder_transfer, "QUICK", folder_transfer.Budget(steps=1, batch_size=8))
  model_config = models.get_model_config("testing")
  model_config.update(TINY_MODEL, representation_size=TINY_MODEL["hidden_size"])
  pretrained = _pretrained_workdir(tmp_path / "pretrain", model_config, image_size=32)
  folder = _digits_folder(tmp_path / "digits", train=100, test=50)
  results = cli.call(
    folder_transfer,
    ["--quick", "--no_scratch", f"--folder={folder}", f"--pretrained={pretrained}"]
    + [f"--workdir={tmp_path / 'ft'}", f"--out={tmp_path / 'out'}"],
  )

  assert set(results["runs"]) == {"pretrained"} and results["runs"]["pretrained"]["step"] == 1
  # Fine-tuned with the pretrained workdir's architecture (the finetune preset's is another).
  tuned = train_state.restore_params(tmp_path / "ft" / "pretrained")
  assert tuned["Transformer"]["encoderblock_0"]["MlpBlock_3"]["Dense_0"]["kernel"].shape == (32, 64)
  assert "encoderblock_1" not in tuned["Transformer"]
  base = results["baselines"]
  assert (base["train_examples"], base["test_examples"]) == (100, 50)
  saved = json.loads((tmp_path / "out" / "results.json").read_text())
  assert saved["runs"] == results["runs"] and saved["folder"] == folder


# ---------------------------------------------------------------------------------------------
# The benchmarks.


def test_bench_trainer_runs_main(monkeypatch, capsys):
  """bench_trainer.main: the trainer's bare compiled step, `train.run` on the same config, the
  bare step again, then the input pipeline alone; at batch 8 for 3 steps of a one-block model
  (the demo's config otherwise)."""
  from experiments.benchmarks import bench_trainer
  from vit_jax import models, sharding
  from vit_jax.runtime import logging_util

  tiny = models.get_model_config("demo")
  tiny.update(TINY_MODEL)
  monkeypatch.setitem(models.MODEL_CONFIGS, "ViT-demo", lambda: tiny.copy_and_resolve_references())
  # Both on one device, so that the trainer's step state initialisation is the bare step's
  # (compiled once).
  make_mesh = sharding.make_mesh
  monkeypatch.setattr(
    sharding, "make_mesh", lambda config, devices=None: make_mesh(config, jax.devices()[:1])
  )
  meter = logging_util.Throughput.__call__
  cli.call(
    bench_trainer,
    [
      "--batch_size=8",
      "--steps=3",
      "--log_every=1",
      "--bare_iters=1",
      "--pipeline_batches=2",
    ],
  )
  out = capsys.readouterr().out
  bare = (
    r"^bare step: [\d.]+ images/s \(1 steps, batch 8; [\d.]+ before the trainer, [\d.]+ after\)$"
  )
  assert re.search(bare, out, re.M), out
  assert re.search(r"^trainer: +[\d.]+ images/s \(3 steps", out, re.M), out
  assert re.search(r"^trainer / bare step: [\d.]+%$", out, re.M), out
  pipeline = r"^input pipeline alone: \d+ images/s, [\d.]+ ms of CPU per batch \(2 batches\)$"
  assert re.search(pipeline, out, re.M), out
  assert logging_util.Throughput.__call__ is meter  # its recording patch is undone


def test_bench_input_pipeline_runs_main(monkeypatch, capsys):
  """bench_input_pipeline.main: JPEG shards written, streamed through the training
  preprocessing at 224 px, then a ViT-B/16 train step timed; here 8 images, 1 timed batch of 2,
  and ViT-B/16's preset (patch 16, 224 px) one block deep and 32 wide."""
  from experiments.benchmarks import bench_input_pipeline
  from vit_jax import models

  get_model = models.get_model
  monkeypatch.setattr(models, "get_model", lambda name, **kw: get_model(name, **kw, **TINY_MODEL))
  cli.call(
    bench_input_pipeline,
    ["--threads=1", "--batches=1", "--batch=2", "--images=8", "--vit_batch=1", "--vit_steps=1"],
  )
  out = capsys.readouterr().out
  assert "shards: 8 JPEGs" in out
  assert re.search(r"^pipeline, 1 tf.data thread\(s\): +[\d.]+ images/s", out, re.M), out
  assert re.search(r"^ViT-B/16 train step \(batch 1, 224 px\): +[\d.]+ images/s", out, re.M), out
  assert re.search(r"^ratio pipeline/train step, 1 thread\(s\): +[\d.]+x", out, re.M), out


def test_bench_input_pipeline_reads_segmentation_shards(capsys):
  """--task=segmentation: the JPEGs with masks, through the seg_shards source; no ViT step."""
  from experiments.benchmarks import bench_input_pipeline

  cli.call(
    bench_input_pipeline,
    [
      "--task=segmentation",
      "--threads=1",
      "--batches=1",
      "--batch=2",
      "--images=4",
      "--vit_steps=0",
    ],
  )
  out = capsys.readouterr().out
  assert "shards: 4 JPEGs with masks" in out
  assert re.search(
    r"^pipeline \(segmentation\), 1 tf.data thread\(s\): +[\d.]+ images/s", out, re.M
  )
  assert "ViT-B/16" not in out


def test_pod_plan_imports_and_parses_its_arguments(tmp_path, monkeypatch, capsys):
  """pod_plan.main: its arguments are parsed, and without libtpu (the optional extra `tpu`) it
  ends with the install hint and writes nothing. With libtpu it gets past that check to its
  table, with no configuration to compile: one compile of the paper's models takes minutes and
  libtpu one process at a time, which the slow libtpu tests of tests/test_plan.py arrange
  (test_paper_pretraining_fits_a_v3_slice compiles pod_plan's setting, and
  test_quick_pod_plan_matches_the_committed_fingerprint its --quick profile)."""
  from experiments import pod_plan
  from vit_jax.tools import plan as planner

  with pytest.raises(flags.IllegalFlagValueError, match="--efficiency=fast: could not convert"):
    cli.call(pod_plan, ["--efficiency=fast"])
  args = [f"--out_dir={tmp_path / 'pod_plan'}", "--efficiency=0.4", "--max_trials=1"]
  if not planner.libtpu_available():
    with pytest.raises(SystemExit, match=re.escape(planner.install_hint())):
      cli.call(pod_plan, args)
    assert not (tmp_path / "pod_plan").exists()
  else:
    monkeypatch.setattr(pod_plan, "RUNS", [])
    results = cli.call(pod_plan, args)
    assert capsys.readouterr().out.startswith("| model | slice | devices | settings |")
    assert results["rows"] == {} and not results["quick"]
