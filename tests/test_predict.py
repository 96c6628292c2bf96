"""predict: checkpoints with and without config.json, PIL preprocessing, the command line."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from tests.helpers import REPO
from vit_jax import checkpoint, inference, models

NAMES = ["ant", "bee", "cat"]


def _trained_params(image_size=16, **overrides):
  """A 3-class 'testing' ViT with a random (not zero) head, so predictions differ."""
  model = models.get_model("testing", 3, **overrides)
  params = model.init(jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)), train=False)
  params = jax.tree.map(np.asarray, params["params"])
  params["head"]["kernel"] = np.random.default_rng(0).normal(size=params["head"]["kernel"].shape)
  params["head"]["kernel"] = params["head"]["kernel"].astype(np.float32)
  return model, params


def _images(tmp_path, n=2):
  rng = np.random.default_rng(1)
  paths = []
  for i in range(n):
    mode = "L" if i % 2 else "RGB"  # a gray image must come out as 3 channels too
    shape = (37, 45) if mode == "L" else (50, 40, 3)
    path = str(tmp_path / f"im{i}.png")
    Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode).save(path)
    paths.append(path)
  return paths


def test_npz_without_config_infers_architecture_and_size(tmp_path):
  model, params = _trained_params(image_size=16, representation_size=24)
  path = str(tmp_path / "model.npz")
  checkpoint.save(params, path)
  inferred = checkpoint.model_config_from_params(checkpoint.load(path))
  assert (inferred.patch_size, inferred.hidden_size, inferred.num_layers) == (4, 32, 2)
  assert (inferred.num_heads, inferred.mlp_dim, inferred.representation_size) == (2, 64, 24)

  clf = inference.Classifier(path)
  assert clf.image_size == 16 and clf.num_classes == 3 and clf.class_names is None
  paths = _images(tmp_path)
  images = [Image.open(p) for p in paths]
  top = clf.top_k(images, k=5)
  assert [len(t) for t in top] == [3, 3]  # k is capped at the number of classes
  x = np.stack([inference.preprocess(im, 16) for im in images])
  expected = np.asarray(jax.nn.softmax(model.apply({"params": params}, x, train=False)[0]))
  for t, e in zip(top, expected, strict=True):
    assert [i for i, _, _ in t] == list(np.argsort(-e))
    np.testing.assert_allclose([p for _, _, p in t], np.sort(e)[::-1], rtol=1e-5)
  assert top[0][0][1] == f"class {top[0][0][0]}"


def test_preprocess_matches_the_tensorflow_eval_pipeline():
  from vit_jax.input_pipeline.ops import preprocess as tf_preprocess

  rng = np.random.default_rng(0)
  # A smooth image: resampling filters differ only in detail, so compare on low frequencies.
  yy, xx = np.mgrid[0:60, 0:80]
  image = np.stack([yy * 4, xx * 3, (yy + xx) * 2], -1) + rng.integers(0, 8, (60, 80, 3))
  image = np.clip(image, 0, 255).astype(np.uint8)
  spec = "decode|resize_small(40)|central_crop(32)|value_range(-1, 1)"
  ours = inference.preprocess(Image.fromarray(image), 32, spec)
  fn = tf_preprocess.get_preprocess_fn(spec, 32)
  theirs = np.asarray(fn(image, np.zeros(2, np.int64)))
  assert ours.shape == theirs.shape == (32, 32, 3)
  assert np.abs(ours - theirs).mean() < 0.02
  with pytest.raises(ValueError, match="Unknown predict preprocessing op 'flip_lr'"):
    inference.preprocess(Image.fromarray(image), 32, "decode|flip_lr|value_range")


def test_workdir_config_gives_model_size_and_class_names(tmp_path):
  # Config names a preset the parameter shapes could not reveal (`gap` classifier) and 24px.
  model, params = _trained_params(image_size=24, classifier="gap")
  workdir = tmp_path / "run"
  workdir.mkdir()
  checkpoint.save(params, str(workdir / "params.npz"))
  config = {
    "model": dict(models.get_model_config("testing").to_dict(), classifier="gap"),
    "dataset": {"name": "toy", "image_size": 24, "class_names": NAMES},
  }
  (workdir / "config.json").write_text(json.dumps(config))
  clf = inference.Classifier(str(workdir / "params.npz"))
  assert clf.image_size == 24 and clf.model.classifier == "gap"
  assert clf.class_names == NAMES
  (top,) = clf.top_k([Image.open(_images(tmp_path, 1)[0])], k=2)
  assert len(top) == 2 and top[0][1] in NAMES and top[0][2] >= top[1][2]


def test_command_line_prints_top_classes_with_names(tmp_path):
  _, params = _trained_params()
  path = str(tmp_path / "model.npz")
  checkpoint.save(params, path)
  names = tmp_path / "names.txt"
  names.write_text("\n".join(NAMES) + "\n")
  images = _images(tmp_path)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run(
    [sys.executable, "-m", "vit_jax.predict", f"--checkpoint={path}", f"--class_names={names}"]
    + images,
    capture_output=True,
    text=True,
    env=env,
    check=True,
    cwd=REPO,
  ).stdout
  lines = out.strip().splitlines()
  assert lines[0] == images[0] and lines[4] == images[1]
  probs = [float(line.split("%")[0].split()[-1]) for line in lines[1:4]]
  assert sum(probs) == pytest.approx(100.0, abs=0.05) and probs == sorted(probs, reverse=True)
  assert all(any(f"{n} (" in line for n in NAMES) for line in lines[1:4])


def test_command_line_skips_an_unreadable_image_and_classifies_the_others(tmp_path):
  _, params = _trained_params()
  path = str(tmp_path / "model.npz")
  checkpoint.save(params, path)
  (good,) = _images(tmp_path, 1)
  bad = tmp_path / "broken.jpg"
  bad.write_bytes(b"not an image")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = [sys.executable, "-m", "vit_jax.predict", f"--checkpoint={path}"]
  out = subprocess.run(run + [str(bad), good], capture_output=True, text=True, env=env, cwd=REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.strip().splitlines()
  assert lines[0] == good and len(lines) == 4  # the good image and its three classes
  (warning,) = [line for line in out.stderr.splitlines() if "could not be read" in line]
  assert f"skipped 1 of 2 images that could not be read: {bad} (cannot identify" in warning
  out = subprocess.run(run + [str(bad)], capture_output=True, text=True, env=env, cwd=REPO)
  assert out.returncode == 1 and out.stdout == ""
  assert (
    out.stderr.strip()
    .splitlines()[-1]
    .startswith(f"predict: error: ValueError: none of the 1 images could be read: {bad} (cannot")
  )


def test_other_image_size_resizes_posemb_and_sigmoid_heads_get_sigmoid(tmp_path):
  model, params = _trained_params(image_size=16)
  workdir = tmp_path / "run"
  workdir.mkdir()
  checkpoint.save(params, str(workdir / "params.npz"))
  config = {
    "model": models.get_model_config("testing").to_dict(),
    "dataset": {"name": "toy", "image_size": 16, "class_names": NAMES},
    "loss": "sigmoid_xent",
  }
  (workdir / "config.json").write_text(json.dumps(config))
  image = Image.open(_images(tmp_path, 1)[0])
  # 24px: a 6x6 patch grid where the checkpoint has 4x4; the same resize the probe uses.
  clf = inference.Classifier(str(workdir / "params.npz"), image_size=24)
  assert clf.params["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 37, 32)
  expected_posemb = checkpoint.resize_posemb(
    params["Transformer"]["posembed_input"]["pos_embedding"], 6
  )
  np.testing.assert_array_equal(
    clf.params["Transformer"]["posembed_input"]["pos_embedding"], expected_posemb
  )
  (probs,) = clf.probabilities([image])
  x = inference.preprocess(image, 24)[None]
  logits = model.apply({"params": clf.params}, x, train=False)[0][0]
  np.testing.assert_allclose(probs, jax.nn.sigmoid(logits), rtol=1e-5)
  assert not np.isclose(probs.sum(), 1.0)  # independent class scores, not a distribution
