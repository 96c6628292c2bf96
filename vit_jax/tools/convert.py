r"""Converts ViT weights between vit_jax `.npz`, Orbax workdirs, timm and Hugging Face.

  python -m vit_jax.tools.convert --in=ViT-B_16.npz --out=/tmp/vit_b16_timm --to=timm
  python -m vit_jax.tools.convert --in=/tmp/vit_ft --out=/tmp/demo_hf --to=hf
  python -m vit_jax.tools.convert --in=/tmp/hf_vit --out=/tmp/hf_vit_npz   # --to=npz by default

`--in` is a vit_jax or big_vision `.npz`, a timm or Hugging Face `.safetensors` (or a directory
holding `model.safetensors` / `model.npz`), or a trainer workdir / step directory (its latest
Orbax checkpoint). `--out` receives `model.safetensors` or `model.npz` and a `config.json` that
timm, transformers, or vit_jax's `predict`, linear probe and `model_init` read (docs/interop.md).

The architecture comes from `--model` (a preset), else the `config.json` of the input, else the
parameter shapes. The GELU travels in the config (tanh approximation: timm's `gelu_tanh`,
transformers' `gelu_pytorch_tanh`; their exact GELU: `gelu_approximate=False`), so the converted
model computes what the original did. Fixed 2-D sin-cos position embeddings are written as the
table of the published layout, at the saved config's resolution. No torch: numpy and
safetensors' numpy API only.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import json
import os
from typing import Any

import ml_collections
from absl import logging

from vit_jax import checkpoint, models
from vit_jax.checkpoint.state import train_state
from vit_jax.checkpoint.weights import layouts, timm_hf
from vit_jax.runtime import cli

FORMATS = ("timm", "hf", "npz")
WEIGHTS = {"timm": "model.safetensors", "hf": "model.safetensors", "npz": "model.npz"}


def resolve_input(path: str) -> str:
  """The weights file inside a timm / Hugging Face / converted model directory, else `path`."""
  if os.path.isdir(path):
    # transformers' pickle, last: named so that `checkpoint.load` refuses it by name.
    for name in ("model.safetensors", "model.npz", "pytorch_model.bin"):
      if os.path.isfile(os.path.join(path, name)):
        return os.path.join(path, name)
    if os.path.isfile(os.path.join(path, "model.safetensors.index.json")):
      raise ValueError(f"{path}: sharded safetensors are not supported; a ViT fits in one file")
  return path


def read_model(
  path: str, model: str | None = None, num_heads: int | None = None
) -> tuple[ml_collections.ConfigDict, dict[str, Any], str]:
  """Reads any supported input.

  Returns:
    (model config, flat parameters in the published layout with blocks unstacked, the input's
    layout: 'timm', 'hf', 'npz' or 'orbax').
  """
  path = resolve_input(path)
  params = checkpoint.load(path, num_heads=num_heads)  # refuses pickles (.pth, .bin, ...)
  layout = checkpoint.file_layout(path) if checkpoint.is_params_file(path) else "orbax"
  if model:
    model_config = models.get_model_config(model)
  else:
    saved = checkpoint.saved_config(path)
    if saved is not None and "model" in saved:
      model_config = ml_collections.ConfigDict(saved.model.to_dict())
    else:
      model_config = checkpoint.model_config_from_params(params)
      if layout in (timm_hf.TIMM, timm_hf.HF):
        fields = timm_hf.config_fields(checkpoint.read_foreign_config(path))
        model_config.gelu_approximate = fields.get("gelu_approximate", False)
  if model_config.get("posemb", "learn") == "sincos2d":
    # Fixed sin-cos embeddings have no parameter: written as the table they are at the
    # resolution the model was trained at, the published layout every reader expects.
    saved = checkpoint.saved_config(path)
    size = saved.dataset.get("image_size") if saved is not None and "dataset" in saved else None
    if not size:
      raise ValueError(
        f"--in={path}: posemb='sincos2d' weights with no saved image size to write their "
        "position embedding table for; convert the trainer workdir they came from"
      )
    params = checkpoint.with_posemb_table(
      params, model_config, tuple(size) if isinstance(size, (list, tuple)) else int(size)
    )
  flat = layouts.unstack_flat(checkpoint.flatten_params(params))
  model_config.scan = False  # the written blocks are unstacked
  return model_config, flat, layout


def convert(
  in_path: str,
  out_dir: str,
  to: str | None = None,
  model: str | None = None,
  num_heads: int | None = None,
) -> dict[str, str]:
  """Writes the weights of `in_path` to `out_dir` in layout `to`, with a `config.json`.

  Args:
    in_path: see the module docstring.
    out_dir: output directory; must not be a trainer workdir.
    to: 'timm', 'hf' or 'npz'; None: 'npz' for timm / HF inputs, else 'timm'.
    model: a vit_jax.models preset for the architecture (else inferred).
    num_heads: attention heads of a `.safetensors` without `config.json`.

  Returns:
    {'weights': path, 'config': path}.
  """
  model_config, flat, layout = read_model(in_path, model, num_heads)
  to = to or ("npz" if layout in (timm_hf.TIMM, timm_hf.HF) else "timm")
  if to not in FORMATS:
    raise ValueError(f"--to={to!r}; expected one of {FORMATS}")
  if os.path.isdir(os.path.join(out_dir, train_state.CHECKPOINT_DIR)):
    raise ValueError(f"--out={out_dir} is a trainer workdir; write the conversion elsewhere")
  num_classes = int(flat["head/kernel"].shape[-1]) if "head/kernel" in flat else 0
  weights = os.path.join(out_dir, WEIGHTS[to])
  if to == "timm":
    state_dict = timm_hf.to_timm(flat)
    config = timm_hf.config_for_timm(model_config, flat, num_classes)
  elif to == "hf":
    state_dict, architecture = timm_hf.to_hf(flat)
    config = timm_hf.config_for_hf(model_config, flat, num_classes, architecture)
  else:
    config = {"model": model_config.to_dict()}
  os.makedirs(out_dir, exist_ok=True)
  if to == "npz":
    checkpoint.save(checkpoint.unflatten_params(flat), weights)
  else:
    checkpoint.save_safetensors(state_dict, weights)
  config_path = os.path.join(out_dir, checkpoint.WEIGHTS_CONFIG_FILE)
  with open(config_path, "w") as f:
    json.dump(config, f, indent=2)
  logging.info(
    "convert: %s (%s) -> %s (%s), %d parameters, gelu_approximate=%s",
    in_path,
    layout,
    weights,
    to,
    len(flat),
    model_config.get("gelu_approximate", True),
  )
  return {"weights": weights, "config": config_path}


define_flags = cli.define_flags(
  input=cli.Flag(
    str, "Input: .npz, .safetensors, a model directory or a workdir.", required=True, name="in"
  ),
  out=cli.Flag(str, "Output directory (created).", required=True),
  to=cli.Flag(None, "Output layout; default npz for timm/HF inputs, else timm.", choices=FORMATS),
  model=cli.Flag(str, "A vit_jax.models preset (e.g. B/16) for the architecture."),
  num_heads=cli.Flag(int, "Attention heads of a .safetensors without config.json."),
)


def main(argv, f):
  cli.no_arguments(argv)
  written = convert(f.input.value, f.out.value, f.to.value, f.model.value, f.num_heads.value)
  print(f"wrote {written['weights']} and {written['config']}")


if __name__ == "__main__":
  cli.run(main, "convert", define_flags, errors=(ValueError, FileNotFoundError))
