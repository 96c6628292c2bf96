"""Load any checkpoint (a weights file or a trainer workdir) with the architecture it goes with.

`load` reads the parameters (weights.npz for files, state.train_state for workdirs), `load_model`
adds the Flax module and the stage config (the workdir's saved `config.json`, else the parameter
shapes), and `representation_model` is the headless model the linear probe, predict and the
analysis run.
"""

import dataclasses
import os
import re
from typing import Any

import ml_collections
import numpy as np
from etils import epath

from vit_jax import models
from vit_jax.checkpoint.state import train_state
from vit_jax.checkpoint.weights import adapt, npz, timm_hf
from vit_jax.models import mpp
from vit_jax.runtime import json_file
from vit_jax.runtime import workdir as workdir_lib


def load(path: str | os.PathLike, num_heads: int | None = None) -> dict[str, Any]:
  """The parameters (nested dict of numpy arrays, the published names) of any checkpoint.

  Args:
    path: `.npz` or `.safetensors` (local or `gs://`), or an Orbax workdir, its `checkpoints/`
      or one step directory (with Polyak averaging, the average: train_state.restore_params).
    num_heads: attention heads of a PyTorch-layout file (see weights.npz.load).
  """
  if npz.is_params_file(path):
    return npz.load(path, num_heads)  # (it refuses pickles with a message saying so)
  directory = epath.Path(path)
  if not directory.exists():
    raise FileNotFoundError(f"{path}: no such file or directory")
  if not directory.is_dir():
    raise ValueError(
      f"{path}: not a checkpoint; expected an .npz or .safetensors file, or an Orbax workdir "
      "or step directory"
    )
  return train_state.restore_params(path)  # (a directory without a committed step: it says so)


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A checkpoint with its architecture: what `load_model` returns."""

  model: Any  # the Flax module (with its head when the checkpoint has one)
  params: dict[str, Any]  # nested dict of numpy arrays
  model_config: ml_collections.ConfigDict
  config: ml_collections.ConfigDict | None  # the stage config saved in the workdir, if any


def load_model(
  path: str | os.PathLike, model_config: ml_collections.ConfigDict | None = None
) -> Loaded:
  """The model, parameters and configs of any checkpoint (see `load`), ready to apply.

  `model_config` overrides the architecture (else `load_backbone`'s). The head's width is the
  checkpoint's (no head: the model returns its representation). Masked patch prediction's
  parameters are dropped (the plain ViT), and so is a sincos2d model's table.
  """
  model_config, params, stage_config = load_backbone(os.fspath(path), model_config)
  params = {k: v for k, v in params.items() if k not in mpp.PARAMS}
  if model_config.get("posemb") == "sincos2d":  # a table written by with_posemb_table: unused
    flat = npz.flatten_params(params)
    adapt.ignore_sincos_table(flat, os.fspath(path))
    params = npz.unflatten_params(flat)
  head = params.get("head")
  if head is not None:
    bias = head["bias"] if "bias" in head else head["conv2d"]["bias"]
  num_classes = int(np.shape(bias)[-1]) if head is not None else None
  model = models.get_model(model_config, num_classes)
  return Loaded(model=model, params=params, model_config=model_config, config=stage_config)


def model_config_from_params(params: dict[str, Any]) -> ml_collections.ConfigDict:
  """Reconstructs a ViT's (or BiT ResNet's) model config from its parameter names and shapes.
  The GELU (`gelu_approximate`) is not in the shapes: it keeps its default."""
  if "root_block" in params:  # a BiT ResNet (vit_jax.models.bit)
    return _bit_config(params)
  p, _, _, hidden = np.shape(params["embedding"]["kernel"])
  encoder = params["Transformer"]
  if "encoderblock" in encoder:  # scanned: leaves have a leading [num_layers] axis
    block, scan = encoder["encoderblock"], True
    num_layers = np.shape(block["LayerNorm_0"]["scale"])[0]
  else:
    num_layers = sum(k.startswith("encoderblock_") for k in encoder)
    block, scan = encoder["encoderblock_0"], False
  attention = block["MultiHeadDotProductAttention_1"]
  num_heads = np.shape(attention["query"]["kernel"])[-2]
  mlp_dim = np.shape(block["MlpBlock_3"]["Dense_0"]["kernel"])[-1]
  config = models.vit_config(
    "inferred", int(p), int(hidden), int(mlp_dim), int(num_heads), int(num_layers)
  )
  config.classifier = "token" if "cls" in params else "gap"
  config.distill_token = "dist_token" in params  # DeiT's (vit_jax.models.vit)
  config.scan = scan
  if "posembed_input" not in encoder:  # no table: a model that computes its own
    config.posemb = "sincos2d"
  if "conv_root" in params:
    stages = sorted(int(k[len("block") :]) for k in params if re.fullmatch(r"block\d+", k))
    units = [
      sum(re.fullmatch(r"unit\d+", u) is not None for u in params[f"block{s}"]) for s in stages
    ]
    width = np.shape(params["conv_root"]["kernel"])[-1] / 64
    config.resnet = ml_collections.ConfigDict(
      dict(num_layers=tuple(units), width_factor=int(width) if width == int(width) else width)
    )
  if "pre_logits" in params:
    config.representation_size = int(np.shape(params["pre_logits"]["kernel"])[-1])
  return config


def _bit_config(params: dict[str, Any]) -> ml_collections.ConfigDict:
  """A BiT ResNet's config: units per block, and the root width [7, 7, 3, W] as `base_width`."""
  blocks = sorted((k for k in params if k.startswith("block")), key=lambda k: int(k[5:]))
  units = tuple(sum(u.startswith("unit") for u in params[b]) for b in blocks)
  width = int(np.shape(params["root_block"]["standardized_conv2d"]["kernel"])[-1])
  return models.bit_config("inferred", units, 1, base_width=width)


def saved_config(path: str) -> ml_collections.ConfigDict | None:
  """The stage config saved (as `config.json`) in the workdir of checkpoint `path`, if any (a
  timm or transformers `config.json` beside a `.safetensors` file is not one).

  Raises:
    json_file.InvalidFile: the file is not a JSON object (one line naming it and what to do).
  """
  if str(path).endswith(".safetensors"):
    return None
  path = epath.Path(path)
  # An .npz's own directory; a workdir, its checkpoints/ or a step directory.
  candidates = (
    [path.parent] if path.name.endswith(".npz") else [path, path.parent, path.parent.parent]
  )
  directory = next((d for d in candidates if (d / workdir_lib.CONFIG_FILE).exists()), None)
  if directory is None:
    return None
  try:
    saved = workdir_lib.read_config(directory)
  except json_file.InvalidFile as e:
    raise json_file.InvalidFile(
      e.path,
      f"{e.why}; it should hold the stage config that gives this checkpoint's architecture: "
      "put the run's config.json back",
    ) from None
  return ml_collections.ConfigDict(saved)


def load_backbone(
  path: str, model_config: ml_collections.ConfigDict | None = None
) -> tuple[ml_collections.ConfigDict, dict[str, Any], ml_collections.ConfigDict | None]:
  """(model config, params, the saved stage config or None) of a checkpoint of any stage (see
  `load`). `model_config` None takes the saved `config.json`'s, else the parameter shapes' (and
  for `.safetensors` the GELU of the timm / transformers `config.json` beside it, else exact).
  """
  params = load(path)
  stage_config = saved_config(path)
  if model_config is None:
    if stage_config is not None and "model" in stage_config:
      model_config = stage_config.model
    else:
      model_config = model_config_from_params(params)
      if str(path).endswith(".safetensors"):
        fields = timm_hf.config_fields(npz.read_foreign_config(path))
        model_config.gelu_approximate = fields.get("gelu_approximate", False)
  return ml_collections.ConfigDict(model_config.to_dict()), params, stage_config


REPRESENTATIONS = ("pre_logits", "pooled", "blocks")  # what the linear probe can read


def representation_model(
  model_config: ml_collections.ConfigDict,
  params: dict[str, Any],
  representation: str,
  image_size: int | tuple[int, int],
) -> tuple[Any, dict[str, Any]]:
  """(a headless Flax module, its parameters) returning `representation` of the checkpoint's
  `params` at `image_size` (position embeddings resized): 'pre_logits' (the Dense+tanh layer
  when the checkpoint has one, else the pooled token), 'pooled' (the class token / average pool
  before any pre-logits; all a BiT ResNet has) or 'blocks' (the model of 'pooled', whose block
  maps `evaluators.representation_fn` pools).
  """
  if representation not in REPRESENTATIONS:
    raise ValueError(f"representation={representation!r}; expected one of {REPRESENTATIONS}")
  params = {k: v for k, v in params.items() if k not in ("head", "head_dist", *mpp.PARAMS)}
  rep_size = None
  if representation == "pre_logits" and "pre_logits" in params:
    rep_size = int(np.shape(params["pre_logits"]["kernel"])[-1])
  else:
    params.pop("pre_logits", None)
  model = models.get_model(
    model_config,
    None,
    **models.known_overrides(model_config, representation_size=rep_size, dropout_rate=0.0),
  )
  params = adapt.fit_posemb(params, model, model_config, image_size)
  return model, params
