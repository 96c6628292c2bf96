"""The linear-probe stage: `run(config, workdir)` (dispatched by `vit_jax.main`).

Freezes a backbone from an earlier stage (an Orbax workdir or step directory, or an `.npz`),
extracts its representation (the pre-logits when the checkpoint has them, else the pooled token)
of every example of a training and a test split with one jitted function, and fits two linear
classifiers on the training features (vit_jax.evaluators.linear): the closed-form ridge
regression to {-1, +1}^K targets and L-BFGS softmax regression, each regulariser chosen on a
held-out slice of the training split. Writes `linear_probe.json` and TensorBoard scalars to the
workdir and returns the metrics.

The architecture comes from, in order: `config.model` when the config has one, the
`config.json` the trainer wrote next to the checkpoint, or the parameter shapes (plain ViTs and
BiT ResNets).
"""

import json
import os
import re
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from etils import epath

from vit_jax import checkpoint, checkpoint_torch, evaluators, models, sharding, train_checkpoint
from vit_jax import workdir as workdir_lib

RESULTS_FILE = "linear_probe.json"
CONFIG_FILE = workdir_lib.CONFIG_FILE


# ---------------------------------------------------------------------------------------------
# The backbone of a previous stage.


def model_config_from_params(params: dict[str, Any]) -> ml_collections.ConfigDict:
  """Reconstructs a ViT's model config from its parameter shapes.

  Reads patch size and width from `embedding/kernel` [p, p, C, D], depth from the encoder
  blocks (stacked or not), heads from `query/kernel` [D, heads, D/heads], the MLP width, the
  classifier ('token' iff there is a `cls` parameter), `representation_size` from
  `pre_logits`, and for hybrids the ResNet's units per stage (`block{s}/unit{u}`) and width
  factor (`conv_root/kernel` [7, 7, 3, 64 * width]). The GELU (`gelu_approximate`) is not in
  the shapes: it keeps its default.
  """
  if "root_block" in params:  # a BiT ResNet (models_bit)
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
  config.scan = scan
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


def _checkpoint_dir(path: str) -> epath.Path | None:
  """The workdir that holds a checkpoint path (None for a file such as an `.npz`)."""
  path = epath.Path(path)
  for candidate in (path, path.parent, path.parent.parent):
    if (candidate / CONFIG_FILE).exists():
      return candidate
  return None


def saved_config(path: str) -> ml_collections.ConfigDict | None:
  """The stage config saved (as `config.json`) in the workdir of checkpoint `path`, if any.

  A timm or transformers `config.json` beside a `.safetensors` file is not a stage config (see
  `load_backbone`).
  """
  if str(path).endswith(".safetensors"):
    return None
  if str(path).endswith(".npz"):
    directory = epath.Path(path).parent
    if not (directory / CONFIG_FILE).exists():
      return None
  else:
    directory = _checkpoint_dir(path)
    if directory is None:
      return None
  return ml_collections.ConfigDict(json.loads((directory / CONFIG_FILE).read_text()))


def load_backbone(
  path: str, model_config: ml_collections.ConfigDict | None = None
) -> tuple[ml_collections.ConfigDict, dict[str, Any], ml_collections.ConfigDict | None]:
  """Reads a checkpoint of any stage and the architecture that goes with it.

  Args:
    path: `.npz`, timm / Hugging Face `.safetensors`, an Orbax workdir, its `checkpoints/` or
      one step directory.
    model_config: the architecture; None takes it from the saved `config.json`, else from the
      parameter shapes (and, for `.safetensors`, the GELU of the timm / transformers
      `config.json` beside it: exact unless it says otherwise, as both libraries default).

  Returns:
    (model config, params as a nested dict of numpy arrays, the saved stage config or None).
  """
  params = train_checkpoint.restore_params(path)
  stage_config = saved_config(path)
  if model_config is None:
    if stage_config is not None and "model" in stage_config:
      model_config = stage_config.model
    else:
      model_config = model_config_from_params(params)
      if str(path).endswith(".safetensors"):
        fields = checkpoint_torch.config_fields(checkpoint.read_foreign_config(path))
        model_config.gelu_approximate = fields.get("gelu_approximate", False)
  return ml_collections.ConfigDict(model_config.to_dict()), params, stage_config


def representation_model(
  model_config: ml_collections.ConfigDict,
  params: dict[str, Any],
  representation: str,
  image_size: int | tuple[int, int],
) -> tuple[Any, dict[str, Any]]:
  """A headless model returning the chosen representation, and the parameters it uses.

  Args:
    model_config: the backbone's architecture.
    params: the checkpoint's parameters (a head, if any, is dropped).
    representation: 'pre_logits' (the Dense+tanh layer when the checkpoint has one, else the
      pooled token) or 'pooled' (the class token / average pool before any pre-logits); a BiT
      ResNet has only its pooled features.
    image_size: the input resolution; position embeddings are resized to its patch grid.

  Returns:
    (the Flax module, its parameters as a nested dict of numpy arrays).
  """
  if representation not in ("pre_logits", "pooled"):
    raise ValueError(f"representation={representation!r}; expected 'pre_logits' or 'pooled'")
  params = {k: v for k, v in params.items() if k not in ("head", "mpp_head", "mask_embedding")}
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
  params = checkpoint.fit_posemb(params, model, model_config, image_size)
  return model, params


# ---------------------------------------------------------------------------------------------
# The stage.


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Linear-probes `config.model_init` on `config.dataset`; returns (and writes) the metrics.

  Config fields: see configs/linear_probe.py.
  """
  # Setup. (clu's writers import TensorFlow: not at module level, so predict stays TF-free.)
  from vit_jax import logging_util

  start = time.perf_counter()
  if not config.model_init:
    raise ValueError("config.model_init: the checkpoint to probe (workdir, step dir or .npz)")
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  mesh = sharding.make_mesh(config.mesh)
  writer = logging_util.create_writer(workdir)

  # Backbone.
  explicit = config.model if "model" in config and config.model else None
  model_config, params, saved = load_backbone(config.model_init, explicit)
  dataset = config.dataset.to_dict()
  if config.get("image_size_from_checkpoint") and saved is not None and "dataset" in saved:
    dataset["image_size"] = saved.dataset.image_size  # the resolution the backbone was trained at
  model, params = representation_model(
    model_config, params, config.representation, dataset["image_size"]
  )
  params = jax.device_put(params, sharding.tree_shardings(params, mesh))
  if jax.process_index() == 0:  # once the backbone is read: a failed start leaves no config
    workdir_lib.save_config(workdir, config)
  logging.info(
    "linear probe: backbone %s from %s at %s px",
    model_config.get("name"),
    config.model_init,
    dataset["image_size"],
  )

  # Features and probes.
  make_data = evaluators.input_pipeline_data(mesh, sharding.BATCH_AXES)
  probe = config.probe
  evaluator = evaluators.LinearProbeEvaluator(
    evaluators.representation_fn(model),
    make_data(dataset, dataset["train_split"], config.batch_size),
    make_data(dataset, dataset["eval_split"], config.batch_size),
    evaluators.num_classes_of(dataset),
    probes=tuple(probe.probes),
    ridge_l2_regs=tuple(probe.ridge_l2_regs),
    logreg_l2_regs=tuple(probe.logreg_l2_regs),
    val_fraction=probe.val_fraction,
    seed=config.seed,
    max_examples=probe.max_examples,
    name="linear_probe",
  )
  t0 = time.perf_counter()
  features = evaluator.features(params)
  t1 = time.perf_counter()
  logging.info(
    "linear probe: features train %s test %s in %.1fs",
    features[0].shape,
    features[2].shape,
    t1 - t0,
  )
  results = evaluator.score(*features)
  results["linear_probe/feature_seconds"] = t1 - t0
  results["linear_probe/fit_seconds"] = time.perf_counter() - t1
  results["linear_probe/total_seconds"] = time.perf_counter() - start
  results["linear_probe/representation_size"] = float(features[0].shape[1])
  for key, value in sorted(results.items()):
    logging.info("%s = %.4f", key, value)

  # Results.
  writer.write_scalars(0, results)
  writer.flush()
  if jax.process_index() == 0:
    out = dict(results, model_init=str(config.model_init), dataset=dataset.get("name"))
    workdir_lib.write_json(epath.Path(workdir) / RESULTS_FILE, out)
  return results


def read_results(workdir: str | os.PathLike) -> dict[str, Any]:
  """The metrics a finished `run` wrote to `workdir`."""
  return json.loads((epath.Path(workdir) / RESULTS_FILE).read_text())
