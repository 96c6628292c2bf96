"""Model FLOPs: what the MFU, the planner and the scale study count as a model's compute.

`model_flops_per_example` counts the matmuls and convolutions of one image's forward pass in
the model's jaxpr (2 FLOPs per multiply-add), times 3 for training (forward + the two backward
matmuls per forward one; remat's recomputation is not model FLOPs). The count is taken with the
attention core and the LayerNorms on their XLA path: XLA's cost analysis does not see inside the
C++ kernels' custom calls (vit_jax.kernels), so counting the compiled model would drop the
attention core (4 T^2 D per layer) whenever they run. Elementwise work (softmax, GELU,
LayerNorm) is not counted, as in the paper's and PaLM's MFU definitions.

For a plain ViT this equals `vit_forward_flops`, the closed form (T tokens, N = T - 1 patches
with a class token, P patch size, D width, M MLP width, L layers, R pre-logits, C classes):

  2 N P^2 3 D                          patch embedding
  + L (2 T D 3D + 4 T^2 D + 2 T D^2 + 4 T D M)   Q/K/V, q k^T and weights @ v, out, MLP
  + 2 D R + 2 R C                      pre-logits (if any) and head (R = D without pre-logits)

ViT-B/16 at 224px with 1000 classes: 35.13 GFLOPs forward (17.56 G multiply-adds, the figure
usually quoted as "17.6 GFLOPs").

This file must not import TensorFlow.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jax_core

# Passes of the matmuls in one training step per forward pass: forward, and the gradients with
# respect to the inputs and to the weights.
TRAIN_PASSES = 3


def _dot_flops(eqn) -> float:
  lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
  (lhs_contract, rhs_contract), (lhs_batch, _) = eqn.params["dimension_numbers"]
  contract = math.prod(lhs[d] for d in lhs_contract)
  batch = math.prod(lhs[d] for d in lhs_batch)
  lhs_free = math.prod(s for d, s in enumerate(lhs) if d not in (*lhs_contract, *lhs_batch))
  rhs_batch = eqn.params["dimension_numbers"][1][1]
  rhs_free = math.prod(s for d, s in enumerate(rhs) if d not in (*rhs_contract, *rhs_batch))
  return 2.0 * batch * contract * lhs_free * rhs_free


def _conv_flops(eqn) -> float:
  rhs = eqn.invars[1].aval.shape
  out = eqn.outvars[0].aval.shape
  dims = eqn.params["dimension_numbers"]
  kernel_spatial = math.prod(rhs[d] for d in dims.rhs_spec[2:])
  in_per_group = rhs[dims.rhs_spec[1]]  # the kernel's input features: inputs / groups
  # Every output element is a dot product over the kernel's window and its group's inputs.
  return 2.0 * math.prod(out) * kernel_spatial * in_per_group


def _sub_jaxprs(eqn):
  for value in eqn.params.values():
    for item in value if isinstance(value, tuple | list) else (value,):
      if isinstance(item, jax_core.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jax_core.Jaxpr):
        yield item


def jaxpr_matmul_flops(jaxpr) -> float:
  """2 x the multiply-adds of every dot_general and convolution in `jaxpr` (and its calls).

  Calls are followed into (jit, custom-VJP and custom-JVP functions: their forward only); a
  scan's body counts `length` times.
  """
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      total += _dot_flops(eqn)
    elif name == "conv_general_dilated":
      total += _conv_flops(eqn)
    else:
      repeat = eqn.params.get("length", 1) if name == "scan" else 1
      total += repeat * sum(jaxpr_matmul_flops(j) for j in _sub_jaxprs(eqn))
  return total


def _counting_model(model: Any) -> Any:
  """`model` with its layers unrolled, no remat, and its kernels on the XLA path."""
  fields = {}
  for name, value in (("scan", False), ("remat", False)):
    if hasattr(model, name):
      fields[name] = value
  for name in ("attention_kernel", "layer_norm_kernel"):
    if hasattr(model, name):
      fields[name] = "xla"
  return model.clone(**fields) if fields else model


def forward_flops(model: Any, image_shape: tuple[int, int]) -> float:
  """Matmul and convolution FLOPs of one image through `model`'s forward pass (eval mode)."""
  model = _counting_model(model)
  image = jax.ShapeDtypeStruct((1, *image_shape, 3), jnp.float32)
  params = jax.eval_shape(
    lambda x: model.init({"params": jax.random.key(0)}, x, train=False)["params"], image
  )
  jaxpr = jax.make_jaxpr(lambda p, x: model.apply({"params": p}, x, train=False)[0])(params, image)
  return jaxpr_matmul_flops(jaxpr.jaxpr)


def model_flops_per_example(model: Any, image_shape: tuple[int, int]) -> float:
  """Training FLOPs of one example without recomputation: 3 x `forward_flops`."""
  return TRAIN_PASSES * forward_flops(model, image_shape)


def vit_forward_flops(model_config: Any, image_size: int, num_classes: int | None) -> float:
  """The closed form of the module docstring for a plain ViT (no ResNet stem) at a square size."""
  if model_config.get("resnet") is not None:
    raise ValueError("vit_forward_flops counts plain ViTs; use forward_flops for hybrids")
  p, d = model_config.patch_size, model_config.hidden_size
  m, layers = model_config.mlp_dim, model_config.num_layers
  n = (image_size // p) ** 2
  t = n + (1 if model_config.get("classifier", "token") == "token" else 0)
  per_layer = 2 * t * d * 3 * d + 4 * t * t * d + 2 * t * d * d + 4 * t * d * m
  flops = 2 * n * p * p * 3 * d + layers * per_layer
  rep = model_config.get("representation_size")
  if rep:
    flops += 2 * d * rep
  if num_classes:
    flops += 2 * (rep or d) * num_classes
  return float(flops)


def compiled_flops(compiled: Any) -> float | None:
  """FLOPs per device of one call of an AOT-compiled function, from XLA's cost analysis
  (None where the backend has none). Custom calls (the C++ kernels) count zero here."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001 - not every backend implements it
    return None
  if isinstance(cost, list | tuple):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return float(cost["flops"])
