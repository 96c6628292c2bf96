"""timm and Hugging Face read what `vit_jax.tools.convert` writes, and vice versa: same logits.

Each check runs the PyTorch side in a child process (PyTorch and TensorFlow crash when loaded
into one process, and other tests of the same worker import TensorFlow), on the same images as
ours, and compares logits:

- ours → timm: `timm.create_model('local-dir:DIR', pretrained=True)` from the written
  config.json, and a strict `load_state_dict` into the model its model_args describe; with our
  default tanh GELU (timm's `gelu_tanh`) and with `gelu_approximate=False` (timm's default);
- timm → ours: a timm model saved with timm's own `save_for_hf` (safetensors + config.json),
  plain ViT and R50 hybrid;
- Hugging Face `ViTForImageClassification` both ways (`from_pretrained` / `save_pretrained`).

Needs the optional torch, timm and transformers (skipped without them); marked slow.
"""

import importlib.util
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import random_weights
from vit_jax import checkpoint, models
from vit_jax.tools import convert

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # max abs logit difference, float32

_CHILD = r"""
import json, sys
import numpy as np
import torch
import safetensors.torch

mode, directory, images, out, extra = sys.argv[1:]
extra = json.loads(extra)
torch.set_num_threads(2)
torch.manual_seed(0)
x = torch.from_numpy(np.load(images)).permute(0, 3, 1, 2)  # NHWC -> NCHW
results = {}


def logits(model, dtype=torch.float32):
  model.eval()
  with torch.no_grad():
    y = model(x.to(dtype))
  return (y.logits if hasattr(y, "logits") else y).double().numpy()


def randomize(model):
  # Every parameter non-trivial (timm and HF initialise some to 0 or 1).
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn_like(p)
      module = name.rsplit(".", 2)[-2] if "." in name else name
      is_scale = "norm" in module and name.endswith(".weight")
      p.copy_(1.0 + 0.1 * noise if is_scale else 0.02 * noise)


if mode == "timm_export":
  import timm
  cfg = json.load(open(f"{directory}/config.json"))
  results["local_dir"] = logits(timm.create_model(f"local-dir:{directory}", pretrained=True))
  model = timm.create_model(cfg["architecture"], pretrained=False, num_classes=cfg["num_classes"], **cfg["model_args"])
  model.load_state_dict(safetensors.torch.load_file(f"{directory}/model.safetensors"), strict=True)
  results["strict"] = logits(model)
  args = {k: v for k, v in cfg["model_args"].items() if k != "act_layer"}  # timm's default GELU
  model = timm.create_model(cfg["architecture"], pretrained=False, num_classes=cfg["num_classes"], **args)
  model.load_state_dict(safetensors.torch.load_file(f"{directory}/model.safetensors"), strict=True)
  results["timm_default_gelu"] = logits(model)
elif mode == "timm_save":
  import timm
  model = timm.create_model(extra["name"], pretrained=False, **extra["kwargs"])
  randomize(model)
  timm.models.save_for_hf(model, directory, safe_serialization=True)
  dtype = torch.float32
  if extra.get("vit_jax_eps"):
    sys.path.insert(0, extra["repo"])
    from tests.helpers.timm_vit_jax_constants import use_vit_jax_constants
    use_vit_jax_constants(model)
    model.double()
    dtype = torch.float64
  results["timm"] = logits(model, dtype)
elif mode == "hf_export":
  from transformers import ViTForImageClassification
  results["hf"] = logits(ViTForImageClassification.from_pretrained(directory))
elif mode == "hf_save":
  from transformers import ViTConfig, ViTForImageClassification
  model = ViTForImageClassification(ViTConfig(**extra))
  randomize(model)
  model.save_pretrained(directory)
  results["hf"] = logits(model)
np.savez(out, **results)
"""


def _require(*modules):
  for module in modules:
    if importlib.util.find_spec(module) is None:
      pytest.skip(f"{module} is not installed (torch, timm: the [timm] extra; transformers)")


def _child(tmp_path, mode, directory, images, **extra):
  np.save(tmp_path / "images.npy", images)
  args = [mode, directory, tmp_path / "images.npy", tmp_path / "out.npz", json.dumps(extra)]
  subprocess.run([sys.executable, "-c", _CHILD, *map(str, args)], check=True, timeout=900)
  with np.load(tmp_path / "out.npz") as f:
    return {k: f[k] for k in f.files}


def _images(size, seed=1):
  return np.random.default_rng(seed).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)


_random_params = random_weights.random_params


def _ours(directory, images, float64=False):
  """Logits of the model that `convert.read_model` builds from `directory`."""
  model_config, flat, _ = convert.read_model(str(directory))
  params = checkpoint.unflatten_params(flat)
  num_classes = flat["head/kernel"].shape[-1]
  if float64:
    with jax.enable_x64(True):
      model = models.get_model(
        model_config, num_classes, dtype=jnp.float64, param_dtype=jnp.float64
      )
      params = jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), params)
      return model_config, np.asarray(
        model.apply({"params": params}, jnp.asarray(images, jnp.float64), train=False)[0]
      )
  model = models.get_model(model_config, num_classes)
  return model_config, np.asarray(model.apply({"params": params}, images, train=False)[0])


def _report(what, diff):
  print(f"\n{what}: max |delta logit| {diff:.3g}")
  return diff


@pytest.mark.parametrize("gelu_approximate", [True, False], ids=["tanh", "exact"])
def test_export_to_timm_gives_the_same_logits(tmp_path, gelu_approximate):
  _require("torch", "timm")
  model = models.get_model("Ti/16", 11, gelu_approximate=gelu_approximate)
  params = _random_params(model, 224)
  checkpoint.save(params, tmp_path / "ours.npz")
  saved_config = {"model": models.get_model_config("Ti/16").to_dict()}
  saved_config["model"]["gelu_approximate"] = gelu_approximate
  (tmp_path / "config.json").write_text(json.dumps(saved_config))
  convert.convert(str(tmp_path / "ours.npz"), str(tmp_path / "timm"), "timm")
  cfg = json.loads((tmp_path / "timm" / "config.json").read_text())
  assert cfg["model_args"]["act_layer"] == ("gelu_tanh" if gelu_approximate else "gelu")

  images = _images(224)
  ours = np.asarray(model.apply({"params": params}, images, train=False)[0])
  assert np.abs(ours).max() > 0.1  # a meaningful check: the head is not zero
  theirs = _child(tmp_path, "timm_export", tmp_path / "timm", images)
  name = "tanh" if gelu_approximate else "exact"
  for key in ("local_dir", "strict"):
    diff = _report(f"ours ({name} GELU) vs timm {key}", np.abs(ours - theirs[key]).max())
    assert diff < TOLERANCE
  # timm's default (exact) GELU against ours: equal iff ours is exact too.
  diff = _report(
    f"ours ({name} GELU) vs timm default GELU", np.abs(ours - theirs["timm_default_gelu"]).max()
  )
  assert diff < TOLERANCE if not gelu_approximate else 1e-6 < diff < 1e-2


def test_timm_saved_vit_reads_with_the_same_logits(tmp_path):
  _require("torch", "timm")
  kwargs = dict(num_classes=7)
  images = _images(224)
  theirs = _child(
    tmp_path, "timm_save", tmp_path / "timm", images, name="vit_tiny_patch16_224", kwargs=kwargs
  )
  model_config, ours = _ours(tmp_path / "timm", images)
  assert model_config.gelu_approximate is False  # timm's default, from its config.json
  assert np.abs(ours).max() > 0.1
  assert _report("timm-saved Ti/16 vs ours", np.abs(ours - theirs["timm"]).max()) < TOLERANCE


def test_timm_saved_hybrid_reads_with_the_same_logits(tmp_path):
  _require("torch", "timm")
  # A narrow transformer on timm's full R50 stem (3, 4, 9): the stem's names are what counts.
  kwargs = dict(num_classes=7, embed_dim=64, depth=2, num_heads=4, img_size=128)
  images = _images(128)
  theirs = _child(
    tmp_path,
    "timm_save",
    tmp_path / "timm",
    images,
    name="vit_base_r50_s16_224",
    kwargs=kwargs,
    vit_jax_eps=True,
    repo=str(pathlib.Path(__file__).parents[1]),
  )
  model_config, ours = _ours(tmp_path / "timm", images, float64=True)
  assert tuple(model_config.resnet.num_layers) == (3, 4, 9) and model_config.num_heads == 4
  # float64 on both sides (in float32 the 16 ResNet units amplify rounding to ~1e-5); our
  # logits come back as float32, hence ~1e-8 rather than float64 rounding.
  assert (
    _report("timm-saved R50 hybrid vs ours (float64)", np.abs(ours - theirs["timm"]).max()) < 1e-6
  )


def test_hf_vit_for_image_classification_both_ways(tmp_path):
  _require("torch", "transformers")
  # Ours -> HF: from_pretrained on what convert wrote.
  config = models.vit_config("small", 8, 64, 128, 4, 3)
  model = models.get_model(config, 6)
  params = _random_params(model, 64)
  checkpoint.save(params, tmp_path / "ours.npz")
  (tmp_path / "config.json").write_text(json.dumps({"model": config.to_dict()}))
  convert.convert(str(tmp_path / "ours.npz"), str(tmp_path / "hf_out"), "hf")
  images = _images(64)
  ours = np.asarray(model.apply({"params": params}, images, train=False)[0])
  assert np.abs(ours).max() > 0.1
  theirs = _child(tmp_path, "hf_export", tmp_path / "hf_out", images)
  assert (
    _report("ours -> HF ViTForImageClassification", np.abs(ours - theirs["hf"]).max()) < TOLERANCE
  )

  # HF -> ours: a transformers-saved model with its own defaults (exact GELU) ...
  hf = dict(
    hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
    image_size=64, patch_size=8, num_labels=6,
  )  # fmt: skip
  for eps, tolerance in ((1e-6, TOLERANCE), (1e-12, 1e-4)):
    directory = tmp_path / f"hf_saved_{eps}"
    theirs = _child(tmp_path, "hf_save", directory, images, layer_norm_eps=eps, **hf)
    model_config, ours = _ours(directory, images)
    assert model_config.gelu_approximate is False
    # ... at transformers' default layer_norm_eps=1e-12 ours (1e-6) differs slightly.
    diff = _report(f"HF-saved (layer_norm_eps={eps:g}) vs ours", np.abs(ours - theirs["hf"]).max())
    assert diff < tolerance
