"""Feature maps (the models' `out['blocks']`, `out['normed_blocks']`) and the segmentation model
(encoder + head)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests.helpers import trees
from vit_jax import checkpoint, models
from vit_jax.models import segmentation


# Each model call compiled as one program: run op by op, a BiT's convolutions compile one
# program each (measured on 2 cores: a one-unit R26x1's init and forward 19.5 s op by op, 5.3 s).
def _init(model, size):
  init = jax.jit(lambda x: model.init(jax.random.key(0), x, train=False)["params"])
  return init(jnp.zeros((1, size, size, 3)))


def _apply(model, params, images, output="logits"):
  def fn(p, x):
    logits, out = model.apply({"params": p}, x, train=False)
    return logits if output == "logits" else out[output]

  return jax.jit(fn)(params, images)


def _maps(model, params, images, layers, norm=False):
  maps = _apply(model, params, images, "normed_blocks" if norm else "blocks")
  return [maps[i] for i in layers]


def _images(n, size, seed=1):
  return jax.random.uniform(jax.random.key(seed), (n, size, size, 3), minval=-1.0, maxval=1.0)


def test_vit_last_map_is_the_tokens_the_head_reads_and_block0_is_a_one_block_vit():
  model = models.get_model("testing", 10, attention_kernel="xla", layer_norm_kernel="xla")
  params = _init(model, 16)
  images = _images(2, 16)
  first, last = _maps(model, params, images, (0, -1), norm=True)
  assert first.shape == last.shape == (2, 4, 4, 32)  # 16px / 4px patches, width 32
  tokens = _apply(model, params, images, "tokens")
  np.testing.assert_array_equal(np.asarray(last).reshape(2, 16, 32), np.asarray(tokens))
  # Block 0's map, normed, is the output of the same ViT cut to its first block.
  one_block = models.get_model(
    "testing", 10, num_layers=1, attention_kernel="xla", layer_norm_kernel="xla"
  )
  cut = dict(
    params, Transformer={k: v for k, v in params["Transformer"].items() if k != "encoderblock_1"}
  )
  ref = _apply(one_block, cut, images, "tokens")
  np.testing.assert_allclose(np.asarray(first).reshape(2, 16, 32), ref, atol=1e-6)
  # Without the norm, the last map is the residual stream: not normalised.
  (raw,) = _maps(model, params, images, (1,))
  assert not np.allclose(raw, last, atol=1e-3)
  np.testing.assert_allclose(np.std(np.asarray(last), axis=-1), 1.0, atol=1e-2)


def test_scanned_vit_gives_the_same_maps():
  kw = dict(attention_kernel="xla", layer_norm_kernel="xla")
  model = models.get_model("testing", 10, **kw)
  scanned = models.get_model("testing", 10, scan=True, **kw)
  params = _init(model, 16)
  stacked = checkpoint.load_pretrained(params, _init(scanned, 16), scanned_config())
  images = _images(2, 16)
  want = _maps(model, params, images, (1, 0))
  got = _maps(scanned, stacked, images, (1, 0))
  for w, g in zip(want, got, strict=True):
    np.testing.assert_allclose(g, w, atol=1e-5)


def scanned_config():
  config = models.get_model_config("testing")
  config.scan = True
  return config


def test_hybrid_maps_are_on_the_resnet_grid():
  resnet = ml_collections.ConfigDict(dict(num_layers=(1,), width_factor=1))
  model = models.get_model("testing", 10, resnet=resnet, patch_size=1, layer_norm_kernel="xla")
  params = _init(model, 16)
  images = _images(2, 16)
  (last,) = _maps(model, params, images, (-1,), norm=True)
  # One-stage stem: 7x7/2 conv + max-pool /2 → 4x4 feature map, 1x1 patches.
  assert last.shape == (2, 4, 4, 32)
  tokens = _apply(model, params, images, "tokens")
  np.testing.assert_array_equal(np.asarray(last).reshape(2, 16, 32), np.asarray(tokens))


def _small_bit_config():
  """BiT-R26x1 with one unit per block: the same strides and widths, compiled in half the time."""
  config = models.get_model_config("R26x1")
  config.block_units = (1, 1, 1, 1)
  return config


def test_bit_maps_have_the_block_strides_and_the_last_one_pools_to_the_representation():
  model = models.get_model(_small_bit_config(), 10)
  params = _init(model, 32)
  images = _images(2, 32)
  maps = _maps(model, params, images, (0, 1, 2, 3), norm=True)
  assert [m.shape for m in maps] == [
    (2, 8, 8, 128),
    (2, 4, 4, 256),
    (2, 2, 2, 512),
    (2, 1, 1, 1024),
  ]
  rep = _apply(model, params, images, "pre_logits")
  np.testing.assert_allclose(np.mean(maps[3], axis=(1, 2)), rep, atol=1e-5)
  assert np.all(np.asarray(maps[3]) >= 0)  # after the final ReLU
  assert np.any(np.asarray(maps[2]) < 0)  # the residual stream, not activated


@pytest.mark.parametrize("layers", [(2,), (-3,)])
def test_a_layer_outside_the_model_is_one_clear_line(layers):
  with pytest.raises(ValueError, match=r"feature layer") as e:
    segmentation.get_model("testing", 10, "progressive", layers)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("encoder", ["testing", "bit"])
@pytest.mark.parametrize("head", segmentation.HEADS)
def test_segmentation_model_logits_per_pixel_and_loads_a_pretrained_encoder(encoder, head):
  config = models.get_model_config(encoder) if encoder == "testing" else _small_bit_config()
  model = segmentation.get_model(config, 11, head)
  params = _init(model, 32)
  images = _images(2, 32)
  logits = _apply(model, params, images)
  assert logits.shape == (2, 32, 32, 11) and logits.dtype == jnp.float32
  # The encoder's names are the classifier's: a classifier trained at 16px loads into it by
  # fine-tuning's loader, position embeddings resized to the 32px grid, the head kept fresh.
  classifier = models.get_model(config, 7)
  pretrained = _init(classifier, 16)
  loaded = checkpoint.load_pretrained(pretrained, params, config)
  assert jax.tree.map(np.shape, loaded) == jax.tree.map(np.shape, params)
  for name in set(params) - {"head"}:
    if name == "Transformer":
      np.testing.assert_array_equal(
        loaded[name]["encoderblock_0"]["MlpBlock_3"]["Dense_0"]["kernel"],
        pretrained[name]["encoderblock_0"]["MlpBlock_3"]["Dense_0"]["kernel"],
      )
    else:
      trees.assert_equal(loaded[name], pretrained[name])
  trees.assert_equal(loaded["head"], params["head"])
  if encoder == "testing":
    assert loaded["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 65, 32)


def test_linear_head_is_a_per_token_classifier_upsampled_bilinearly():
  model = segmentation.get_model("testing", 3, "linear")
  params = _init(model, 16)
  images = _images(1, 16)
  logits = np.asarray(_apply(model, params, images))
  (tokens,) = _maps(model, params, images, (-1,), norm=True)
  kernel, bias = (np.asarray(params["head"]["linear"][k]) for k in ("kernel", "bias"))
  coarse = np.asarray(tokens) @ kernel + bias  # [1, 4, 4, 3]
  # Bilinear ×4 (half-pixel centres: token j's centre is pixel 4j + 1.5). Pixels 7 and 8 lie
  # 1.5 and 2.5 px from the centres 5.5 and 9.5 of tokens 1 and 2, so the mean of the 2x2 pixels
  # 7..8 weighs the four tokens 1..2 x 1..2 equally; and every token's weights sum to 16 pixels,
  # so the mean over the image is kept.
  mid = coarse[0, 1:3, 1:3].mean(axis=(0, 1))
  np.testing.assert_allclose(logits[0, 7:9, 7:9].mean(axis=(0, 1)), mid, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(logits.mean(axis=(1, 2)), coarse.mean(axis=(1, 2)), atol=1e-4)
