"""timm and Hugging Face layouts without torch: name mapping, round trips, errors, convert CLI.

The PyTorch side is checked against the documented state-dict names (timm's
`VisionTransformer` and `vision_transformer_hybrid`, transformers' `ViTModel` /
`ViTForImageClassification`); the logits against timm and transformers themselves are in the
slow tests/test_torch_interop.py.
"""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from tests.helpers import REPO
from vit_jax import checkpoint, models
from vit_jax.checkpoint.state import train_state
from vit_jax.checkpoint.weights import timm_hf
from vit_jax.models.vit import MultiHeadDotProductAttention
from vit_jax.tools import convert

IMAGE = 32  # the testing preset: 4x4 patches -> an 8x8 grid


def _random_flat(seed=0, **overrides):
  """Flat random parameters of the `testing` preset (every leaf non-zero, heads included)."""
  model = models.get_model("testing", 5, **overrides)
  shapes = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, IMAGE, IMAGE, 3)), train=False)
  )["params"]
  rng = np.random.default_rng(seed)
  flat = checkpoint.flatten_params(shapes)
  return {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in flat.items()}


def _assert_bit_exact(got, want):
  assert sorted(got) == sorted(want)
  for name, value in want.items():
    assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
    np.testing.assert_array_equal(got[name], value, err_msg=name)


# ---------------------------------------------------------------------------------------------
# Name mapping.


def test_timm_layout_round_trip_is_bit_exact():
  flat = _random_flat()
  sd = timm_hf.to_timm(flat)
  # timm VisionTransformer names and torch shapes ([out, in], [out, in, kh, kw]).
  assert {k: v.shape for k, v in sd.items() if not k.startswith("blocks.")} == {
    "cls_token": (1, 1, 32),
    "pos_embed": (1, 65, 32),
    "patch_embed.proj.weight": (32, 3, 4, 4),
    "patch_embed.proj.bias": (32,),
    "norm.weight": (32,),
    "norm.bias": (32,),
    "head.weight": (5, 32),
    "head.bias": (5,),
  }
  assert {k[len("blocks.1.") :]: v.shape for k, v in sd.items() if k.startswith("blocks.1.")} == {
    "norm1.weight": (32,),
    "norm1.bias": (32,),
    "attn.qkv.weight": (96, 32),
    "attn.qkv.bias": (96,),
    "attn.proj.weight": (32, 32),
    "attn.proj.bias": (32,),
    "norm2.weight": (32,),
    "norm2.bias": (32,),
    "mlp.fc1.weight": (64, 32),
    "mlp.fc1.bias": (64,),
    "mlp.fc2.weight": (32, 64),
    "mlp.fc2.bias": (32,),
  }
  assert len(sd) == 8 + 2 * 12
  # Rows of qkv: query, key, value, each head after head (row h * head_dim + d).
  attn = "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/"
  np.testing.assert_array_equal(
    sd["blocks.1.attn.qkv.weight"][32 + 16 + 3], flat[attn + "key/kernel"][:, 1, 3]
  )
  np.testing.assert_array_equal(
    sd["blocks.1.attn.qkv.bias"][64 + 5], flat[attn + "value/bias"][0, 5]
  )
  np.testing.assert_array_equal(
    sd["blocks.1.attn.proj.weight"][7, 16 + 2], flat[attn + "out/kernel"][1, 2, 7]
  )
  np.testing.assert_array_equal(
    sd["patch_embed.proj.weight"][9, 2, 1, 3], flat["embedding/kernel"][1, 3, 2, 9]
  )
  _assert_bit_exact(timm_hf.from_torch(sd, num_heads=2), flat)


def test_timm_gap_and_hybrid_round_trip():
  gap = _random_flat(classifier="gap")
  sd = timm_hf.to_timm(gap)
  assert "cls_token" not in sd and sd["pos_embed"].shape == (1, 64, 32)
  _assert_bit_exact(timm_hf.from_torch(sd, num_heads=2), gap)

  hybrid = _random_flat(patch_size=1, resnet=dict(num_layers=(2, 1), width_factor=0.5))
  sd = timm_hf.to_timm(hybrid)
  stem = "patch_embed.backbone."
  assert sd[stem + "stem.conv.weight"].shape == (32, 3, 7, 7)
  assert sd[stem + "stem.norm.weight"].shape == (32,)
  assert sd[stem + "stages.0.blocks.0.downsample.conv.weight"].shape == (128, 32, 1, 1)
  assert sd[stem + "stages.0.blocks.1.conv2.weight"].shape == (32, 32, 3, 3)
  assert sd[stem + "stages.1.blocks.0.norm3.bias"].shape == (256,)
  assert stem + "stages.0.blocks.1.downsample.conv.weight" not in sd
  assert sd["patch_embed.proj.weight"].shape == (32, 256, 1, 1)
  _assert_bit_exact(timm_hf.from_torch(sd, num_heads=2), hybrid)
  # The architecture of a hybrid is read back from its shapes (units per stage, width).
  config = checkpoint.model_config_from_params(checkpoint.unflatten_params(hybrid))
  assert (tuple(config.resnet.num_layers), config.resnet.width_factor) == ((2, 1), 0.5)
  assert (config.patch_size, config.num_heads, config.num_layers) == (1, 2, 2)


def test_hf_layout_round_trip_is_bit_exact():
  flat = _random_flat()
  sd, architecture = timm_hf.to_hf(flat)
  assert architecture == "ViTForImageClassification"
  layer = "vit.encoder.layer.0."
  assert {k: v.shape for k, v in sd.items() if k.startswith(layer)} == {
    layer + "layernorm_before.weight": (32,),
    layer + "layernorm_before.bias": (32,),
    layer + "attention.attention.query.weight": (32, 32),
    layer + "attention.attention.query.bias": (32,),
    layer + "attention.attention.key.weight": (32, 32),
    layer + "attention.attention.key.bias": (32,),
    layer + "attention.attention.value.weight": (32, 32),
    layer + "attention.attention.value.bias": (32,),
    layer + "attention.output.dense.weight": (32, 32),
    layer + "attention.output.dense.bias": (32,),
    layer + "layernorm_after.weight": (32,),
    layer + "layernorm_after.bias": (32,),
    layer + "intermediate.dense.weight": (64, 32),
    layer + "intermediate.dense.bias": (64,),
    layer + "output.dense.weight": (32, 64),
    layer + "output.dense.bias": (32,),
  }
  assert {k: v.shape for k, v in sd.items() if "encoder.layer" not in k} == {
    "vit.embeddings.cls_token": (1, 1, 32),
    "vit.embeddings.position_embeddings": (1, 65, 32),
    "vit.embeddings.patch_embeddings.projection.weight": (32, 3, 4, 4),
    "vit.embeddings.patch_embeddings.projection.bias": (32,),
    "vit.layernorm.weight": (32,),
    "vit.layernorm.bias": (32,),
    "classifier.weight": (5, 32),
    "classifier.bias": (5,),
  }
  _assert_bit_exact(timm_hf.from_torch(sd, num_heads=2), flat)

  # Headless with a representation layer: ViTModel, whose pooler is Dense + tanh.
  backbone = {k: v for k, v in _random_flat(representation_size=16).items() if "head" not in k}
  sd, architecture = timm_hf.to_hf(backbone)
  assert architecture == "ViTModel"
  assert sd["pooler.dense.weight"].shape == (16, 32) and "embeddings.cls_token" in sd
  _assert_bit_exact(timm_hf.from_torch(sd, num_heads=2), backbone)


def test_transformers5_in_memory_names_read_too():
  flat = _random_flat()
  sd, _ = timm_hf.to_hf(flat)
  renames = {
    "encoder.layer.": "layers.",
    "attention.attention.query": "attention.q_proj",
    "attention.attention.key": "attention.k_proj",
    "attention.attention.value": "attention.v_proj",
    "attention.output.dense": "attention.o_proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
  }
  renamed = {}
  for name, value in sd.items():
    for old, new in renames.items():
      name = name.replace(old, new)
    renamed[name] = value
  assert "vit.layers.1.mlp.fc2.weight" in renamed
  _assert_bit_exact(timm_hf.from_torch(renamed, num_heads=2), flat)


@pytest.mark.parametrize("layout", ["timm", "hf"])
def test_torch_attention_layout_computes_our_attention(layout):
  """The head split is right: torch-style attention on the exported arrays (numpy) equals ours."""
  flat = _random_flat()
  prefix = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/"
  params = checkpoint.unflatten_params(
    {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
  )
  x = np.random.default_rng(1).standard_normal((2, 7, 32)).astype(np.float32)
  ours = MultiHeadDotProductAttention(num_heads=2).apply({"params": params}, jnp.asarray(x), True)
  if layout == "timm":
    sd = timm_hf.to_timm(flat)
    qkv = x @ sd["blocks.0.attn.qkv.weight"].T + sd["blocks.0.attn.qkv.bias"]
    q, k, v = np.moveaxis(qkv.reshape(2, 7, 3, 2, 16), 2, 0)  # timm: (B, N, 3, heads, hd)
    proj_w, proj_b = sd["blocks.0.attn.proj.weight"], sd["blocks.0.attn.proj.bias"]
  else:
    sd, _ = timm_hf.to_hf(flat)
    base = "vit.encoder.layer.0.attention."
    q, k, v = (
      (x @ sd[f"{base}attention.{n}.weight"].T + sd[f"{base}attention.{n}.bias"]).reshape(
        2, 7, 2, 16
      )
      for n in ("query", "key", "value")
    )
    proj_w, proj_b = sd[base + "output.dense.weight"], sd[base + "output.dense.bias"]
  # The reference in float64; ours is float32, whose rounding grows with the outputs' scale
  # (up to ~100 with these weights): a wrong head split is off by the scale itself.
  q, k, v, proj_w, proj_b = (np.asarray(a, np.float64) for a in (q, k, v, proj_w, proj_b))
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  out = np.einsum("bhqk,bkhd->bqhd", weights, v).reshape(2, 7, 32) @ proj_w.T + proj_b
  np.testing.assert_allclose(np.asarray(ours), out, atol=4e-6 * np.abs(out).max(), rtol=0)


def test_no_embed_class_posemb_gets_a_zero_class_slot():
  flat = _random_flat()
  sd = timm_hf.to_timm(flat)
  sd["pos_embed"] = sd["pos_embed"][:, 1:]  # timm no_embed_class: the class token has none
  loaded = timm_hf.from_torch(sd, num_heads=2)
  posemb = loaded["Transformer/posembed_input/pos_embedding"]
  np.testing.assert_array_equal(posemb[:, 0], 0.0)
  np.testing.assert_array_equal(
    posemb[:, 1:], flat["Transformer/posembed_input/pos_embedding"][:, 1:]
  )


# ---------------------------------------------------------------------------------------------
# What cannot be represented.


@pytest.mark.parametrize(
  "edit, message",
  [
    (lambda sd: sd.update({"blocks.0.ls1.gamma": np.ones(32, np.float32)}), "layer-scale"),
    (lambda sd: sd.update({"reg_token": np.zeros((1, 4, 32), np.float32)}), "register tokens"),
    (lambda sd: sd.update({"dist_token": np.zeros((1, 1, 32), np.float32)}), "distillation"),
    (lambda sd: sd.update({"norm_pre.weight": np.ones(32, np.float32)}), "before the encoder"),
    (lambda sd: sd.update({"fc_norm.weight": sd.pop("norm.weight")}), "after pooling"),
    (lambda sd: sd.update({"blocks.1.attn.q_norm.weight": np.ones(16, np.float32)}), "QK-norm"),
    (lambda sd: sd.update({"attn_pool.latent": np.ones((1, 1, 32), np.float32)}), "MAP"),
    (lambda sd: sd.pop("blocks.1.norm2.bias"), "RMSNorm"),
    (lambda sd: [sd.pop("norm.weight"), sd.pop("norm.bias")], "no final LayerNorm"),
    (lambda sd: sd.update({"blocks.0.mystery.weight": np.ones(3, np.float32)}), "blocks.0.mystery"),
  ],
  ids=[
    "layer-scale",
    "registers",
    "distilled",
    "pre-norm",
    "fc-norm",
    "qk-norm",
    "map",
    "rmsnorm",
    "no-norm",
    "unknown",
  ],
)
def test_unrepresentable_timm_architectures_are_refused(edit, message):
  sd = timm_hf.to_timm(_random_flat())
  edit(sd)
  with pytest.raises(ValueError, match=message):
    timm_hf.from_torch(sd, num_heads=2, source="x.safetensors")


def test_export_refusals():
  with pytest.raises(ValueError, match="no representation layer"):
    timm_hf.to_timm(_random_flat(representation_size=16))
  with pytest.raises(ValueError, match="class token"):
    timm_hf.to_hf(_random_flat(classifier="gap"))
  with pytest.raises(ValueError, match="ResNet stem"):
    timm_hf.to_hf(_random_flat(patch_size=1, resnet=dict(num_layers=(1,), width_factor=0.5)))
  with pytest.raises(ValueError, match="both pre_logits and a head"):
    timm_hf.to_hf(_random_flat(representation_size=16))
  with pytest.raises(ValueError, match="not a timm or Hugging Face"):
    timm_hf.from_torch({"conv1.weight": np.zeros((1, 1, 1, 1))})


# ---------------------------------------------------------------------------------------------
# checkpoint.load of .safetensors files.


def test_load_reads_timm_and_hf_safetensors(tmp_path):
  flat = _random_flat()
  timm_path, hf_path = (
    tmp_path / "timm" / "model.safetensors",
    tmp_path / "hf" / "model.safetensors",
  )
  checkpoint.save_safetensors(timm_hf.to_timm(flat), timm_path)
  checkpoint.save_safetensors(timm_hf.to_hf(flat)[0], hf_path)
  with safetensors.safe_open(str(hf_path), framework="np") as f:
    assert f.metadata() == {"format": "pt"}  # what transformers expects
  # Width 32 is no preset's: without a config.json the head count is unknown.
  with pytest.raises(ValueError, match="pass num_heads"):
    checkpoint.load(timm_path)
  loaded = checkpoint.load(timm_path, num_heads=2)
  _assert_bit_exact(checkpoint.flatten_params(loaded), flat)
  (hf_path.parent / "config.json").write_text(
    json.dumps({"model_type": "vit", "num_attention_heads": 2})
  )
  assert checkpoint.file_layout(hf_path) == "hf" and checkpoint.file_layout(timm_path) == "timm"
  _assert_bit_exact(checkpoint.flatten_params(checkpoint.load(hf_path)), flat)

  # A wrong head count is a clear error, not a silent misreading... when shapes disagree.
  with pytest.raises(ValueError, match="not divisible by 5 heads"):
    checkpoint.load(timm_path, num_heads=5)
  (tmp_path / "model.bin").write_bytes(b"\x80\x04")
  with pytest.raises(ValueError, match="never unpickles"):
    checkpoint.load(tmp_path / "model.bin")
  (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
  with pytest.raises(ValueError, match="not a readable safetensors"):
    checkpoint.load(tmp_path / "bad.safetensors")


def test_load_pretrained_fine_tunes_from_a_timm_file(tmp_path):
  flat = _random_flat()
  path = tmp_path / "model.safetensors"
  checkpoint.save_safetensors(timm_hf.to_timm(flat), path)
  (tmp_path / "config.json").write_text(
    json.dumps({"architecture": "x", "model_args": {"num_heads": 2}})
  )
  config = models.get_model_config("testing")
  config.image_size = 48
  model = models.get_model(config, 3)
  init = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, 48, 48, 3)), train=False)
  )["params"]
  init["head"] = {"kernel": np.zeros((32, 3), np.float32), "bias": np.zeros(3, np.float32)}
  adapted = checkpoint.load_pretrained(path, init, config)
  assert adapted["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 145, 32)
  np.testing.assert_array_equal(adapted["cls"], flat["cls"])


def test_config_fields_read_the_gelu_and_heads():
  assert timm_hf.config_fields(None) == {}
  hf = timm_hf.config_fields({"model_type": "vit", "num_attention_heads": 12})
  assert hf == {"num_heads": 12, "gelu_approximate": False, "layer_norm_eps": 1e-12}
  timm_cfg = {"architecture": "vit_base_patch16_224", "model_args": {"act_layer": "gelu_tanh"}}
  assert timm_hf.config_fields(timm_cfg) == {"gelu_approximate": True}
  with pytest.raises(ValueError, match="'quick_gelu' is not a GELU"):
    timm_hf.config_fields({"model_type": "vit", "hidden_act": "quick_gelu"})


# ---------------------------------------------------------------------------------------------
# The convert tool.


def test_convert_npz_to_timm_hf_and_back(tmp_path):
  flat = _random_flat()
  checkpoint.save(checkpoint.unflatten_params(flat), tmp_path / "ours.npz")
  timm_dir, hf_dir = tmp_path / "timm", tmp_path / "hf"
  convert.convert(str(tmp_path / "ours.npz"), str(timm_dir))  # --to=timm by default
  config = json.loads((timm_dir / "config.json").read_text())
  assert config["architecture"] == "vit_base_patch16_224" and config["num_classes"] == 5
  assert config["model_args"] == dict(
    img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0,
    class_token=True, global_pool="token", fc_norm=False, act_layer="gelu_tanh",
  )  # fmt: skip
  assert config["pretrained_cfg"]["mean"] == [0.5, 0.5, 0.5]
  # timm -> hf: the head count comes from timm's config.json, the GELU stays tanh.
  convert.convert(str(timm_dir), str(hf_dir), "hf")
  hf = json.loads((hf_dir / "config.json").read_text())
  assert (
    hf["architectures"] == ["ViTForImageClassification"] and hf["hidden_act"] == "gelu_pytorch_tanh"
  )
  assert (hf["num_attention_heads"], hf["image_size"], hf["layer_norm_eps"]) == (2, 32, 1e-6)
  assert len(hf["id2label"]) == 5
  written = convert.convert(str(hf_dir), str(tmp_path / "back"))  # --to=npz by default
  _assert_bit_exact(checkpoint.flatten_params(checkpoint.load(written["weights"])), flat)
  model_config, params, _ = checkpoint.load_backbone(written["weights"])
  assert model_config.gelu_approximate and model_config.num_heads == 2

  # A safetensors without a config says timm / HF defaults: exact GELU.
  (timm_dir / "config.json").unlink()
  model_config, _, layout = convert.read_model(str(timm_dir), num_heads=2)
  assert layout == "timm" and model_config.gelu_approximate is False


def test_convert_cli_from_a_trainer_workdir(tmp_path):
  model_config = models.get_model_config("testing")
  model_config.scan = True
  flat = _random_flat()
  params = checkpoint.stack_encoder_blocks(checkpoint.unflatten_params(flat))
  workdir = tmp_path / "workdir"
  checkpointer = train_state.Checkpointer(str(workdir), every_steps=1, keep=1, asynchronous=False)
  checkpointer.save(3, {"params": params, "step": np.int32(3)}, {"position": 0}, force=True)
  checkpointer.close()
  (workdir / "config.json").write_text(json.dumps({"model": model_config.to_dict()}))
  out = tmp_path / "timm"
  result = subprocess.run(
    [sys.executable, "-m", "vit_jax.tools.convert", f"--in={workdir}", f"--out={out}", "--to=timm"],
    capture_output=True, text=True, timeout=300, cwd=REPO,
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-2000:]
  sd = safetensors.numpy.load_file(out / "model.safetensors")
  _assert_bit_exact(timm_hf.from_torch(sd, num_heads=2), flat)
  assert json.loads((out / "config.json").read_text())["model_args"]["depth"] == 2
  # Refusals are one line naming the culprit.
  result = subprocess.run(
    [sys.executable, "-m", "vit_jax.tools.convert", f"--in={workdir}", f"--out={workdir}"],
    capture_output=True, text=True, timeout=300, cwd=REPO,
  )  # fmt: skip
  assert result.returncode != 0 and "is a trainer workdir" in result.stderr
