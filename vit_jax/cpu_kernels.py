"""C++ kernels for XLA:CPU, FFI custom calls compiled on first use: the attention core and LayerNorm.

`attention` (`cpu_attention.cc`): softmax(q k^T / sqrt(head_dim)) v with its backward pass,
float32. It reads q, k and v from the QKV projection's [batch, tokens, 3, heads, head_dim] output
and returns [batch, tokens, heads, head_dim], so the model does without the heads-major
transposes of the XLA path; one (batch, head) pair per task. `layer_norm` (`cpu_layer_norm.cc`):
the LayerNorm of models_vit (statistics in float32, epsilon 1e-6) and its backward pass, rows in
chunks. Both run on XLA's intra-op thread pool and hand XLA a future instead of blocking one of its
threads. models_vit uses them for `attention_kernel` / `layer_norm_kernel` = 'auto' on a
single-device CPU backend in float32, and for 'cpu'.

The library is built with the system's C++ compiler (`$CXX`, default `g++`, with `_CXXFLAGS`:
`-O3 -march=native`) against the XLA FFI headers that jaxlib ships, into
`$VIT_JAX_KERNEL_CACHE` (default `~/.cache/vit_jax/kernels`) under a name that hashes the sources,
jaxlib's version, the compiler, its flags and the CPU's feature flags, so a change of any of
them builds anew. Concurrent first uses (pytest workers, hosts sharing a home directory) each
build to a temporary file and rename it into place. Without a compiler, or when the build fails,
`unavailable_reason()` says why and 'auto' keeps XLA.
"""

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCES = tuple(os.path.join(_HERE, f) for f in ("cpu_attention.cc", "cpu_layer_norm.cc"))
_HEADERS = (os.path.join(_HERE, "cpu_parallel.h"),)
# XLA target name -> the handler's symbol in the library.
_TARGETS = {
  "vit_jax_attention_forward": "VitAttentionForward",
  "vit_jax_attention_backward": "VitAttentionBackward",
  "vit_jax_layer_norm_forward": "VitLayerNormForward",
  "vit_jax_layer_norm_backward": "VitLayerNormBackward",
}
# -fopenmp-simd: the `#pragma omp simd` loops (the matmul tiles' inner loops) vectorize as written;
# without it the kernel ran several times slower.
_CXXFLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC")
_registered: list[ctypes.CDLL] = []  # the library whose handlers XLA has (kept loaded)


def _cpu_flags() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.startswith("flags")), "")
  except OSError:
    return ""


def _cache_dir() -> str:
  default = os.path.join(os.path.expanduser("~"), ".cache", "vit_jax", "kernels")
  return os.environ.get("VIT_JAX_KERNEL_CACHE", default)


def _build(cxx: str) -> str:
  """Path of the compiled library, building it if this cache has none for this key."""
  import jaxlib

  sources = []
  for name in _SOURCES + _HEADERS:
    with open(name, "rb") as f:
      sources.append(f.read())
  identity = [jaxlib.__version__, cxx, *_CXXFLAGS, platform.machine(), _cpu_flags()]
  key = hashlib.sha256(b"\0".join([*sources, *(x.encode() for x in identity)])).hexdigest()[:16]
  path = os.path.join(_cache_dir(), f"vit_jax_cpu_kernels-{key}.so")
  if os.path.exists(path):
    return path
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
  os.close(fd)
  try:
    command = [cxx, *_CXXFLAGS, "-I", jax.ffi.include_dir(), *_SOURCES, "-o", tmp]
    subprocess.run(command, check=True, capture_output=True, text=True)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return path


@functools.cache
def unavailable_reason() -> str | None:
  """None once the kernel is built and registered with XLA:CPU; otherwise why it is not."""
  cxx = os.environ.get("CXX", "g++")
  try:
    library = ctypes.cdll.LoadLibrary(_build(cxx))
  except FileNotFoundError as e:
    return f"no C++ compiler {cxx!r} ({e.strerror})"
  except subprocess.CalledProcessError as e:
    lines = [line for line in e.stderr.splitlines() if "error" in line] or e.stderr.splitlines()
    return f"{cxx} failed to build the kernels: {lines[0] if lines else e}"
  except OSError as e:
    return f"cannot build or load the kernel: {e}"
  if not _registered:  # once per process
    for name, symbol in _TARGETS.items():
      capsule = jax.ffi.pycapsule(getattr(library, symbol))
      jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    _registered.append(library)
  return None


@functools.cache
def warn_unavailable() -> None:
  """Logs once that 'auto' falls back to XLA on this CPU, and why."""
  logging.warning(
    "vit_jax: the C++ CPU kernels are unavailable (%s); attention and LayerNorm run in XLA",
    unavailable_reason(),
  )


def _forward(qkv: jax.Array) -> tuple[jax.Array, jax.Array]:
  batch, tokens, _, heads, head_dim = qkv.shape
  return jax.ffi.ffi_call(
    "vit_jax_attention_forward",
    (
      jax.ShapeDtypeStruct((batch, tokens, heads, head_dim), jnp.float32),
      jax.ShapeDtypeStruct((batch, heads, tokens, tokens), jnp.float32),
    ),
    vmap_method="sequential",
  )(qkv)


@jax.custom_vjp
def attention(qkv: jax.Array) -> jax.Array:
  """softmax(q k^T / sqrt(d)) v: float32 qkv [batch, tokens, 3, heads, head_dim] (q, k, v along
  axis 2) → [batch, tokens, heads, head_dim]. Call `unavailable_reason()` first."""
  return _forward(qkv)[0]


def _attention_fwd(qkv):
  out, weights = _forward(qkv)
  return out, (qkv, weights)


def _attention_bwd(residuals, d_out):
  qkv, weights = residuals
  d_qkv = jax.ffi.ffi_call(
    "vit_jax_attention_backward",
    jax.ShapeDtypeStruct(qkv.shape, jnp.float32),
    vmap_method="sequential",
  )(d_out.astype(jnp.float32), qkv, weights)
  return (d_qkv,)


attention.defvjp(_attention_fwd, _attention_bwd)


LAYER_NORM_EPSILON = 1e-6  # models_vit's (flax's nn.LayerNorm default)


def _layer_norm_forward(x, scale, bias):
  rows = jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32)
  return jax.ffi.ffi_call(
    "vit_jax_layer_norm_forward",
    (jax.ShapeDtypeStruct(x.shape, jnp.float32), rows, rows),
    vmap_method="sequential",
  )(x, scale, bias, epsilon=np.float32(LAYER_NORM_EPSILON))


@jax.custom_vjp
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
  """(x - mean) / sqrt(var + 1e-6) * scale + bias over the last axis; float32 x [..., d], scale
  and bias [d]. Call `unavailable_reason()` first."""
  return _layer_norm_forward(x, scale, bias)[0]


def _layer_norm_fwd(x, scale, bias):
  y, mean, rstd = _layer_norm_forward(x, scale, bias)
  return y, (x, mean, rstd, scale)


def _layer_norm_bwd(residuals, d_y):
  x, mean, rstd, scale = residuals
  params = jax.ShapeDtypeStruct(scale.shape, jnp.float32)
  d_x, d_scale, d_bias = jax.ffi.ffi_call(
    "vit_jax_layer_norm_backward",
    (jax.ShapeDtypeStruct(x.shape, jnp.float32), params, params),
    vmap_method="sequential",
  )(d_y.astype(jnp.float32), x, mean, rstd, scale)
  return d_x, d_scale, d_bias


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)
