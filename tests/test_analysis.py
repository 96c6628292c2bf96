"""vit_jax.analysis: the numbers against hand-made answers and brute force, and the tool end to end."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from experiments import fingerprint, inside_vit
from tests.helpers import REPO, experiment_run
from vit_jax import checkpoint, models
from vit_jax.analysis import capture, metrics, report
from vit_jax.checkpoint.state import train_state
from vit_jax.runtime import cli

# ---------------------------------------------------------------------------------------------
# Mean attention distance on attention maps with known answers.


def _with_prefix(patch_attention, prefix=1, prefix_weight=0.0):
  """[..., n, n] patch-to-patch weights → [..., prefix + n, prefix + n] with prefix tokens."""
  n = patch_attention.shape[-1]
  full = np.zeros(patch_attention.shape[:-2] + (prefix + n, prefix + n))
  full[..., :prefix, :] = 1.0 / (prefix + n)  # prefix queries: ignored by the metric
  full[..., prefix:, :prefix] = prefix_weight / max(prefix, 1)
  full[..., prefix:, prefix:] = (1.0 - prefix_weight) * patch_attention
  return full


def _offset_attention(grid, dr, dc):
  """Each patch attends to the patch (±dr, ±dc) away (the sign that stays on the grid)."""
  gh, gw = grid
  att = np.zeros((gh * gw, gh * gw))
  for r in range(gh):
    for c in range(gw):
      tr = r + dr if r + dr < gh else r - dr
      tc = c + dc if c + dc < gw else c - dc
      att[r * gw + c, tr * gw + tc] = 1.0
  return att


def test_mean_attention_distance_identity_is_zero():
  grid = (3, 4)
  att = _with_prefix(np.broadcast_to(np.eye(12), (2, 3, 12, 12)))  # [batch, heads, T, T]
  distance, share = metrics.mean_attention_distance(att, grid, stride=16)
  assert distance.shape == share.shape == (2, 3, 12)
  np.testing.assert_allclose(distance, 0.0, atol=1e-6)
  np.testing.assert_allclose(share, 0.0, atol=1e-6)


@pytest.mark.parametrize(
  ("dr", "dc", "expected"), [(0, 1, 16.0), (1, 0, 16.0), (1, 1, 16 * 2**0.5)]
)
def test_mean_attention_distance_fixed_offset_is_the_step_in_pixels(dr, dc, expected):
  grid = (3, 4)
  att = _with_prefix(_offset_attention(grid, dr, dc), prefix_weight=0.25)
  distance, share = metrics.mean_attention_distance(att, grid, stride=16)
  # The class token's quarter of the attention is left out and renormalised away.
  np.testing.assert_allclose(distance, expected, rtol=1e-6)
  np.testing.assert_allclose(share, 0.25, rtol=1e-6)


def test_mean_attention_distance_uniform_is_the_mean_pairwise_distance():
  # On a 2x2 grid every patch has itself at 0, two neighbours at p and one at p*sqrt(2).
  p = 4.0
  att = np.full((5, 5), 0.2)  # uniform over the class token and the four patches
  distance, share = metrics.mean_attention_distance(att, (2, 2), stride=p)
  np.testing.assert_allclose(distance, p * (2 + 2**0.5) / 4, rtol=1e-6)
  assert metrics.uniform_attention_distance((2, 2), p) == pytest.approx(p * (2 + 2**0.5) / 4)
  np.testing.assert_allclose(share, 0.2, rtol=1e-6)
  # Without a class token (a 'gap' model) every token is a patch; 1x3: mean of 0, 1, 2 / 0, 1, 1.
  distance, _ = metrics.mean_attention_distance(np.full((3, 3), 1 / 3), (1, 3), 1.0, 0)
  np.testing.assert_allclose(distance, [1.0, 2 / 3, 1.0], rtol=1e-6)


def test_mean_attention_distance_rejects_a_wrong_grid():
  with pytest.raises(ValueError, match="does not match a 3x3 grid"):
    metrics.mean_attention_distance(np.eye(9), (3, 3), 1.0, num_prefix_tokens=1)


# ---------------------------------------------------------------------------------------------
# Attention rollout against a brute-force loop.


def _softmax_attention(rng, shape):
  logits = rng.normal(size=shape) * 2
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _rollout_loops(attentions, w):
  """Abnar & Zuidema with explicit loops: mean heads, mix in w*I, renormalise, multiply."""
  layers, batch, heads, t, _ = attentions.shape
  out = np.zeros((batch, t, t))
  for b in range(batch):
    rollout = [[float(i == j) for j in range(t)] for i in range(t)]
    for layer in range(layers):
      fused = [[0.0] * t for _ in range(t)]
      for i in range(t):
        for j in range(t):
          mean = sum(attentions[layer, b, h, i, j] for h in range(heads)) / heads
          fused[i][j] = (1 - w) * mean + w * (i == j)
        row = sum(fused[i])
        fused[i] = [v / row for v in fused[i]]
      rollout = [
        [sum(fused[i][k] * rollout[k][j] for k in range(t)) for j in range(t)] for i in range(t)
      ]
    out[b] = rollout
  return out


@pytest.mark.parametrize(("w", "prefix"), [(0.5, 1), (0.3, 1), (0.5, 0)])
def test_rollout_matches_brute_force(w, prefix):
  attentions = _softmax_attention(np.random.default_rng(0), (3, 2, 4, 6, 6))
  maps, full = metrics.attention_rollout(attentions, residual_weight=w, num_prefix_tokens=prefix)
  expected = _rollout_loops(attentions, w)
  np.testing.assert_allclose(full, expected, rtol=1e-5, atol=1e-6)
  source = expected[:, 0] if prefix else expected.mean(1)
  np.testing.assert_allclose(maps, source[:, prefix:], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(full).sum(-1), 1.0, rtol=1e-5)  # rows stay distributions


def test_rollout_of_identity_attention_keeps_the_class_token_to_itself():
  attentions = np.broadcast_to(np.eye(5), (2, 1, 3, 5, 5))
  maps, _ = metrics.attention_rollout(attentions)
  np.testing.assert_allclose(maps, 0.0, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Position embeddings and embedding filters.


def test_posemb_similarity_matches_a_direct_computation():
  posemb = np.random.default_rng(0).normal(size=(1, 1 + 6, 8))
  sim = metrics.posemb_similarity(posemb, num_prefix_tokens=1)
  assert sim.shape == (6, 6)
  for i in range(6):
    for j in range(6):
      a, b = posemb[0, 1 + i], posemb[0, 1 + j]
      assert sim[i, j] == pytest.approx(a @ b / np.sqrt((a @ a) * (b @ b)), abs=1e-12)
  np.testing.assert_allclose(metrics.posemb_similarity(posemb[0, 1:], 0), sim)


def test_posemb_grid_summary_tells_a_grid_from_noise():
  grid = (4, 5)
  xy = metrics.grid_coordinates(grid)
  # Smooth bumps around 12 centres: nearby patches get similar embeddings.
  centres = np.random.default_rng(1).uniform(0, 4, size=(12, 2))
  smooth = np.exp(-((xy[:, None] - centres[None]) ** 2).sum(-1) / 2.0)
  summary = metrics.posemb_grid_summary(metrics.posemb_similarity(smooth, 0), grid)
  assert summary["distance_correlation"] < -0.5
  assert summary["by_distance"]["1.00"] > summary["by_distance"]["3.00"]
  noise = np.random.default_rng(2).normal(size=(20, 256))
  summary = metrics.posemb_grid_summary(metrics.posemb_similarity(noise, 0), grid)
  assert abs(summary["distance_correlation"]) < 0.2
  # Rows: the embedding is the row alone, so same-row pairs are identical.
  rows = np.eye(4)[xy[:, 0].astype(int)]
  summary = metrics.posemb_grid_summary(metrics.posemb_similarity(rows, 0), grid)
  assert summary["same_row"] == pytest.approx(1.0) and summary["same_column"] == pytest.approx(0.0)


def test_filter_pca_finds_the_planted_components():
  rng = np.random.default_rng(0)
  p, c, d = 4, 3, 200
  u = np.linalg.qr(rng.normal(size=(p * p * c, 2)))[0].T  # two orthonormal directions
  coefficients = rng.normal(size=(d, 2)) * [3.0, 1.0]
  filters = coefficients @ u + 0.01 * rng.normal(size=(d, p * p * c)) + 5.0  # a shared mean
  kernel = filters.T.reshape(p, p, c, d)
  components, explained = metrics.filter_pca(kernel, num_components=5)
  assert components.shape == (5, p, p, c) and explained.shape == (5,)
  flat = components.reshape(5, -1)
  assert abs(flat[0] @ u[0]) > 0.999 and abs(flat[1] @ u[1]) > 0.999
  assert explained[0] > explained[1] > 10 * explained[2]
  assert explained[:2].sum() > 0.99
  np.testing.assert_allclose(np.linalg.norm(flat, axis=1), 1.0, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# The model's sown attention weights, and the tool end to end.


def _testing_params(image_size=16, **overrides):
  model = models.get_model("testing", 3, **overrides)
  params = model.init(jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)), train=False)
  return model, jax.tree.map(np.asarray, params["params"])


def test_attention_weights_scanned_equal_unrolled():
  model, params = _testing_params()
  scanned = models.get_model("testing", 3, scan=True)
  images = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)), jnp.float32)
  plain = jax.jit(functools.partial(capture.attention_weights, model))(params, images)
  stacked = jax.jit(functools.partial(capture.attention_weights, scanned))(
    checkpoint.stack_encoder_blocks(params), images
  )
  assert plain.shape == (2, 2, 2, 17, 17)  # [layers, batch, heads, 1 + 4*4, 1 + 4*4]
  np.testing.assert_allclose(plain, stacked, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(plain).sum(-1), 1.0, rtol=1e-5)


def _images(folder, n=3):
  folder.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(1)
  for i in range(n):
    mode, shape = ("L", (30, 22)) if i % 2 else ("RGB", (20, 24, 3))
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(folder / f"im{i}.png")
  (folder / "broken.png").write_bytes(b"not a png")
  (folder / "notes.txt").write_text("not an image, not listed")
  return folder


def _check_outputs(out, layers, heads, images, skipped):
  result = json.loads((out / "analysis.json").read_text())
  assert np.shape(result["mean_attention_distance"]) == (layers, heads)
  assert result["images"]["count"] == images
  assert result["images"]["skipped_count"] == len(skipped)
  assert [os.path.basename(s["path"]) for s in result["images"]["skipped"]] == skipped
  for name in ("posemb_similarity", "attention_distance", "attention_rollout"):
    path = out / f"{name}.png"
    assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
  assert len(list((out / "rollout").glob("*.png"))) == images
  arrays = np.load(out / "analysis.npz")
  gh, gw = result["token_grid"]
  assert arrays["rollout"].shape == (images, gh * gw)
  return result, arrays


def test_command_line_on_an_npz(tmp_path):
  _, params = _testing_params(image_size=16)
  path = tmp_path / "testing.npz"
  checkpoint.save(params, str(path))
  folder = _images(tmp_path / "images")
  out = tmp_path / "out"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "vit_jax.analysis",
      f"--checkpoint={path}",
      f"--images={folder}",
      f"--out={out}",
      "--batch_size=2",
    ],
    capture_output=True,
    text=True,
    env=env,
    check=True,
    cwd=REPO,
  )
  assert "3 images analysed, 1 skipped" in proc.stdout
  (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("skipped")]
  assert "broken.png" in line and "im0.png" not in line
  result, arrays = _check_outputs(out, layers=2, heads=2, images=3, skipped=["broken.png"])
  assert result["token_grid"] == [4, 4] and result["token_stride_pixels"] == 4
  assert (out / "filters_pca.png").exists()
  assert arrays["filter_components"].shape == (28, 4, 4, 3)
  assert arrays["posemb_similarity"].shape == (16, 16)
  assert result["posemb"]["class_token_slot_dropped"] is True
  # A query patch of a 4x4 grid of 4 px patches is at most 4*sqrt(18) px from any key.
  assert 0 < np.min(result["mean_attention_distance"])
  assert np.max(result["mean_attention_distance"]) < 4 * 18**0.5
  uniform = np.mean(
    [np.hypot(a // 4 - b // 4, a % 4 - b % 4) for a in range(16) for b in range(16)]
  )
  assert result["uniform_attention_distance"] == pytest.approx(4 * uniform)


def test_command_line_names_a_missing_image(tmp_path):
  _, params = _testing_params()
  path = tmp_path / "testing.npz"
  checkpoint.save(params, str(path))
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "vit_jax.analysis",
      f"--checkpoint={path}",
      f"--images={tmp_path / 'nope.png'}",
      f"--out={tmp_path / 'out'}",
    ],
    capture_output=True,
    text=True,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
    cwd=REPO,
  )
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1] == (
    "vit_jax.analysis: error: FileNotFoundError: --images: no such file or folder: "
    f"{tmp_path / 'nope.png'}"
  )


def test_list_images_searches_folders_and_names_what_is_missing(tmp_path):
  folder = _images(tmp_path / "a" / "b", n=2)
  (tmp_path / "empty").mkdir()
  (tmp_path / "x.dat").write_bytes(b"")
  found = report.list_images([str(tmp_path / "a"), str(tmp_path / "x.dat")])
  assert [os.path.relpath(p, tmp_path) for p in found] == [
    "a/b/broken.png",
    "a/b/im0.png",
    "a/b/im1.png",
    "x.dat",  # a file named explicitly is tried whatever its extension
  ]
  with pytest.raises(FileNotFoundError, match=f"files in {tmp_path / 'empty'}"):
    report.list_images([str(folder), str(tmp_path / "empty")])


def _orbax_workdir(path, params, model_config, image_size):
  """What a trainer run leaves: checkpoints/<step>/state (+ data) and config.json."""
  checkpointer = train_state.Checkpointer(str(path), every_steps=1, keep=1, asynchronous=False)
  state = dict(step=jnp.int32(5), params=params, opt_state={}, rng=jax.random.PRNGKey(0))
  checkpointer.save(5, state, {"num_records": 0}, force=True)
  checkpointer.wait()
  checkpointer.close()
  config = {
    "stage": "pretrain",
    "model": model_config.to_dict(),
    "dataset": {"name": "toy", "image_size": image_size, "pp_eval": "decode|resize|value_range"},
  }
  (path / "config.json").write_text(json.dumps(config))


def test_scanned_trainer_workdir(tmp_path):
  config = models.get_model_config("testing")
  config.scan = True
  model = models.get_model(config, 3)
  params = model.init(jax.random.key(1), jnp.zeros((1, 12, 12, 3)), train=False)["params"]
  _orbax_workdir(tmp_path / "run", params, config, image_size=12)
  out = tmp_path / "out"
  result = report.analyze(
    str(tmp_path / "run"), [str(_images(tmp_path / "images", n=2))], str(out), batch_size=8
  )
  _check_outputs(out, layers=2, heads=2, images=2, skipped=["broken.png"])
  assert result["image_size"] == 12 and result["token_grid"] == [3, 3]
  assert result["posemb"]["grid"] == [3, 3]


def test_hybrid_distance_on_its_token_grid_and_no_filter_figure(tmp_path):
  # A one-stage ResNet stem downsamples by 2^(1+1) = 4; 1x1 patches on it: 4 px per token.
  config = models.vit_config(
    "R+tiny", 1, 32, 64, 2, 2, resnet=dict(num_layers=(1,), width_factor=1)
  )
  model = models.get_model(config, 3)
  params = model.init(jax.random.key(2), jnp.zeros((1, 16, 16, 3)), train=False)["params"]
  _orbax_workdir(tmp_path / "run", params, config, image_size=16)
  out = tmp_path / "out"
  result = report.analyze(str(tmp_path / "run"), [str(_images(tmp_path / "images", 1))], str(out))
  _check_outputs(out, layers=2, heads=2, images=1, skipped=["broken.png"])
  assert result["token_grid"] == [4, 4] and result["token_stride_pixels"] == 4
  assert "ResNet feature" in result["filters"]["skipped"]
  assert not (out / "filters_pca.png").exists()


def test_inside_vit_experiment_writes_the_readme_figures(tmp_path):
  config = models.get_model_config("testing")
  model = models.get_model(config, 10)
  params = model.init(jax.random.key(3), jnp.zeros((1, 32, 32, 3)), train=False)["params"]
  _orbax_workdir(tmp_path / "pretrain", params, config, image_size=32)
  out = tmp_path / "figures"
  result = cli.call(
    inside_vit, ["--quick", f"--pretrained={tmp_path / 'pretrain'}", f"--out={out}"]
  )
  assert sorted(p.name for p in out.iterdir()) == sorted(
    [f"{name}.png" for name in inside_vit.FIGURES] + ["analysis.json"]
  )
  saved = json.loads((out / "analysis.json").read_text())
  assert saved["images"]["count"] == inside_vit.QUICK.num_images and result["token_grid"] == [8, 8]
  assert np.shape(saved["mean_attention_distance"]) == (2, 2)
  assert saved["figures"]["attention_rollout"] == "attention_rollout.png"
  # The summary docs/analysis.md reads: each layer's heads' min, mean and max.
  distance = np.asarray(saved["mean_attention_distance"])
  assert saved["summary"]["layer2"]["max"] == pytest.approx(distance[1].max())
  assert saved["summary"]["layer1"]["mean"] == pytest.approx(distance[0].mean())
  assert not saved["pretrain"] and not saved["inputs"]  # nothing trained here


def test_inside_vit_never_puts_another_models_figures_over_the_committed_ones(tmp_path):
  with pytest.raises(SystemExit, match="--pretrained=.* would replace the committed results"):
    cli.call(inside_vit, [f"--pretrained={tmp_path}"])
  with pytest.raises(SystemExit, match="--pretrained=.*: no such workdir"):
    cli.call(inside_vit, [f"--pretrained={tmp_path / 'absent'}", f"--out={tmp_path / 'out'}"])


INSIDE_VIT = REPO / "experiments/results/inside_vit/analysis.json"


@pytest.mark.slow  # the demo's pretraining for 30 steps, then the analysis of 64 images
def test_quick_inside_vit_matches_the_committed_fingerprint(tmp_path):
  experiment_run.run("inside_vit", "--quick", f"--workdir={tmp_path}")
  result = json.loads((tmp_path / "results" / "analysis.json").read_text())
  assert result["pretrain"]["val/accuracy"] > 0.15  # 10 classes; measured 26-29% (tests/test_demo)
  assert sorted(result["inputs"]["pretrain"]) == sorted(
    f"{split}/{key}"
    for split in ("train", "eval")
    for key in ("image_sum", "image_sumsq", "image_projection", "label_sum", "mask_sum")
  )
  fingerprint.check(json.loads(INSIDE_VIT.read_text()), result, "python -m experiments.inside_vit")


def test_inside_vit_committed_results_were_made_with_todays_full_configs():
  today = fingerprint.configs(inside_vit.stage_flags(inside_vit.FULL))
  fingerprint.check_configs(
    json.loads(INSIDE_VIT.read_text()), today, "python -m experiments.inside_vit"
  )


def test_the_tool_imports_without_tensorflow():
  code = "import sys, vit_jax.analysis.__main__; assert 'tensorflow' not in sys.modules"
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
