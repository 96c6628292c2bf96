"""The attention core as a C++ kernel for XLA:CPU (`cpu_attention.cc`), compiled on first use.

softmax(q k^T / sqrt(head_dim)) v with its backward pass, float32, as an XLA FFI custom call. It
reads q, k and v from the QKV projection's [batch, tokens, 3, heads, head_dim] output and returns
[batch, tokens, heads, head_dim], so the model does without the heads-major transposes of the XLA
path; one (batch, head) pair per task on XLA's intra-op thread pool, asynchronously. models_vit
uses it for `attention_kernel='auto'` on a single-device CPU backend in float32, and for 'cpu'.

The library is built with the system's C++ compiler (`$CXX`, default `g++`, with `_CXXFLAGS`:
`-O3 -march=native`) against the XLA FFI headers that jaxlib ships, into
`$VIT_JAX_KERNEL_CACHE` (default `~/.cache/vit_jax/kernels`) under a name that hashes the source,
jaxlib's version, the compiler, its flags and the CPU's feature flags, so a change of any of
them builds anew. Concurrent first uses (pytest workers, hosts sharing a home directory) each
build to a temporary file and rename it into place. Without a compiler, or when the build fails,
`unavailable_reason()` says why and 'auto' keeps XLA's attention.
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

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_attention.cc")
_FORWARD, _BACKWARD = "vit_jax_attention_forward", "vit_jax_attention_backward"
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

  with open(_SOURCE, "rb") as f:
    source = f.read()
  identity = [jaxlib.__version__, cxx, *_CXXFLAGS, platform.machine(), _cpu_flags()]
  key = hashlib.sha256(b"\0".join([source, *(x.encode() for x in identity)])).hexdigest()[:16]
  path = os.path.join(_cache_dir(), f"cpu_attention-{key}.so")
  if os.path.exists(path):
    return path
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
  os.close(fd)
  try:
    command = [cxx, *_CXXFLAGS, "-I", jax.ffi.include_dir(), _SOURCE, "-o", tmp]
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
    return f"{cxx} failed to build {_SOURCE}: {lines[0] if lines else e}"
  except OSError as e:
    return f"cannot build or load the kernel: {e}"
  if not _registered:  # once per process
    for name, symbol in ((_FORWARD, "VitAttentionForward"), (_BACKWARD, "VitAttentionBackward")):
      capsule = jax.ffi.pycapsule(getattr(library, symbol))
      jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    _registered.append(library)
  return None


@functools.cache
def warn_unavailable() -> None:
  """Logs once that 'auto' falls back to XLA's attention on this CPU, and why."""
  logging.warning(
    "vit_jax: the C++ attention kernel is unavailable (%s); the attention core runs in XLA",
    unavailable_reason(),
  )


def _forward(qkv: jax.Array) -> tuple[jax.Array, jax.Array]:
  batch, tokens, _, heads, head_dim = qkv.shape
  return jax.ffi.ffi_call(
    _FORWARD,
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
    _BACKWARD, jax.ShapeDtypeStruct(qkv.shape, jnp.float32), vmap_method="sequential"
  )(d_out.astype(jnp.float32), qkv, weights)
  return (d_qkv,)


attention.defvjp(_attention_fwd, _attention_bwd)
