"""Tests for vit_jax.checkpoint: the .npz format, big_vision files and fine-tuning adaptation."""

import os
import re
import subprocess
import sys
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import trees
from vit_jax import checkpoint, models

POSEMB = checkpoint.POSEMB


def _shapes(name, num_classes, image_shape, **overrides):
  """The Flax module of a preset and its parameter shapes (jax.ShapeDtypeStruct leaves)."""
  model = models.get_model(name, num_classes, **overrides)
  images = jnp.zeros(image_shape)
  return model, jax.eval_shape(lambda: model.init(jax.random.key(0), images, train=False))["params"]


def _random_like(shapes, seed=0):
  """Random non-zero float32 values for every leaf: unlike a real init, the head is not zero.

  Drawing with numpy is much faster than `model.init` for B/16, and every test compares values
  with values, so nothing depends on the initialiser.
  """
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    noise = 0.02 * rng.standard_normal(leaf.shape, np.float32)
    return 1.0 + noise if "scale" in jax.tree_util.keystr(path) else noise

  return jax.tree_util.tree_map_with_path(draw, shapes)


def _zero_head(shapes):
  """Shapes with the head as arrays (zeros, as the model initialises it), for load_pretrained."""
  shapes["head"] = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes["head"])
  return shapes


def _logits(model, params, images):
  """The model's logits, compiled as one program (op by op, B/16 compiles dozens)."""
  return np.asarray(
    jax.jit(lambda p, x: model.apply({"params": p}, x, train=False)[0])(params, images)
  )


def _images(shape, seed=1):
  return jnp.asarray(np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32))


def _assert_trees_equal(a, b):
  fa, fb = checkpoint.flatten_params(a), checkpoint.flatten_params(b)
  assert list(fa) == list(fb) or sorted(fa) == sorted(fb), sorted(set(fa) ^ set(fb))
  for k in fa:
    assert fa[k].dtype == fb[k].dtype, k
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def _npz_keys(path):
  with np.load(path, allow_pickle=False) as npz:
    return set(npz.files)


# ---------------------------------------------------------------------------------------------
# The tiny model most tests use: 16x16 images, 4x4 patches → a 4x4 grid, width 32, 2 layers.

TINY_IMAGES = (2, 16, 16, 3)


@pytest.fixture(scope="module")
def tiny():
  model, shapes = _shapes("testing", 5, TINY_IMAGES)
  return model, _random_like(shapes)


@pytest.fixture(scope="module")
def tiny_scan():
  return _shapes("testing", 5, TINY_IMAGES, scan=True)


def test_real_init_round_trip_is_bitwise(tmp_path):
  model = models.get_model("testing", 5)
  params = jax.jit(lambda: model.init(jax.random.key(0), jnp.zeros(TINY_IMAGES), train=False))()
  checkpoint.save(params, tmp_path / "init.npz")  # a whole variables dict is accepted
  _assert_trees_equal(checkpoint.load(tmp_path / "init.npz"), params["params"])


def test_save_load_round_trip_is_bitwise(tiny, tmp_path):
  _, params = tiny
  path = tmp_path / "tiny.npz"
  checkpoint.save(params, path)
  assert "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel" in _npz_keys(path)
  _assert_trees_equal(checkpoint.load(path), params)
  # No temporary file is left beside it.
  assert os.listdir(tmp_path) == ["tiny.npz"]


def test_save_writes_bfloat16_as_exact_float32(tiny, tmp_path):
  _, params = tiny
  bf16 = jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params)
  checkpoint.save(bf16, tmp_path / "bf16.npz")
  restored = checkpoint.flatten_params(checkpoint.load(tmp_path / "bf16.npz"))
  for k, v in checkpoint.flatten_params(bf16).items():
    assert restored[k].dtype == np.float32
    np.testing.assert_array_equal(restored[k], np.asarray(v, np.float32))


def test_stack_unstack_round_trip_matches_scan_model(tiny, tiny_scan):
  model, params = tiny
  scan_model, scan_shapes = tiny_scan
  stacked = checkpoint.stack_encoder_blocks(params)
  assert jax.tree.map(np.shape, stacked) == jax.tree.map(lambda s: s.shape, scan_shapes)
  block = stacked["Transformer"]["encoderblock"]
  np.testing.assert_array_equal(
    block["MlpBlock_3"]["Dense_0"]["kernel"][1],
    params["Transformer"]["encoderblock_1"]["MlpBlock_3"]["Dense_0"]["kernel"],
  )
  _assert_trees_equal(checkpoint.unstack_encoder_blocks(stacked), params)
  images = _images(TINY_IMAGES)
  np.testing.assert_allclose(
    _logits(scan_model, stacked, images), _logits(model, params, images), rtol=1e-6, atol=1e-6
  )


def test_save_unstacks_scan_params(tiny, tmp_path):
  _, params = tiny
  checkpoint.save(checkpoint.stack_encoder_blocks(params), tmp_path / "scan.npz")
  keys = _npz_keys(tmp_path / "scan.npz")
  assert not any(k.startswith("Transformer/encoderblock/") for k in keys)
  _assert_trees_equal(checkpoint.load(tmp_path / "scan.npz"), params)


def test_failed_save_keeps_the_existing_file(tiny, tmp_path):
  _, params = tiny
  path = tmp_path / "keep.npz"
  checkpoint.save(params, path)
  before = path.read_bytes()
  bad = dict(params, extra={"kernel": np.array([1, "a"], dtype=object)})
  with pytest.raises(ValueError):
    checkpoint.save(bad, path)
  assert path.read_bytes() == before
  assert os.listdir(tmp_path) == ["keep.npz"]


def test_load_refuses_pickled_arrays(tmp_path):
  path = tmp_path / "pickled.npz"
  np.savez(path, **{"embedding/kernel": np.array([{"a": 1}], dtype=object)}, allow_pickle=True)
  with pytest.raises(ValueError, match="embedding/kernel.*never unpickles"):
    checkpoint.load(path)


def test_module_imports_without_tensorflow():
  code = "import sys, vit_jax.checkpoint; assert 'tensorflow' not in sys.modules"
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_remote_paths_go_through_gfile(tiny):
  tf = pytest.importorskip("tensorflow")
  _, params = tiny
  path = "ram://vit_checkpoint_test/tiny.npz"
  checkpoint.save(params, path)
  assert tf.io.gfile.listdir("ram://vit_checkpoint_test/") == ["tiny.npz"]
  _assert_trees_equal(checkpoint.load(path), params)


def test_old_format_quirks_are_fixed(tmp_path):
  # An old hybrid file under a flax-optimizer prefix, with GroupNorm params as [1, 1, 1, C].
  flat = {
    "opt/target/conv_root/kernel": np.ones((7, 7, 3, 64), np.float32),
    "opt/target/gn_root/scale": np.ones((1, 1, 1, 64), np.float32),
    "opt/target/block1/unit1/gn_proj/bias": np.zeros((1, 1, 1, 256), np.float32),
  }
  np.savez(tmp_path / "old.npz", **flat)
  params = checkpoint.load(tmp_path / "old.npz")
  assert params["gn_root"]["scale"].shape == (64,)
  assert params["block1"]["unit1"]["gn_proj"]["bias"].shape == (256,)
  assert params["conv_root"]["kernel"].shape == (7, 7, 3, 64)


# ---------------------------------------------------------------------------------------------
# big_vision files.

_TO_BIG_VISION = {
  "LayerNorm_0": "LayerNorm_0",
  "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
  "LayerNorm_2": "LayerNorm_1",
  "MlpBlock_3": "MlpBlock_0",
}


def _big_vision_flat(params, stacked, prefix="", combined_posemb=False):
  """The same network as big_vision would store it (names, posemb outside the encoder)."""
  flat = checkpoint.flatten_params(params)
  if stacked:
    flat = checkpoint.flatten_params(checkpoint.stack_encoder_blocks(params))
  out = {}
  for k, v in flat.items():
    parts = k.split("/")
    if parts[0] == "Transformer" and parts[1].startswith("encoderblock"):
      parts[2] = _TO_BIG_VISION[parts[2]]
    out["/".join(parts)] = v
  posemb = out.pop(POSEMB)
  if combined_posemb:  # big_vision before 2022: posemb with the class slot, under Transformer/.
    out["Transformer/pos_embedding"] = posemb
  elif "cls" in out:
    # big_vision adds posemb to the patches only, so its cls token carries the class slot.
    out["cls"] = out["cls"] + posemb[:, :1]
    out["pos_embedding"] = posemb[:, 1:]
  else:
    out["pos_embedding"] = posemb
  return {prefix + k: v for k, v in out.items()}


@pytest.mark.parametrize(
  "stacked,prefix,combined",
  [(False, "", False), (True, "params/", False), (True, "", False), (False, "", True)],
  ids=["unstacked", "stacked-params-prefix", "stacked", "old-combined-posemb"],
)
def test_big_vision_file_loads_to_the_same_network(
  tiny, tiny_scan, tmp_path, stacked, prefix, combined
):
  model, params = tiny
  path = tmp_path / "bv.npz"
  np.savez(path, **_big_vision_flat(params, stacked, prefix, combined))
  loaded = checkpoint.load(path)
  assert ("encoderblock" in loaded["Transformer"]) == stacked
  assert loaded[POSEMB.split("/")[0]]["posembed_input"]["pos_embedding"].shape == (1, 17, 32)
  images = _images(TINY_IMAGES)
  want = _logits(model, params, images)
  # Passing the original params as init_params keeps their head: the network must be unchanged.
  adapted = checkpoint.load_pretrained(path, params, models.get_model_config("testing"))
  np.testing.assert_allclose(_logits(model, adapted, images), want, rtol=1e-6, atol=1e-6)
  scan_model, scan_shapes = tiny_scan
  scan_init = dict(scan_shapes, head=params["head"])
  adapted = checkpoint.load_pretrained(path, scan_init, models.get_model_config("testing"))
  np.testing.assert_allclose(_logits(scan_model, adapted, images), want, rtol=1e-6, atol=1e-6)


def test_big_vision_gap_file(tmp_path):
  _, shapes = _shapes("testing", 5, TINY_IMAGES, classifier="gap")
  params = _random_like(shapes)
  np.savez(tmp_path / "bv_gap.npz", **_big_vision_flat(params, stacked=True, prefix="params/"))
  config = models.get_model_config("testing")
  config.classifier = "gap"
  adapted = checkpoint.load_pretrained(tmp_path / "bv_gap.npz", params, config)
  _assert_trees_equal(adapted, params)


def test_big_vision_map_head_is_refused(tiny, tmp_path):
  _, params = tiny
  flat = _big_vision_flat(params, stacked=False)
  flat["MAPHead_0/probe"] = np.zeros((1, 1, 32), np.float32)
  np.savez(tmp_path / "map.npz", **flat)
  with pytest.raises(ValueError, match="MAP-head"):
    checkpoint.load(tmp_path / "map.npz")


# ---------------------------------------------------------------------------------------------
# Position embedding resizing.


def _cubic_reference(n_in, n_out):
  """[n_out, n_in] Keys cubic (a=-0.5) weights at pixel centres, renormalised at the borders."""
  centres = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
  x = np.abs(centres[:, None] - np.arange(n_in)[None, :])
  a = -0.5
  w = np.where(
    x <= 1,
    (a + 2) * x**3 - (a + 3) * x**2 + 1,
    np.where(x < 2, a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a, 0.0),
  )
  return w / w.sum(axis=1, keepdims=True), centres


def test_resize_posemb_same_grid_is_identity():
  posemb = np.random.default_rng(0).standard_normal((1, 1 + 7 * 7, 8)).astype(np.float32)
  out = checkpoint.resize_posemb(posemb, 7)
  np.testing.assert_array_equal(out, posemb)
  assert out is not posemb


def test_resize_posemb_non_square_matches_reference_and_keeps_class_slot():
  (oh, ow), (nh, nw), width = (5, 7), (8, 11), 6
  rng = np.random.default_rng(0)
  posemb = rng.standard_normal((1, 1 + oh * ow, width)).astype(np.float32)
  out = checkpoint.resize_posemb(posemb, (nh, nw), old_grid=(oh, ow))
  assert out.shape == (1, 1 + nh * nw, width) and out.dtype == np.float32
  np.testing.assert_array_equal(out[:, :1], posemb[:, :1])
  wh, _ = _cubic_reference(oh, nh)
  ww, _ = _cubic_reference(ow, nw)
  want = np.einsum(
    "ih,jw,hwd->ijd", wh, ww, posemb[0, 1:].reshape(oh, ow, width).astype(np.float64)
  )
  np.testing.assert_allclose(out[0, 1:].reshape(nh, nw, width), want, atol=1e-5)


def test_resize_posemb_reproduces_a_linear_ramp():
  (oh, ow), (nh, nw) = (6, 9), (13, 10)  # up in one axis, down in the other
  y, x = np.mgrid[:oh, :ow].astype(np.float32)
  ramp = np.stack([0.3 * y - 0.2 * x + 1.0, 0.5 * x, np.full_like(x, 2.0)], axis=-1)
  posemb = ramp.reshape(1, oh * ow, 3)
  out = checkpoint.resize_posemb(posemb, (nh, nw), num_prefix_tokens=0, old_grid=(oh, ow))
  out = out.reshape(nh, nw, 3)
  _, cy = _cubic_reference(oh, nh)
  _, cx = _cubic_reference(ow, nw)
  # Where all four taps lie inside the old grid, cubic convolution is exact on linear functions.
  iy = (np.floor(cy) >= 1) & (np.floor(cy) + 2 <= oh - 1)
  ix = (np.floor(cx) >= 1) & (np.floor(cx) + 2 <= ow - 1)
  assert iy.sum() >= 4 and ix.sum() >= 4
  want = np.stack(
    np.broadcast_arrays(
      0.3 * cy[:, None] - 0.2 * cx[None, :] + 1.0, 0.5 * cx[None, :] + 0 * cy[:, None], 2.0
    ),
    axis=-1,
  )
  np.testing.assert_allclose(out[np.ix_(iy, ix)], want[np.ix_(iy, ix)], atol=1e-5)
  # Constants everywhere, borders too, to the rounding of a 4x4-tap float32 sum (the weights sum
  # to one only up to their own rounding, which depends on how XLA orders the sum).
  np.testing.assert_allclose(out[..., 2], 2.0, atol=16 * np.finfo(np.float32).eps * 2.0)


def test_resize_posemb_needs_old_grid_when_not_square():
  with pytest.raises(ValueError, match="old_grid"):
    checkpoint.resize_posemb(np.zeros((1, 1 + 12, 4), np.float32), 4)


# ---------------------------------------------------------------------------------------------
# load_pretrained.


def test_non_square_fine_tuning_grid(tiny, tmp_path):
  _, params = tiny
  checkpoint.save(params, tmp_path / "pre.npz")
  model, init = _shapes("testing", 3, (1, 16, 24, 3))  # a 4x6 grid
  init = _zero_head(init)
  config = models.get_model_config("testing")
  with pytest.raises(ValueError, match="image_size"):
    checkpoint.load_pretrained(tmp_path / "pre.npz", init, config)
  config.image_size = (16, 24)
  adapted = checkpoint.load_pretrained(tmp_path / "pre.npz", init, config)
  old = params["Transformer"]["posembed_input"]["pos_embedding"]
  want = checkpoint.resize_posemb(old, (4, 6), old_grid=(4, 4))
  np.testing.assert_array_equal(adapted["Transformer"]["posembed_input"]["pos_embedding"], want)
  assert np.isfinite(_logits(model, adapted, _images((1, 16, 24, 3)))).all()
  # Parameters already in memory (a pretraining run's Orbax state) adapt exactly like the file.
  in_memory = checkpoint.load_pretrained(params, init, config)
  trees.assert_equal(in_memory, adapted)


def test_hybrid_patch_grid_follows_the_resnet_strides():
  config = models.get_model_config("R50+B/16")
  config.image_size = (200, 296)  # not multiples of 16: SAME padding rounds up at each stride
  model = models.get_model(config, 4, num_layers=1)
  shapes = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, 200, 296, 3)), train=False)
  )
  tokens = shapes["params"]["Transformer"]["posembed_input"]["pos_embedding"].shape[1]
  assert checkpoint.patch_grid(config, tokens - 1) == (13, 19)


def test_missing_and_unexpected_keys_are_listed(tiny, tmp_path):
  _, params = tiny
  deeper = _random_like(_shapes("testing", 5, TINY_IMAGES, num_layers=3)[1])
  checkpoint.save(deeper, tmp_path / "deeper.npz")
  config = models.get_model_config("testing")
  with pytest.raises(ValueError) as e:
    checkpoint.load_pretrained(tmp_path / "deeper.npz", params, config)
  assert re.search(r"16 unexpected in the checkpoint: Transformer/encoderblock_2/", str(e.value))
  assert "Transformer/encoderblock_2/MlpBlock_3/Dense_1/kernel" in str(e.value)
  config.representation_size = 32
  with_rep = _zero_head(_shapes("testing", 5, TINY_IMAGES, representation_size=32)[1])
  with pytest.raises(ValueError, match="2 missing from the checkpoint: pre_logits/"):
    checkpoint.load_pretrained(tmp_path / "deeper.npz", with_rep, config)


def test_class_token_mismatch_is_explained(tiny, tmp_path):
  _, params = tiny
  checkpoint.save(params, tmp_path / "token.npz")
  gap_init = _zero_head(_shapes("testing", 5, (1, 32, 32, 3), classifier="gap")[1])
  config = models.get_model_config("testing")
  config.classifier = "gap"
  with pytest.raises(ValueError, match="class token"):
    checkpoint.load_pretrained(tmp_path / "token.npz", gap_init, config)


def test_l16_file_into_b16_names_the_first_mismatch(tmp_path):
  # A one-layer L/16 keeps the file small; its names and widths are L/16's.
  _, l16 = _shapes("L/16", 1000, (1, 224, 224, 3), num_layers=1)
  checkpoint.save(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), l16), tmp_path / "l16.npz")
  b16 = _zero_head(_shapes("B/16", 10, (1, 224, 224, 3))[1])
  with pytest.raises(ValueError) as e:
    checkpoint.load_pretrained(tmp_path / "l16.npz", b16, models.get_model_config("B/16"))
  message = str(e.value)
  # The first line (the one a command prints) carries the reason.
  assert message.splitlines()[0].endswith(
    "does not fit the model: first shape mismatch at 'embedding/kernel': checkpoint "
    "(16, 16, 3, 1024) vs model (16, 16, 3, 768)"
  )
  assert "missing from the checkpoint: Transformer/encoderblock_1/" in message


@pytest.fixture(scope="module")
def b16_21k_file(tmp_path_factory):
  """A random ViT-B/16 at 224px with pre_logits and a 21,843-class head, in the published layout."""
  model, shapes = _shapes("B/16", 21843, (1, 224, 224, 3), representation_size=768)
  params = _random_like(shapes)
  path = tmp_path_factory.mktemp("b16") / "ViT-B_16.npz"
  checkpoint.save(params, path)
  return model, params, path


def test_b16_reload_gives_identical_logits(b16_21k_file):
  model, params, path = b16_21k_file
  keys = _npz_keys(path)
  assert {"pre_logits/kernel", "head/kernel", "cls", POSEMB} <= keys
  with zipfile.ZipFile(path) as z:  # the published layout: one .npy member per name
    assert "Transformer/encoderblock_11/MlpBlock_3/Dense_1/bias.npy" in z.namelist()
  reloaded = checkpoint.load(path)
  _assert_trees_equal(reloaded, params)
  images = _images((2, 224, 224, 3))
  np.testing.assert_array_equal(_logits(model, reloaded, images), _logits(model, params, images))


def test_b16_21k_at_224_fine_tunes_at_384_with_10_classes(b16_21k_file):
  _, params, path = b16_21k_file
  config = models.get_model_config("B/16")
  config.image_size = 384
  model, init = _shapes("B/16", 10, (1, 384, 384, 3))
  init = _zero_head(init)
  adapted = checkpoint.load_pretrained(path, init, config)
  assert "pre_logits" not in adapted
  assert jax.tree.map(np.shape, adapted) == jax.tree.map(lambda s: s.shape, init)
  np.testing.assert_array_equal(adapted["head"]["kernel"], 0)
  np.testing.assert_array_equal(adapted["embedding"]["kernel"], params["embedding"]["kernel"])
  old = params["Transformer"]["posembed_input"]["pos_embedding"]  # [1, 197, 768]
  new = adapted["Transformer"]["posembed_input"]["pos_embedding"]  # [1, 577, 768]
  assert new.shape == (1, 577, 768)
  np.testing.assert_array_equal(new[:, :1], old[:, :1])
  logits = _logits(model, adapted, _images((1, 384, 384, 3)))
  assert logits.shape == (1, 10) and np.isfinite(logits).all()


def test_pre_logits_kept_when_the_new_model_has_them(tmp_path):
  _, shapes = _shapes("testing", 7, TINY_IMAGES, representation_size=16)
  params = _random_like(shapes)
  checkpoint.save(params, tmp_path / "rep.npz")
  config = models.get_model_config("testing")
  config.representation_size = 16
  init = _zero_head(_shapes("testing", 3, TINY_IMAGES, representation_size=16)[1])
  adapted = checkpoint.load_pretrained(tmp_path / "rep.npz", init, config)
  _assert_trees_equal(adapted["pre_logits"], params["pre_logits"])
  _assert_trees_equal(adapted["head"], init["head"])
  config.representation_size = None
  init = _zero_head(_shapes("testing", 3, TINY_IMAGES)[1])
  assert "pre_logits" not in checkpoint.load_pretrained(tmp_path / "rep.npz", init, config)


# ---------------------------------------------------------------------------------------------
# BiT ResNets: the published BiT layout (`resnet/...`) in and out.

BIT_IMAGES = (2, 32, 32, 3)


@pytest.fixture(scope="module")
def tiny_bit():
  model, shapes = _shapes("R26x1", 5, BIT_IMAGES, block_units=(1, 2))
  return model, _random_like(shapes)


def test_bit_save_writes_the_published_layout_and_loads_back(tiny_bit, tmp_path):
  _, params = tiny_bit
  path = tmp_path / "bit.npz"
  checkpoint.save(params, path)
  keys = _npz_keys(path)
  assert all(k.startswith("resnet/") for k in keys)
  for name in (
    "resnet/root_block/standardized_conv2d/kernel",
    "resnet/block1/unit01/a/group_norm/gamma",
    "resnet/block1/unit01/a/proj/standardized_conv2d/kernel",
    "resnet/block2/unit02/c/standardized_conv2d/kernel",
    "resnet/group_norm/beta",
    "resnet/head/conv2d/kernel",
    "resnet/head/conv2d/bias",
  ):
    assert name in keys, name
  _assert_trees_equal(checkpoint.load(path), params)


def test_bit_published_file_fine_tunes_with_a_new_head(tiny_bit, tmp_path):
  """A file written the way BiT's are (flat `resnet/` names, [C] GroupNorm parameters) loads
  into a model with another number of classes: everything but the head is kept."""
  model, params = tiny_bit
  flat = {f"resnet/{k}": v for k, v in checkpoint.flatten_params(params).items()}
  np.savez(tmp_path / "BiT-tiny.npz", **flat)
  new_model, shapes = _shapes("R26x1", 3, BIT_IMAGES, block_units=(1, 2))
  loaded = checkpoint.load_pretrained(tmp_path / "BiT-tiny.npz", _zero_head(shapes), {})
  assert loaded["head"]["conv2d"]["kernel"].shape == (1, 1, 256, 3)
  assert not np.any(loaded["head"]["conv2d"]["kernel"])
  rest = lambda tree: {k: v for k, v in tree.items() if k != "head"}  # noqa: E731
  _assert_trees_equal(rest(loaded), rest(params))
  images = _images(BIT_IMAGES)
  np.testing.assert_array_equal(_logits(new_model, loaded, images), 0.0)
  rep = lambda m, p: m.apply({"params": p}, images, train=False)[1]["pre_logits"]  # noqa: E731
  np.testing.assert_array_equal(rep(new_model, loaded), rep(model, params))


def test_bit_file_into_another_depth_is_explained(tiny_bit, tmp_path):
  _, params = tiny_bit
  checkpoint.save(params, tmp_path / "bit.npz")
  _, shapes = _shapes("R26x1", 5, BIT_IMAGES, block_units=(1, 1))
  with pytest.raises(ValueError, match=r"unexpected in the checkpoint: block2/unit02/a/"):
    checkpoint.load_pretrained(tmp_path / "bit.npz", _zero_head(shapes), {})
