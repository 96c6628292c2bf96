"""C++ kernels for XLA:CPU, FFI custom calls compiled on first use: the attention core and LayerNorm.

`attention` (`attention.cc`): softmax(q k^T / sqrt(head_dim)) v and its backward pass, float32,
reading q, k and v from the QKV projection's [batch, tokens, 3, heads, head_dim] output and
returning [batch, tokens, heads, head_dim]. `layer_norm` (`layer_norm.cc`): the LayerNorm of
vit_jax.models.ops and its backward pass. vit_jax.models.ops uses them for `attention_kernel` /
`layer_norm_kernel` = 'auto' on a single-device CPU backend in float32, and for 'cpu'. How they
work and what they gain: docs/benchmarks.md.

The library is built with `$CXX` (default `g++`, `_CXXFLAGS`, `-march=native`) against jaxlib's
XLA FFI headers into `$VIT_JAX_KERNEL_CACHE` (default `~/.cache/vit_jax/kernels`), under a name
hashing everything the binary depends on (`library_path`). Concurrent first uses build one at a
time under a lock in the cache, each to a temporary file loaded in a child process before it is
renamed into place. Without a compiler, or when the build fails, `unavailable_reason()` says why
and 'auto' keeps XLA. `for_target(march)` builds the same sources for another `-march` (e.g.
'x86-64-v2', the kernels' scalar paths) under target names of their own, so one process can
check the code paths of other CPU classes.
"""

import ctypes
import fcntl
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import types

import jax
import jax.numpy as jnp
import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCES = tuple(os.path.join(_HERE, f) for f in ("attention.cc", "layer_norm.cc"))
_HEADERS = (os.path.join(_HERE, "parallel.h"),)
# XLA target name (before the target's suffix) -> the handler's symbol in the library.
_HANDLERS = {
  "vit_jax_attention_forward": "VitAttentionForward",
  "vit_jax_attention_backward": "VitAttentionBackward",
  "vit_jax_layer_norm_forward": "VitLayerNormForward",
  "vit_jax_layer_norm_backward": "VitLayerNormBackward",
}
# -fopenmp-simd: the `#pragma omp simd` loops (the matmul tiles' inner loops) vectorize as written;
# without it the kernel ran several times slower.
_CXXFLAGS = ("-O3", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC")
NATIVE = "native"  # the -march of the kernels the models use: this machine's instruction set
_libraries: dict[str, ctypes.CDLL] = {}  # march -> the library whose handlers XLA has (kept loaded)


def _cpu_flags() -> str:
  """The CPU's feature flags as /proc/cpuinfo lists them: x86's `flags`, ARM's `Features`."""
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.split(":")[0].strip() in ("flags", "Features")), "")
  except OSError:
    return ""


def _cache_dir() -> str:
  default = os.path.join(os.path.expanduser("~"), ".cache", "vit_jax", "kernels")
  return os.environ.get("VIT_JAX_KERNEL_CACHE", default)


def _compiler_identity(cxx: str, march: str) -> list[str]:
  """What decides the binary besides the sources: the compiler (its resolved path and version)
  and what `-march` means to it on this CPU (gcc's enabled target options). FileNotFoundError
  without the compiler. Asking takes two processes (~0.2 s), so the answer is cached under the
  compiler binary's path, size and modification time, -march and the CPU's flags."""
  path = os.path.realpath(shutil.which(cxx) or cxx)
  stat = os.stat(path)  # FileNotFoundError: no such compiler
  probe = hashlib.sha256(
    "\0".join([path, str(stat.st_size), str(stat.st_mtime_ns), march, _cpu_flags()]).encode()
  ).hexdigest()[:16]
  memo = os.path.join(_cache_dir(), f"compiler-{probe}.json")
  try:
    with open(memo) as f:
      return json.load(f)
  except (OSError, ValueError):
    pass
  identity = _ask_compiler(cxx, path, march)
  try:
    os.makedirs(_cache_dir(), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".json", dir=_cache_dir())
    with os.fdopen(fd, "w") as f:
      json.dump(identity, f)
    os.replace(tmp, memo)
  except OSError:
    pass  # an unwritable cache: ask again next time
  return identity


def _ask_compiler(cxx: str, path: str, march: str) -> list[str]:
  version = subprocess.run([cxx, "--version"], capture_output=True, text=True)
  target = subprocess.run(
    [cxx, f"-march={march}", "-Q", "--help=target"], capture_output=True, text=True
  )  # clang has no -Q --help=target: its version and the CPU's flags stand in
  options = target.stdout if target.returncode == 0 else ""
  return [path, version.stdout.splitlines()[0] if version.stdout else "", options]


def library_path(cxx: str, march: str) -> str:
  """Where the cache keeps the library that `cxx -march={march}` builds from these sources for
  this CPU: a name hashing everything the binary depends on, so a change of any builds anew."""
  import jaxlib

  sources = []
  for name in _SOURCES + _HEADERS:
    with open(name, "rb") as f:
      sources.append(f.read())
  identity = [jaxlib.__version__, *_compiler_identity(cxx, march), *_CXXFLAGS, f"-march={march}"]
  identity += [platform.machine(), _cpu_flags()]
  key = hashlib.sha256(b"\0".join([*sources, *(x.encode() for x in identity)])).hexdigest()[:16]
  return os.path.join(_cache_dir(), f"vit_jax_cpu_kernels-{key}.so")


def _build(cxx: str, march: str) -> str:
  """Path of the library compiled with `-march={march}`, building it if the cache has none.

  One build at a time per cache (an exclusive lock on a file there: pytest workers, hosts that
  share a home directory); a library is put in place only after a child process has loaded it
  and found its handlers."""
  path = library_path(cxx, march)
  if os.path.exists(path):
    return path
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(os.path.join(os.path.dirname(path), ".build.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(path):  # built by another process while this one waited
      return path
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
      flags = (*_CXXFLAGS, f"-march={march}")
      command = [cxx, *flags, "-I", jax.ffi.include_dir(), *_SOURCES, "-o", tmp]
      subprocess.run(command, check=True, capture_output=True, text=True)
      _load_test(tmp)
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
  return path


_LOAD_TEST = (
  "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); [getattr(lib, s) for s in sys.argv[2:]]"
)


def _load_test(path: str) -> None:
  """Loads the library in a child process (a broken one cannot take this process down) and
  looks up its handlers; OSError naming the failure."""
  child = subprocess.run(
    [sys.executable, "-c", _LOAD_TEST, path, *_HANDLERS.values()],
    capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  if child.returncode != 0:
    lines = child.stderr.strip().splitlines()
    raise OSError(
      f"the built library fails its load test: {lines[-1] if lines else child.returncode}"
    )


def _suffix(march: str) -> str:
  """The XLA target names' suffix of a -march: '' for native, e.g. '_x86_64_v2' otherwise."""
  return "" if march == NATIVE else "_" + "".join(c if c.isalnum() else "_" for c in march)


@functools.cache
def unavailable_reason(march: str = NATIVE) -> str | None:
  """None once the kernels built for `march` are registered with XLA:CPU; otherwise why not."""
  cxx = os.environ.get("CXX", "g++")
  try:
    library = ctypes.cdll.LoadLibrary(_build(cxx, march))
  except FileNotFoundError as e:
    return f"no C++ compiler {cxx!r} ({e.strerror})"
  except subprocess.CalledProcessError as e:
    lines = [line for line in e.stderr.splitlines() if "error" in line] or e.stderr.splitlines()
    return f"{cxx} failed to build the kernels: {lines[0] if lines else e}"
  except OSError as e:
    return f"cannot build or load the kernel: {e}"
  if march not in _libraries:  # once per process and target
    for name, symbol in _HANDLERS.items():
      capsule = jax.ffi.pycapsule(getattr(library, symbol))
      jax.ffi.register_ffi_target(name + _suffix(march), capsule, platform="cpu")
    _libraries[march] = library
  return None


@functools.cache
def warn_unavailable() -> None:
  """Logs once that 'auto' falls back to XLA on this CPU, and why."""
  logging.warning(
    "vit_jax: the C++ CPU kernels are unavailable (%s); attention and LayerNorm run in XLA",
    unavailable_reason(),
  )


LAYER_NORM_EPSILON = 1e-6  # vit_jax.models.ops' (flax's nn.LayerNorm default)


def _make_kernels(march: str) -> types.SimpleNamespace:
  """`attention` and `layer_norm` calling the handlers registered for `march`."""
  suffix = _suffix(march)

  def forward(qkv: jax.Array) -> tuple[jax.Array, jax.Array]:
    batch, tokens, _, heads, head_dim = qkv.shape
    return jax.ffi.ffi_call(
      "vit_jax_attention_forward" + suffix,
      (
        jax.ShapeDtypeStruct((batch, tokens, heads, head_dim), jnp.float32),
        jax.ShapeDtypeStruct((batch, heads, tokens, tokens), jnp.float32),
      ),
      vmap_method="sequential",
    )(qkv)

  @jax.custom_vjp
  def attention(qkv: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(d)) v: float32 qkv [batch, tokens, 3, heads, head_dim] (q, k, v
    along axis 2) → [batch, tokens, heads, head_dim]. Call `unavailable_reason()` first."""
    return forward(qkv)[0]

  def attention_fwd(qkv):
    out, weights = forward(qkv)
    return out, (qkv, weights)

  def attention_bwd(residuals, d_out):
    qkv, weights = residuals
    d_qkv = jax.ffi.ffi_call(
      "vit_jax_attention_backward" + suffix,
      jax.ShapeDtypeStruct(qkv.shape, jnp.float32),
      vmap_method="sequential",
    )(d_out.astype(jnp.float32), qkv, weights)
    return (d_qkv,)

  attention.defvjp(attention_fwd, attention_bwd)

  def layer_norm_forward(x, scale, bias):
    rows = jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32)
    return jax.ffi.ffi_call(
      "vit_jax_layer_norm_forward" + suffix,
      (jax.ShapeDtypeStruct(x.shape, jnp.float32), rows, rows),
      vmap_method="sequential",
    )(x, scale, bias, epsilon=np.float32(LAYER_NORM_EPSILON))

  @jax.custom_vjp
  def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """(x - mean) / sqrt(var + 1e-6) * scale + bias over the last axis; float32 x [..., d],
    scale and bias [d]. Call `unavailable_reason()` first."""
    return layer_norm_forward(x, scale, bias)[0]

  def layer_norm_fwd(x, scale, bias):
    y, mean, rstd = layer_norm_forward(x, scale, bias)
    return y, (x, mean, rstd, scale)

  def layer_norm_bwd(residuals, d_y):
    x, mean, rstd, scale = residuals
    params = jax.ShapeDtypeStruct(scale.shape, jnp.float32)
    d_x, d_scale, d_bias = jax.ffi.ffi_call(
      "vit_jax_layer_norm_backward" + suffix,
      (jax.ShapeDtypeStruct(x.shape, jnp.float32), params, params),
      vmap_method="sequential",
    )(d_y.astype(jnp.float32), x, mean, rstd, scale)
    return d_x, d_scale, d_bias

  layer_norm.defvjp(layer_norm_fwd, layer_norm_bwd)
  return types.SimpleNamespace(march=march, attention=attention, layer_norm=layer_norm)


def for_target(march: str) -> types.SimpleNamespace:
  """The kernels built with `-march={march}`: `.attention` and `.layer_norm`, like this module's.

  Raises:
    RuntimeError: they cannot be built or loaded for that target (the reason is the message).
  """
  reason = unavailable_reason(march)
  if reason:
    raise RuntimeError(f"the C++ CPU kernels for -march={march}: {reason}")
  return _native if march == NATIVE else _make_kernels(march)


# The kernels of this machine's instruction set, which vit_jax.models.ops calls.
_native = _make_kernels(NATIVE)
attention = _native.attention
layer_norm = _native.layer_norm
