"""vit_jax.tools.export: each format held to the JAX model, the signatures, the one-line errors.

Parity is measured against the model in float64 ("exact"): an export may be off the exact logits
by the format's bar (relative to the largest |logit|) plus what the float32 JAX model itself is
off, so a bar is never tighter than float32's own error (it is, at random weights, for the R50
hybrid: ~9e-6). Default tier: the 2-layer `testing` ViT with random weights (head included).
Slow tier: ViT-B/16, R50+ViT-B/16 and BiT-R50x1 with random weights, and int8 on a model
fine-tuned by the repo's own trainer on Animal-MNIST (the demo's model and data).
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from vit_jax import checkpoint, inference, models
from vit_jax.export import formats as export_lib
from vit_jax.runtime import cli

tf = pytest.importorskip("tensorflow")
ort = pytest.importorskip("onnxruntime")
litert = pytest.importorskip("ai_edge_litert.interpreter")
from tests.helpers import REPO, random_weights  # noqa: E402 - after the optional imports above

NAMES = ["ant", "bee", "cat", "dog", "eel"]
# Bars relative to the largest |logit| (issue 34).
BARS = {"saved_model": 1e-5, "tflite": 1e-4, "tflite_float16": 1e-2, "onnx": 1e-5}


def _rel(a, b) -> float:
  return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


def _apply64(source: export_lib.Exportable, images: np.ndarray) -> np.ndarray:
  """The exported model in float64: the exact logits."""
  with jax.enable_x64(True):
    fields = dict(dtype=jnp.float64, param_dtype=jnp.float64)
    model64 = source.model.clone(**fields)
    params64 = jax.tree.map(lambda x: np.asarray(x, np.float64), source.params)
    fn = jax.jit(lambda p, x: model64.apply({"params": p}, x, train=False)[0])
    return np.asarray(fn(params64, np.asarray(images, np.float64)))


def assert_parity(source, images, outputs, bar):
  """`outputs` (of `images`) are within `bar` of the exact logits, plus float32 JAX's own error.
  Returns (the export's error, JAX float32's error), relative to the exact logits."""
  exact = _apply64(source, images)
  jax32 = _rel(export_lib.apply_fn(source)(images), exact)
  err = _rel(outputs, exact)
  assert err <= bar + jax32, (err, bar, jax32)
  return err, jax32


def _workdir(tmp_path, image_size=16, pp=None, **model_fields):
  """A trainer-like checkpoint: params.npz + config.json (model, dataset, preprocessing)."""
  config = models.get_model_config("testing")
  config.update(model_fields)
  model = models.get_model(config, len(NAMES))
  params = random_weights.random_params(model, image_size)
  directory = tmp_path / "run"
  directory.mkdir()
  checkpoint.save(jax.tree.map(np.asarray, params), str(directory / "params.npz"))
  dataset = {"name": "toy", "image_size": image_size, "class_names": NAMES}
  dataset["pp_eval"] = pp or "decode|resize_small(20)|central_crop|value_range(-1, 1)"
  (directory / "config.json").write_text(
    json.dumps({"model": config.to_dict(), "dataset": dataset})
  )
  return str(directory / "params.npz")


def _batch(n, size, seed=0):
  return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def _photos(n=4):
  """Smooth photo crops of different sizes (skimage's samples): resizing filters differ only in
  detail on them, so PIL (predict) and TensorFlow (the SavedModel) see nearly the same image."""
  from skimage import data

  sources = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
  out = []
  for i, image in enumerate(sources[:n]):
    h, w = 40 + 7 * i, 52 - 5 * i
    out.append(np.asarray(Image.fromarray(image).resize((w, h), Image.Resampling.BILINEAR)))
  return out


def _tflite_run(path, images):
  interpreter = litert.Interpreter(model_path=path)
  index = interpreter.get_input_details()[0]["index"]
  interpreter.resize_tensor_input(index, images.shape)
  interpreter.allocate_tensors()
  interpreter.set_tensor(index, images)
  interpreter.invoke()
  return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """The testing ViT's workdir and its SavedModel."""
  tmp = tmp_path_factory.mktemp("export")
  ckpt = _workdir(tmp)
  source = export_lib.load(ckpt)
  out = str(tmp / "saved_model")
  meta = export_lib.export(source, "saved_model", out)
  return ckpt, source, out, meta


def test_saved_model_matches_jax_and_predict(exported, tmp_path):
  ckpt, source, out, meta = exported
  assert meta["class_names"] == NAMES and meta["image_size"] == 16
  loaded = tf.saved_model.load(out)
  assert set(loaded.signatures) == {"serving_default", "pixels", "preprocessed"}
  # The same preprocessed batch, two batch sizes.
  for n in (1, 3):
    images = _batch(n, 16, seed=n)
    outs = loaded.signatures["preprocessed"](images=tf.constant(images))
    assert_parity(source, images, outs["logits"].numpy(), BARS["saved_model"])
  # Encoded bytes: the in-graph preprocessing gives predict's top-1 on the same files.
  photos = _photos()
  paths = []
  for i, photo in enumerate(photos):
    paths.append(str(tmp_path / f"p{i}.{'png' if i % 2 else 'jpg'}"))
    Image.fromarray(photo).save(paths[-1])
  encoded = [open(p, "rb").read() for p in paths]
  outs = loaded.signatures["serving_default"](image_bytes=tf.constant(encoded))
  classifier = inference.Classifier(ckpt)
  _, images = inference.read_images(paths)
  expected = classifier.probabilities(images).argmax(-1)
  np.testing.assert_array_equal(outs["top_k_indices"].numpy()[:, 0], expected)
  names = [n.decode() for n in outs["top_k_names"].numpy()[:, 0]]
  assert names == [NAMES[i] for i in expected]
  np.testing.assert_allclose(outs["probabilities"].numpy().sum(-1), 1, rtol=1e-5)
  # uint8 pixels of the PNGs (lossless) give what their bytes give.
  pngs = [np.asarray(Image.open(p).convert("RGB")) for p in paths[1::2]]
  by_bytes = loaded.signatures["serving_default"](image_bytes=tf.constant(encoded[1:2]))
  by_pixels = loaded.signatures["pixels"](pixels=tf.constant(pngs[0][None]))
  np.testing.assert_array_equal(by_pixels["logits"].numpy(), by_bytes["logits"].numpy())


@pytest.mark.slow  # two TensorFlow processes: ~15 s
def test_saved_model_cli_shows_and_runs_it(exported, tmp_path):
  _, _, out, _ = exported
  np.save(tmp_path / "x.npy", _batch(2, 16))
  cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
  show = subprocess.run([cli, "show", "--dir", out, "--all"], capture_output=True, text=True)
  assert show.returncode == 0, show.stderr[-2000:]
  for signature in ("serving_default", "pixels", "preprocessed"):
    assert f"signature_def['{signature}']" in show.stdout
  assert "image_bytes" in show.stdout and "top_k_names" in show.stdout
  run = subprocess.run(
    [
      cli,
      "run",
      "--dir",
      out,
      "--tag_set",
      "serve",
      "--signature_def",
      "preprocessed",
      "--inputs",
      f"images={tmp_path / 'x.npy'}",
    ],
    capture_output=True,
    text=True,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert "top_k_names" in run.stdout and "Result for output key logits" in run.stdout


def test_tflite_fp32_and_float16(tmp_path):
  source = export_lib.load(_workdir(tmp_path))
  images = _batch(2, 16)
  # fp32 for batches of 2; float16 for any batch (its input resized to 2).
  for quantize, batch_size in (("none", 2), ("float16", 0)):
    out = str(tmp_path / quantize)
    meta = export_lib.export(source, "tflite", out, quantize=quantize, batch_size=batch_size)
    assert meta["input"].startswith(f"float32 [{batch_size or 'batch'}, 16, 16, 3]")
    outputs = _tflite_run(os.path.join(out, "model.tflite"), images)
    bar = BARS["tflite" if quantize == "none" else "tflite_float16"]
    assert_parity(source, images, outputs, bar)


@pytest.mark.parametrize(
  "fields", [{}, dict(classifier="gap", gelu_approximate=False, representation_size=24)]
)
def test_onnx_matches_jax_at_any_batch(tmp_path, fields):
  source = export_lib.load(_workdir(tmp_path, **fields))
  out = str(tmp_path / "onnx")
  export_lib.export(source, "onnx", out)
  session = ort.InferenceSession(
    os.path.join(out, "model.onnx"), providers=["CPUExecutionProvider"]
  )
  meta = session.get_modelmeta().custom_metadata_map
  assert json.loads(meta["class_names"]) == NAMES and json.loads(meta["image_size"]) == 16
  for n in (1, 3):
    images = _batch(n, 16, seed=n)
    logits, probs = session.run(["logits", "probabilities"], {"images": images})
    assert_parity(source, images, logits, BARS["onnx"])
    np.testing.assert_allclose(probs, jax.nn.softmax(logits), atol=1e-6)


def test_mpp_checkpoint_exports_its_encoder(tmp_path):
  model = models.get_model("testing", None)
  params = jax.tree.map(np.asarray, random_weights.random_params(model, 16))
  params["mpp_head"] = {"kernel": np.zeros((32, 48), np.float32), "bias": np.zeros(48, np.float32)}
  params["mask_embedding"] = np.zeros((1, 1, 32), np.float32)
  path = str(tmp_path / "mpp.npz")
  checkpoint.save(params, path)
  source = export_lib.load(path)
  assert "masked-patch-prediction" in source.note and "encoder" in source.note
  out = str(tmp_path / "onnx")
  meta = export_lib.export(source, "onnx", out)
  assert meta["num_classes"] is None and "encoder" in meta["note"]
  session = ort.InferenceSession(
    os.path.join(out, "model.onnx"), providers=["CPUExecutionProvider"]
  )
  images = _batch(2, 16)
  (rep,) = session.run(["representation"], {"images": images})
  assert rep.shape == (2, 32)
  assert_parity(source, images, rep, BARS["onnx"])


def _cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "vit_jax.tools.export", *args],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
  npz = str(tmp_path / "bare.npz")
  model = models.get_model("testing", 3)
  checkpoint.save(jax.tree.map(np.asarray, random_weights.random_params(model, 16)), npz)
  out = tmp_path / "out"
  run = _cli(f"--checkpoint={npz}", "--format=pdf", f"--out={out}")
  assert run.returncode == 1 and run.stderr.strip().splitlines()[-1] == (
    "export: error: ValueError: unknown format 'pdf'; expected one of saved_model, tflite, onnx"
  )
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="no model to export") as e:
    export_lib.load(str(tmp_path / "empty"))
  assert "\n" not in str(e.value)
  source = export_lib.load(npz)
  with pytest.raises(ValueError, match="int8_full needs data to calibrate on") as e:
    export_lib.export(source, "tflite", str(out), quantize="int8_full")
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="write to a local directory"):
    export_lib.export(source, "onnx", "gs://bucket/model")
  with pytest.raises(ValueError, match="unknown quantization 'int4'"):
    export_lib.export(source, "tflite", str(out), quantize="int4")
  assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bare.npz", "empty"]


# ---------------------------------------------------------------------------------------------
# Slow: the paper's models, and int8 on a trained model.


def _npz(tmp_path, name, image_size):
  kw = {} if name.startswith("BiT") else dict(attention_kernel="xla", layer_norm_kernel="xla")
  model = models.get_model(name, 10, **kw)
  path = str(tmp_path / "model.npz")
  checkpoint.save(jax.tree.map(np.asarray, random_weights.random_params(model, image_size)), path)
  return path


@pytest.mark.slow
@pytest.mark.parametrize(
  "name,image_size", [("ViT-B_16", 224), ("R50+ViT-B_16", 224), ("BiT-R50x1", 128)]
)
def test_paper_models_in_every_format(tmp_path, name, image_size):
  source = export_lib.load(_npz(tmp_path, name, image_size), model=name, image_size=image_size)
  images = _batch(2, image_size)
  errors = {}
  out = str(tmp_path / "sm")
  export_lib.export(source, "saved_model", out)
  logits = tf.saved_model.load(out).signatures["preprocessed"](images=tf.constant(images))["logits"]
  errors["saved_model"] = assert_parity(source, images, logits.numpy(), BARS["saved_model"])
  for quantize, bar in (("none", BARS["tflite"]), ("float16", BARS["tflite_float16"])):
    out = str(tmp_path / f"tflite_{quantize}")
    export_lib.export(source, "tflite", out, quantize=quantize, batch_size=2)
    outs = _tflite_run(os.path.join(out, "model.tflite"), images)
    errors[f"tflite_{quantize}"] = assert_parity(source, images, outs, bar)
  out = str(tmp_path / "onnx")
  export_lib.export(source, "onnx", out)
  session = ort.InferenceSession(
    os.path.join(out, "model.onnx"), providers=["CPUExecutionProvider"]
  )
  errors["onnx"] = assert_parity(
    source, images, session.run(["logits"], {"images": images})[0], BARS["onnx"]
  )
  print(name, {k: f"{e:.2e} (jax32 {j:.2e})" for k, (e, j) in errors.items()})


@pytest.mark.slow  # the local GCS server and a child process
def test_exports_a_gcs_checkpoint(local_gcs, tmp_path):
  from tests.helpers import xla_env

  npz = random_weights.random_npz(str(tmp_path / "testing.npz"), seed=0)
  local_gcs.upload("vit-jax-test", "export/testing.npz", pathlib.Path(npz).read_bytes())
  out = tmp_path / "onnx"
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "vit_jax.tools.export",
      "--checkpoint=gs://vit-jax-test/export/testing.npz",
      "--format=onnx",
      f"--out={out}",
    ],
    env=xla_env.child_env(1, **local_gcs.env(), TF_CPP_MIN_LOG_LEVEL="2"),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.startswith(f"wrote onnx to {out}: 10 classes, 16px")
  assert json.loads((out / "export.json").read_text())["checkpoint"].startswith("gs://")


def finetune_demo_model(workdir: str, steps: int = 500) -> None:
  """The demo's ViT fine-tuned from scratch on Animal-MNIST (vit_jax.main; ~7 minutes on 2 CPU
  cores; the demo preset is the dataset's default model): the command docs/export.md gives."""
  subprocess.run(
    [
      sys.executable,
      "-m",
      "vit_jax.main",
      "--config=configs/finetune.py:dataset=animal_mnist,holdout=false",
      "--config.init_from_scratch=true",
      "--config.batch_size=128",
      f"--config.total_steps={steps}",
      f"--config.schedule.warmup_steps={steps // 10}",
      f"--config.evals.val.every_steps={steps}",
      f"--config.checkpoint.every_steps={steps}",
      f"--workdir={workdir}",
    ],
    check=True,
    cwd=REPO,
    capture_output=True,
  )


@pytest.mark.slow
def test_int8_on_the_demo_model_keeps_its_accuracy(tmp_path):
  from vit_jax import input_pipeline
  from vit_jax.evaluators import baselines

  workdir = os.environ.get("VIT_JAX_EXPORT_DEMO_WORKDIR") or str(tmp_path / "ft")
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    finetune_demo_model(workdir)
  source = export_lib.load(workdir)
  config = input_pipeline.dataset_config(**source.dataset.to_dict())
  images, labels = [], []
  for batch in input_pipeline.make_eval_iterator(
    config, split="test", global_batch_size=250, mesh=None, process_index=0, process_count=1
  ):
    images.append(batch["image"][batch["mask"] > 0])
    labels.append(batch["label"][batch["mask"] > 0])
  images, labels = np.concatenate(images), np.concatenate(labels)
  top1 = {}
  for quantize in ("none", "int8", "int8_full"):
    out = str(tmp_path / quantize)
    export_lib.export(source, "tflite", out, quantize=quantize, batch_size=0)
    top1[quantize] = _tflite_run(os.path.join(out, "model.tflite"), images).argmax(-1)
  accuracy = {k: float((v == labels).mean()) for k, v in top1.items()}
  agreement = {k: float((v == top1["none"]).mean()) for k, v in top1.items()}
  pixels = baselines.pixel_baselines("animal_mnist")
  print("demo model on Animal-MNIST test:", accuracy, "agreement with fp32:", agreement, pixels)
  assert accuracy["none"] > 0.8  # a trained model (the print shows it beside the pixel baselines)
  assert agreement["int8"] >= 0.99
  # At most half a point: counted in examples, exactly (1000 test images: 5 at most).
  correct = {k: int((v == labels).sum()) for k, v in top1.items()}
  assert abs(correct["int8"] - correct["none"]) <= 0.005 * len(labels)


@pytest.mark.slow  # five exports and six runtimes: ~10 s
def test_bench_export_runs_main(tmp_path, capsys):
  """experiments/benchmarks/bench_export.py's main on the testing ViT: every runtime gets a row."""
  from experiments.benchmarks import bench_export

  result = cli.call(
    bench_export,
    ["--model=testing", "--image_size=16", "--batch_sizes=2", "--repeats=1", f"--out={tmp_path}"],
  )
  runtimes = [row["runtime"] for row in result["rows"]]
  assert runtimes == [
    "JAX (jit)",
    "SavedModel",
    "LiteRT fp32",
    "LiteRT float16",
    "LiteRT int8 (dynamic range)",
    "ONNX (onnxruntime)",
  ]
  assert all(row["batch2_ms"] > 0 and row["bytes"] > 0 for row in result["rows"])
  assert "| LiteRT fp32 |" in capsys.readouterr().out
  assert json.loads((tmp_path / "results.json").read_text())["cpu"] == result["cpu"]
