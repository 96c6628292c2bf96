"""Maps timm and Hugging Face ViT state dicts onto the published vit_jax layout, and back.

timm's `VisionTransformer` (with its R50 hybrids) and Hugging Face's `ViTModel` /
`ViTForImageClassification` (and transformers 5's in-memory names, read only): `_ROWS` names
every parameter in each. Only transposes and reshapes, so a round trip is bit-exact. A state
dict does not hold the head count: the caller passes `num_heads`, else the ViT preset of the
same width gives it. `config_for_timm` / `config_for_hf` write the `config.json` from which timm
or transformers build the model (docs/interop.md). Numpy only: no torch, no TensorFlow.
"""

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from vit_jax.checkpoint.weights.layouts import POSEMB

TIMM, HF = "timm", "hf"
_BLOCK = "Transformer/encoderblock_{i}/"
_ATTN = _BLOCK + "MultiHeadDotProductAttention_1/"

# Attention heads of the ViT presets by width (models.py); other widths need `num_heads`.
_HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}

# Kinds of parameter, by how the array changes between the two layouts:
#   same    identical (class token, position embeddings)
#   norm    LayerNorm/GroupNorm: torch `weight` <-> our `scale`
#   linear  torch [out, in] <-> kernel [in, out]
#   conv    torch [out, in, kh, kw] <-> kernel [kh, kw, in, out]
#   heads   torch [heads * head_dim, in] <-> kernel [in, heads, head_dim] (query, key, value)
#   out     torch [out, heads * head_dim] <-> kernel [heads, head_dim, out]
# Rows: (kind, our name, timm's, Hugging Face's, transformers 5's in-memory name), None where a
# layout has no such parameter (timm fuses query, key and value into one `qkv`: `_TIMM_QKV`).
# `{b}` is an encoder block's prefix (ours `Transformer/encoderblock_{i}/`, then each layout's),
# `{a}` our attention module in it, `{s}`/`{u}` a ResNet stage/unit (0-based in torch, 1-based in
# ours), `{r}` a conv of a unit, `{w}` the leaf (weight|bias in torch). transformers 5 writes the
# Hugging Face names (save_pretrained); its in-memory ones are read from a state dict saved
# directly, never written. HF's ViTPooler (Dense + tanh on the class token) is exactly our
# representation layer, as timm < 0.9's `pre_logits` (timm 1.x has none; `to_timm` refuses it).
_ROWS = (
  ("same", "cls", "cls_token", "embeddings.cls_token", None),
  ("same", POSEMB, "pos_embed", "embeddings.position_embeddings", None),
  ("conv", "embedding/{w}", "patch_embed.proj.{w}", "embeddings.patch_embeddings.projection.{w}", None),
  ("norm", "{b}LayerNorm_0/{w}", "{b}norm1.{w}", "{b}layernorm_before.{w}", "{b}layernorm_before.{w}"),
  ("heads", "{a}query/{w}", None, "{b}attention.attention.query.{w}", "{b}attention.q_proj.{w}"),
  ("heads", "{a}key/{w}", None, "{b}attention.attention.key.{w}", "{b}attention.k_proj.{w}"),
  ("heads", "{a}value/{w}", None, "{b}attention.attention.value.{w}", "{b}attention.v_proj.{w}"),
  ("out", "{a}out/{w}", "{b}attn.proj.{w}", "{b}attention.output.dense.{w}", "{b}attention.o_proj.{w}"),
  ("norm", "{b}LayerNorm_2/{w}", "{b}norm2.{w}", "{b}layernorm_after.{w}", "{b}layernorm_after.{w}"),
  ("linear", "{b}MlpBlock_3/Dense_0/{w}", "{b}mlp.fc1.{w}", "{b}intermediate.dense.{w}", "{b}mlp.fc1.{w}"),
  ("linear", "{b}MlpBlock_3/Dense_1/{w}", "{b}mlp.fc2.{w}", "{b}output.dense.{w}", "{b}mlp.fc2.{w}"),
  ("norm", "Transformer/encoder_norm/{w}", "norm.{w}", "layernorm.{w}", None),
  ("linear", "pre_logits/{w}", "pre_logits.fc.{w}", "pooler.dense.{w}", None),
  ("linear", "head/{w}", "head.{w}", "classifier.{w}", None),
  ("conv", "conv_root/{w}", "patch_embed.backbone.stem.conv.{w}", None, None),
  ("norm", "gn_root/{w}", "patch_embed.backbone.stem.norm.{w}", None, None),
  ("conv", "block{s}/unit{u}/conv{r}/{w}", "patch_embed.backbone.stages.{s}.blocks.{u}.conv{r}.{w}", None, None),
  ("norm", "block{s}/unit{u}/gn{r}/{w}", "patch_embed.backbone.stages.{s}.blocks.{u}.norm{r}.{w}", None, None),
  ("conv", "block{s}/unit{u}/conv_proj/{w}", "patch_embed.backbone.stages.{s}.blocks.{u}.downsample.conv.{w}", None, None),
  ("norm", "block{s}/unit{u}/gn_proj/{w}", "patch_embed.backbone.stages.{s}.blocks.{u}.downsample.norm.{w}", None, None),
)  # fmt: skip
_TIMM_QKV = re.compile(r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$")
_HF_PREFIX = "vit."  # ViTForImageClassification's backbone; its `classifier` is not prefixed.
_PATCH = {TIMM: "patch_embed.proj.weight", HF: "embeddings.patch_embeddings.projection.weight"}

# Parameters of architectures this ViT cannot represent: (pattern, what it is).
_UNSUPPORTED = (
  (r"(^|\.)reg_token$|(^|\.)register_tokens$", "register tokens"),
  (r"(^|\.)dist_token$|^head_dist\.", "a distillation token (DeiT)"),
  (r"\.ls[12]\.gamma$|\.gamma_[12]$|\.lambda_[12]$|\.layer_scale", "layer-scale"),
  (r"^norm_pre\.", "a LayerNorm before the encoder blocks (pre_norm, as CLIP)"),
  (r"^fc_norm\.", "its final LayerNorm after pooling (fc_norm) instead of before it"),
  (r"^attn_pool\.|^head\.attn_pool\.", "attention pooling (MAP head)"),
  (r"\.[qk]_norm\.", "QK-norm"),
  (r"\.attn\.norm\.|\.mlp\.norm\.", "a norm inside the attention or MLP (scale_*_norm)"),
  (r"^patch_embed\.norm\.|\.patch_embeddings\.norm\.", "a norm after the patch embedding"),
  (r"\.mlp\.fc1_[gx]\.|\.mlp\.w12\.|\.mlp\.gate", "a gated (SwiGLU) MLP"),
  (r"\.rope\.|\.freqs", "rotary position embeddings"),
  (r"^patch_embed\.backbone\.conv\.|^patch_embed\.backbone\.norm\.", "a stem-only hybrid"),
  (r"patch_embeddings\.backbone\.", "Hugging Face's ViT hybrid (vit-hybrid)"),
)


def layout_of(flat: Mapping[str, Any]) -> str | None:
  """`TIMM`, `HF` or None (not a PyTorch ViT state dict) for flat `{name: array}`."""
  names = set(_strip_module_prefix(flat))
  if _PATCH[TIMM] in names or "patch_embed.proj.bias" in names:
    return TIMM
  if _PATCH[HF] in names or _HF_PREFIX + _PATCH[HF] in names:
    return HF
  return None


def _strip_module_prefix(flat):
  # DistributedDataParallel and some EMA wrappers save `module.`-prefixed names.
  if flat and all(k.startswith("module.") for k in flat):
    return {k[len("module.") :]: v for k, v in flat.items()}
  return dict(flat)


def _regex(template: str, torch: bool) -> re.Pattern:
  pattern = re.escape(template)
  for group in "isur":
    pattern = pattern.replace(re.escape("{" + group + "}"), f"(?P<{group}>\\d+)")
  leaf = "weight|bias" if torch else "kernel|scale|bias"
  pattern = pattern.replace(re.escape("{w}"), f"(?P<w>{leaf})")
  return re.compile(f"^{pattern}$")


def _fill(template: str, groups: Mapping[str, str], kind: str, to_torch: bool) -> str:
  values = {}
  for group, value in groups.items():
    if group == "w":
      if to_torch:
        values["w"] = "bias" if value == "bias" else "weight"
      else:
        values["w"] = "bias" if value == "bias" else ("scale" if kind == "norm" else "kernel")
    elif group in "su":  # ResNet stages and units: 0-based in torch, 1-based in ours
      values[group] = str(int(value) + (-1 if to_torch else 1))
    else:
      values[group] = value
  return template.format(**values)


def _compiled(column: int, block: str, read_only: bool = False) -> list[tuple]:
  """One layout's rows of `_ROWS`: (kind, torch regex, torch template, our regex, our template,
  read_only), `block` the layout's block prefix."""
  rows = []
  for kind, ours, *torch_names in _ROWS:
    if torch_names[column] is not None:
      t = torch_names[column].replace("{b}", block)
      o = ours.replace("{b}", _BLOCK).replace("{a}", _ATTN)
      rows.append((kind, _regex(t, True), t, _regex(o, False), o, read_only))
  return rows


_TIMM = _compiled(0, "blocks.{i}.")
_HF = _compiled(1, "encoder.layer.{i}.") + _compiled(2, "layers.{i}.", read_only=True)


def _to_ours(kind: str, leaf: str, value: np.ndarray, num_heads: int, name: str) -> np.ndarray:
  if kind in ("same", "norm") or (leaf == "bias" and kind != "heads"):
    return value
  if kind != "heads":
    _check_ndim(name, value, {"linear": 2, "out": 2, "conv": 4}[kind])
  if kind == "linear":
    return value.T
  if kind == "conv":
    return value.transpose(2, 3, 1, 0)
  width = value.shape[0 if kind == "heads" else 1]  # heads * head_dim
  if width % num_heads:
    raise ValueError(f"{name!r} {value.shape}: {width} is not divisible by {num_heads} heads")
  if kind == "out":
    return value.T.reshape(num_heads, -1, value.shape[0])  # [heads, head_dim, out]
  if leaf == "bias":
    return value.reshape(num_heads, -1)  # [heads, head_dim]
  return value.T.reshape(value.shape[1], num_heads, -1)  # [in, heads, head_dim]


def _to_torch(kind: str, leaf: str, value: np.ndarray, name: str) -> np.ndarray:
  if kind in ("same", "norm") or (leaf == "bias" and kind != "heads"):
    return np.ascontiguousarray(value)
  if kind == "heads":
    return np.ascontiguousarray(
      value.reshape(-1) if leaf == "bias" else value.reshape(value.shape[0], -1).T
    )
  _check_ndim(name, value, {"linear": 2, "out": 3, "conv": 4}[kind])
  if kind == "conv":
    return np.ascontiguousarray(value.transpose(3, 2, 0, 1))
  # linear: [in, out] -> [out, in]; out: [heads, head_dim, D] -> [D, heads * head_dim]
  return np.ascontiguousarray(value.reshape(-1, value.shape[-1]).T)


def _check_ndim(name, value, ndim):
  if value.ndim != ndim:
    raise ValueError(f"{name!r} has shape {value.shape}; expected {ndim} dimensions")


# ---------------------------------------------------------------------------------------------
# PyTorch layouts -> ours, and back.


def from_torch(
  flat: Mapping[str, np.ndarray], num_heads: int | None = None, source: str = "checkpoint"
) -> dict[str, np.ndarray]:
  """Converts a timm or Hugging Face ViT state dict (torch names -> numpy arrays) to the flat
  published vit_jax layout, encoder blocks unstacked. `num_heads`: None takes the ViT preset's of
  the same width; `source`: how error messages name the checkpoint.

  Raises:
    ValueError: not a timm/HF ViT, an architecture this ViT cannot represent (one line naming
      the parameter, `_UNSUPPORTED`), or missing and unexpected parameters.
  """
  flat = _strip_module_prefix(flat)
  layout = layout_of(flat)
  if layout is None:
    raise ValueError(f"{source}: not a timm or Hugging Face ViT state dict (e.g. {_some(flat)})")
  for name in flat:
    for pattern, what in _UNSUPPORTED:
      if re.search(pattern, name):
        raise ValueError(
          f"{source}: {name!r} means {what}, which vit_jax's ViT (pre-LayerNorm blocks, class "
          "token or average pooling, LayerNorm before the head) cannot represent"
        )
  width = _width(flat, layout)
  if num_heads is None:
    if width not in _HEADS_BY_WIDTH:
      raise ValueError(
        f"{source}: a state dict does not say how many attention heads a {width}-wide ViT has; "
        "pass num_heads (checkpoint.load reads it from the config.json beside the file)"
      )
    num_heads = _HEADS_BY_WIDTH[width]
  if layout == HF:
    prefix = _HF_PREFIX if any(k.startswith(_HF_PREFIX) for k in flat) else ""
    flat = {
      (k[len(prefix) :] if k.startswith(prefix) else k): v
      for k, v in flat.items()
      if not k.endswith("embeddings.mask_token")  # masked image modelling only; unused here
    }
  rows = _TIMM if layout == TIMM else _HF
  out, unknown = {}, []
  for name, value in flat.items():
    value = np.asarray(value)
    m = _TIMM_QKV.match(name) if layout == TIMM else None
    if m:
      _split_qkv(out, int(m.group(1)), m.group(2), value, num_heads, name)
      continue
    for kind, torch_re, _, _, ours, _ in rows:
      m = torch_re.match(name)
      if m:
        ours_name = _fill(ours, m.groupdict(), kind, to_torch=False)
        out[ours_name] = _to_ours(kind, m.groupdict().get("w", ""), value, num_heads, name)
        break
    else:
      unknown.append(name)
  if unknown:
    raise ValueError(
      f"{source}: {len(unknown)} {layout} parameters with no counterpart in vit_jax's ViT: "
      f"{', '.join(sorted(unknown)[:10])}{' ...' if len(unknown) > 10 else ''}"
    )
  _check_complete(out, source, layout)
  return _place_class_slot(out, source)


def _width(flat, layout):
  name = _PATCH[layout]
  for key, value in flat.items():
    if key.endswith(name):
      return int(np.shape(value)[0])
  raise ValueError(f"{name!r} is missing")


def _split_qkv(out, layer, leaf, value, num_heads, name):
  """timm's fused [3 D, D] projection (rows: query, key, value) → our three kernels."""
  if value.shape[0] % 3:
    raise ValueError(f"{name!r} has shape {value.shape}; expected [3 * D, ...] (query, key, value)")
  for part, chunk in zip(("query", "key", "value"), np.split(value, 3), strict=True):
    ours = (_ATTN + f"{part}/{'bias' if leaf == 'bias' else 'kernel'}").format(i=layer)
    out[ours] = _to_ours("heads", leaf, chunk, num_heads, name)


def _check_complete(out, source, layout):
  """Every encoder block and module has all of its parameters (a LayerNorm without bias is an
  RMSNorm, a projection without bias another architecture)."""
  if "embedding/kernel" not in out or POSEMB not in out:
    missing = [k for k in ("embedding/kernel", POSEMB) if k not in out]
    raise ValueError(f"{source}: no {' or '.join(map(repr, missing))} in this {layout} state dict")
  if "Transformer/encoder_norm/scale" not in out:
    raise ValueError(
      f"{source}: no final LayerNorm (timm `norm`, HF `layernorm`): vit_jax's ViT normalises "
      "the tokens before pooling"
    )
  expected_leaves = {  # an encoder block's rows of _ROWS
    ours.format(b="", a="MultiHeadDotProductAttention_1/", w=leaf)
    for kind, ours, *_ in _ROWS
    if ours.startswith(("{b}", "{a}"))
    for leaf in ("scale" if kind == "norm" else "kernel", "bias")
  }
  blocks = {}
  for name in out:
    m = re.match(r"^Transformer/encoderblock_(\d+)/(.+)$", name)
    if m:
      blocks.setdefault(int(m.group(1)), set()).add(m.group(2))
  if sorted(blocks) != list(range(len(blocks))) or not blocks:
    raise ValueError(f"{source}: encoder blocks are not numbered 0..L-1: {sorted(blocks)}")
  for i, leaves in sorted(blocks.items()):
    if leaves != expected_leaves:
      missing = sorted(expected_leaves - leaves)
      raise ValueError(
        f"{source}: encoder block {i} lacks {missing} (a norm or projection without bias, "
        "e.g. RMSNorm or qkv_bias=False, is not this ViT)"
        if missing
        else f"{source}: encoder block {i} has unexpected {sorted(leaves - expected_leaves)}"
      )
  for module in ("embedding", "Transformer/encoder_norm", "head", "pre_logits", "gn_root"):
    leaves = {k.split("/")[-1] for k in out if k.rsplit("/", 1)[0] == module}
    want = {"scale", "bias"} if "norm" in module or module.startswith("gn") else {"kernel", "bias"}
    if leaves and leaves != want:
      raise ValueError(f"{source}: {module!r} has {sorted(leaves)}; expected {sorted(want)}")


def _place_class_slot(out, source):
  """timm's `no_embed_class` models add position embeddings to the patches only: prepending a
  zero class slot is the same network in our layout (as for big_vision files)."""
  posemb = out[POSEMB]
  if posemb.ndim != 3 or posemb.shape[0] != 1:
    raise ValueError(f"{source}: position embedding {posemb.shape}; expected [1, tokens, width]")
  n = posemb.shape[1]
  if "cls" in out and math.isqrt(n) ** 2 == n:
    logging.info("checkpoint: %s position embedding has no class slot; adding a zero one", source)
    out[POSEMB] = np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)
  return out


def _some(flat):
  return ", ".join(sorted(flat)[:5]) or "no parameters"


def to_timm(flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Converts flat vit_jax parameters (blocks unstacked) to a timm `VisionTransformer` state dict.

  Raises:
    ValueError: a parameter timm's ViT has no place for (timm ≥ 0.9 has no `pre_logits`).
  """
  out, qkv = {}, {}  # qkv: (layer, leaf) -> {part: array}
  qkv_re = re.compile("^" + _ATTN.format(i=r"(\d+)") + "(query|key|value)/(kernel|bias)$")
  for name, value in flat.items():
    value = np.asarray(value)
    m = qkv_re.match(name)
    if m:
      qkv.setdefault((int(m.group(1)), m.group(3)), {})[m.group(2)] = value
      continue
    if name.startswith("pre_logits/"):
      raise ValueError(
        "timm's VisionTransformer has no representation layer (pre_logits); drop it "
        "(representation_size=None) or write the Hugging Face layout (its pooler holds it)"
      )
    out.update(_row_to_torch(name, value, _TIMM, "timm"))
  for (layer, leaf), parts in sorted(qkv.items()):
    if set(parts) != {"query", "key", "value"}:
      raise ValueError(f"encoder block {layer} has {sorted(parts)} of query/key/value {leaf}s")
    fused = [_to_torch("heads", leaf, parts[p], f"{p}/{leaf}") for p in ("query", "key", "value")]
    out[f"blocks.{layer}.attn.qkv.{'bias' if leaf == 'bias' else 'weight'}"] = np.concatenate(fused)
  return out


def to_hf(flat: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
  """Converts flat vit_jax parameters to a Hugging Face ViT state dict, and its transformers
  class: 'ViTForImageClassification' (`vit.*` + `classifier`) with a head, else 'ViTModel' (its
  `pre_logits` the pooler). ValueError for what those cannot hold: a ResNet hybrid, 'gap'
  pooling, a head on top of `pre_logits`.
  """
  if any(k.startswith("conv_root/") for k in flat):
    raise ValueError("Hugging Face's ViT has no ResNet stem: write a hybrid as timm or npz")
  if "cls" not in flat:
    raise ValueError("Hugging Face's ViT always has a class token: write a 'gap' model as timm")
  has_head = any(k.startswith("head/") for k in flat)
  if has_head and any(k.startswith("pre_logits/") for k in flat):
    raise ValueError(
      "ViTForImageClassification classifies the class token without the pooler: a model with "
      "both pre_logits and a head has no Hugging Face equivalent (drop one of them)"
    )
  out = {}
  for name, value in flat.items():
    out.update(_row_to_torch(name, np.asarray(value), _HF, "Hugging Face"))
  if has_head:
    out = {(k if k.startswith("classifier.") else _HF_PREFIX + k): v for k, v in out.items()}
  return out, "ViTForImageClassification" if has_head else "ViTModel"


def _row_to_torch(name, value, rows, what):
  for kind, _, torch_t, ours_re, _, read_only in rows:
    if read_only:
      continue
    m = ours_re.match(name)
    if m:
      leaf = m.groupdict().get("w", "")
      return {
        _fill(torch_t, m.groupdict(), kind, to_torch=True): _to_torch(kind, leaf, value, name)
      }
  raise ValueError(f"{name!r} has no counterpart in {what}'s ViT")


# ---------------------------------------------------------------------------------------------
# config.json


def config_fields(config: Mapping[str, Any] | None) -> dict[str, Any]:
  """What a timm or transformers `config.json` says that the weights do not: any of `num_heads`,
  `gelu_approximate` (both default to the exact GELU) and `layer_norm_eps` (HF's default 1e-12;
  ours and timm's are 1e-6). Empty for None."""
  if not config:
    return {}
  fields = {}
  if config.get("model_type") == "vit" or "num_attention_heads" in config:  # transformers
    if "num_attention_heads" in config:
      fields["num_heads"] = int(config["num_attention_heads"])
    act = config.get("hidden_act", "gelu")
    fields["layer_norm_eps"] = float(config.get("layer_norm_eps", 1e-12))
  else:  # timm: architecture + model_args
    args = config.get("model_args") or {}
    if "num_heads" in args:
      fields["num_heads"] = int(args["num_heads"])
    act = args.get("act_layer") or "gelu"
  if act in ("gelu", "gelu_python", "gelu_10"):
    fields["gelu_approximate"] = False
  elif act in ("gelu_tanh", "gelu_pytorch_tanh", "gelu_new", "gelu_python_tanh", "gelu_fast"):
    fields["gelu_approximate"] = True
  else:
    raise ValueError(f"config.json: activation {act!r} is not a GELU; vit_jax's ViT uses GELU")
  return fields


def _image_size(model_config, flat) -> int:
  """The square input resolution: `model_config.image_size`, else from the position grid."""
  size = model_config.get("image_size")
  if size is not None:
    if not isinstance(size, int):
      h, w = size
      if h != w:
        raise ValueError(f"image_size {size}: timm and HF configs here are written for squares")
      size = h
    return int(size)
  n = np.shape(flat[POSEMB])[1] - int("cls" in flat)
  grid = math.isqrt(n)
  if grid * grid != n:
    raise ValueError(f"{n} patches are not a square grid; set the model's image_size")
  resnet = model_config.get("resnet")
  stride = 2 ** (1 + len(resnet["num_layers"])) if resnet else 1
  return grid * int(model_config.patch_size) * stride


def _mlp_ratio(model_config) -> float:
  ratio = model_config.mlp_dim / model_config.hidden_size
  if int(model_config.hidden_size * ratio) != model_config.mlp_dim:
    raise ValueError(f"mlp_dim {model_config.mlp_dim} is not hidden_size × a float timm keeps")
  return ratio


# timm hybrids by ResNet stages; timm builds the backbone from the architecture name alone.
_TIMM_HYBRIDS = {(3, 4, 9): "vit_base_r50_s16_224", (3, 4, 6, 3): "vit_large_r50_s32_224"}


def config_for_timm(
  model_config: Any, flat: Mapping[str, np.ndarray], num_classes: int
) -> dict[str, Any]:
  """The `config.json` from which `timm.create_model('local-dir:DIR', pretrained=True)` builds
  this model (`flat`: its parameters; `num_classes`: 0 for no head) and loads
  `DIR/model.safetensors`."""
  image_size = _image_size(model_config, flat)
  pool = "token" if model_config.classifier == "token" else "avg"
  args = dict(
    img_size=image_size,
    patch_size=int(model_config.patch_size),
    embed_dim=int(model_config.hidden_size),
    depth=int(model_config.num_layers),
    num_heads=int(model_config.num_heads),
    mlp_ratio=_mlp_ratio(model_config),
    class_token=pool == "token",
    global_pool=pool,
    fc_norm=False,  # our 'gap' normalises the tokens, then averages
    act_layer="gelu_tanh" if model_config.get("gelu_approximate", True) else "gelu",
  )
  resnet = model_config.get("resnet")
  if resnet:
    layers = tuple(resnet["num_layers"])
    if layers not in _TIMM_HYBRIDS or resnet["width_factor"] != 1:
      raise ValueError(
        f"timm has no hybrid with ResNet stages {layers} and width {resnet['width_factor']} "
        f"(it has {sorted(_TIMM_HYBRIDS)}, width 1)"
      )
    architecture = _TIMM_HYBRIDS[layers]
  else:
    architecture = "vit_base_patch16_224"  # the model_args replace all of its dimensions
  return dict(
    architecture=architecture,
    num_classes=num_classes,
    num_features=int(model_config.hidden_size),
    global_pool=pool,
    model_args=args,
    pretrained_cfg=dict(
      input_size=[3, image_size, image_size],
      fixed_input_size=True,
      interpolation="bicubic",
      crop_pct=1.0,
      crop_mode="center",
      mean=[0.5, 0.5, 0.5],  # inputs in [-1, 1], as vit_jax's preprocessing
      std=[0.5, 0.5, 0.5],
      num_classes=num_classes,
      first_conv="patch_embed.backbone.stem.conv" if resnet else "patch_embed.proj",
      classifier="head",
      custom_load=False,
    ),
  )


def config_for_hf(
  model_config: Any, flat: Mapping[str, np.ndarray], num_classes: int, architecture: str
) -> dict[str, Any]:
  """The transformers `ViTConfig` (as `config.json`) of this model.

  `layer_norm_eps` is written as 1e-6 (ours; transformers' default 1e-12 would differ slightly)
  and `hidden_act` as 'gelu' (exact) or 'gelu_pytorch_tanh' (our default tanh approximation).
  """
  image_size = _image_size(model_config, flat)
  rep = np.shape(flat["pre_logits/kernel"])[-1] if "pre_logits/kernel" in flat else None
  config = dict(
    architectures=[architecture],
    model_type="vit",
    hidden_size=int(model_config.hidden_size),
    num_hidden_layers=int(model_config.num_layers),
    num_attention_heads=int(model_config.num_heads),
    intermediate_size=int(model_config.mlp_dim),
    hidden_act="gelu_pytorch_tanh" if model_config.get("gelu_approximate", True) else "gelu",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    initializer_range=0.02,
    layer_norm_eps=1e-6,
    image_size=image_size,
    patch_size=int(model_config.patch_size),
    num_channels=3,
    qkv_bias=True,
    encoder_stride=int(model_config.patch_size),
    pooler_act="tanh",
    pooler_output_size=int(rep or model_config.hidden_size),
  )
  if num_classes:
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_classes)}
    config["label2id"] = {f"LABEL_{i}": i for i in range(num_classes)}
  return config
