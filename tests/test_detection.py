"""The detect stage through the entry point (`python -m vit_jax.main`, child processes): a run
writes checkpoints and COCO AP, a killed run resumes bitwise, predict's JSON scores exactly the
evaluator's AP, the exported SavedModel returns predict's boxes, and a bad annotation is one
line naming its file."""

import json
import subprocess
import sys
import types

import numpy as np
import pytest
from PIL import Image

from tests.helpers import REPO, fault_injection, random_weights, trees, xla_env
from vit_jax import inference, predict
from vit_jax.checkpoint.state import train_state
from vit_jax.evaluators import detection as detection_eval

TOTAL = 8


@pytest.fixture(scope="module")
def env():
  return xla_env.child_env(1, TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
  """A random 'testing' ViT as the pretrained checkpoint (`model_from_init`: its architecture)."""
  return random_weights.random_npz(str(tmp_path_factory.mktemp("init") / "vit.npz"), seed=0)


def _make_folder(out, split, num):
  """`num` canvases of the synthetic task's `split` as a COCO folder (make_folder)."""
  result = subprocess.run(
    [sys.executable, "-m", "vit_jax.tools.make_folder", "--dataset=mnist_det", f"--split={split}",
     f"--max_examples={num}", f"--out={out}"],
    cwd=REPO, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads((out / split / "instances.json").read_text())


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
  """A COCO folder of 64 training and 16 test canvases: its root and the test instances."""
  root = tmp_path_factory.mktemp("coco")
  _make_folder(root, "train", 64)
  return root, _make_folder(root, "test", 16)


def _args(npz, root, workdir, extra=()):
  # 64px: the canvases' own size; the test split is also the periodic evaluation's.
  return [
    "--config=configs/detect.py:dataset=folder,runlocal",
    f"--config.dataset.data_dir={root}",
    f"--config.model_init={npz}",
    "--config.dataset.image_size=64",
    "--config.dataset.eval_split=test",
    f"--config.total_steps={TOTAL}",
    "--config.checkpoint.every_steps=4",
    "--config.evals.val.every_steps=4",
    f"--workdir={workdir}",
    *extra,
  ]


def _run(env, args, **fault) -> subprocess.CompletedProcess:
  command = (
    fault_injection.command(*args) if fault else [sys.executable, "-m", "vit_jax.main", *args]
  )
  return subprocess.run(
    command,
    env=fault_injection.child_env(env, **fault),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.fixture(scope="module")
def straight(env, npz, coco, tmp_path_factory):
  """The uninterrupted run's workdir."""
  workdir = tmp_path_factory.mktemp("straight")
  out = _run(env, _args(npz, coco[0], workdir))
  assert out.returncode == 0, out.stderr[-3000:]
  return workdir


@pytest.mark.long
def test_a_run_writes_checkpoints_and_coco_ap_and_a_killed_run_resumes_bitwise(
  env, npz, coco, straight, tmp_path
):
  assert train_state.committed_steps(straight) == [4, 8]
  metrics = json.loads((straight / "final_metrics.json").read_text())
  for split in ("val", "test"):
    assert {f"{split}/{k}" for k in ("AP", "AP50", "AP75", "num_images")} <= set(metrics)
    assert 0.0 <= metrics[f"{split}/AP"] <= metrics[f"{split}/AP50"] <= 1.0
  assert metrics["test/num_images"] == 16
  # SIGKILL while step 6 runs: nothing after step 4 was saved; the same command continues.
  workdir = tmp_path / "killed"
  killed = _run(env, _args(npz, coco[0], workdir), signal="SIGKILL", at=6)
  assert killed.returncode == -9, killed.stderr[-3000:]
  assert train_state.committed_steps(workdir) == [4]
  resumed = _run(env, _args(npz, coco[0], workdir))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  trees.assert_equal(
    train_state.restore_params(str(workdir)), train_state.restore_params(str(straight))
  )
  again = json.loads((workdir / "final_metrics.json").read_text())
  assert again["test/AP"] == metrics["test/AP"]


@pytest.mark.long
def test_predicts_json_scores_the_evaluators_ap_and_the_export_returns_its_boxes(
  coco, straight, tmp_path, capsys
):
  root, instances = coco
  files = [str(root / "test" / im["file_name"]) for im in instances["images"]]
  flag = lambda v: types.SimpleNamespace(value=v)  # noqa: E731
  predict.detect(
    files,
    types.SimpleNamespace(
      checkpoint=flag(str(straight)),
      boxes_dir=flag(str(tmp_path / "boxes")),
      min_score=flag(0.0),
      batch_size=flag(16),
    ),
  )
  printed = json.loads(capsys.readouterr().out)
  assert printed, "no detection at all: nothing to compare"
  stem = files[0].rsplit("/", 1)[1].rsplit(".", 1)[0]
  drawn = Image.open(tmp_path / "boxes" / f"{stem}_boxes.png")
  assert drawn.size == Image.open(files[0]).size and drawn.mode == "RGB"
  ids = {str(root / "test" / im["file_name"]): im["id"] for im in instances["images"]}
  results = [dict(r, image_id=ids[r.pop("file_name")]) for r in printed]
  # The AP of predict's JSON against the folder's own instances.json is the evaluator's.
  ours = detection_eval.coco_metrics(instances, results)
  metrics = json.loads((straight / "final_metrics.json").read_text())
  for key in detection_eval.METRICS:
    if f"test/{key}" in metrics:
      assert ours[key] == pytest.approx(metrics[f"test/{key}"], abs=1e-12), key

  # The SavedModel's `preprocessed` signature on predict's inputs: predict's detections.
  import tensorflow as tf

  from vit_jax.export import formats

  source = formats.load(str(straight))
  formats.export(source, "saved_model", str(tmp_path / "sm"))
  serve = tf.saved_model.load(str(tmp_path / "sm")).signatures["preprocessed"]
  detector = inference.Detector(str(straight))
  images = [Image.open(f) for f in files[:4]]
  exported = serve(images=tf.constant(np.stack([detector.preprocess(im) for im in images])))
  for i, found in enumerate(detector.detect(images)):
    n = len(found["scores"])
    np.testing.assert_array_equal(exported["classes"].numpy()[i, :n], found["classes"])
    np.testing.assert_allclose(exported["scores"].numpy()[i, :n], found["scores"], atol=1e-5)
    np.testing.assert_allclose(exported["boxes"].numpy()[i, :n], found["boxes"], atol=1e-5)
    assert (exported["scores"].numpy()[i, n:] == 0).all()
  names = exported["class_names"].numpy()[0, :1]
  assert names[0].decode() == detector.name(int(exported["classes"].numpy()[0, 0]))


def test_a_bad_annotation_is_one_line_naming_its_file(env, npz, tmp_path):
  # A COCO folder of 8 canvases, one annotation pushed outside its image: skipped, one line
  # naming the file, the image and the annotation; one in 8 is past max_skipped_fraction.
  root = tmp_path / "coco"
  instances = _make_folder(root, "train", 8)
  path = root / "train" / "instances.json"
  bad = instances["annotations"][0]
  bad["bbox"][0] = 60.0  # x 60 + width > 64
  path.write_text(json.dumps(instances))
  extra = ["--config.dataset.eval_split=train", "--config.evals.test.every_steps=-1"]
  result = _run(env, _args(npz, root, tmp_path / "run", extra))
  assert result.returncode != 0
  lines = [ln for ln in (result.stdout + result.stderr).splitlines() if "skipped" in ln]
  image = next(im for im in instances["images"] if im["id"] == bad["image_id"])
  assert any(
    f"{path} image '{image['file_name']}'" in ln and f"annotation {bad['id']}" in ln
    and "outside the 64x64 image" in ln
    for ln in lines
  ), lines  # fmt: skip
  last = [ln for ln in result.stderr.splitlines() if ln.startswith("vit_jax: ")][-1]
  assert "max_skipped_fraction" in last and str(path) in last, last
