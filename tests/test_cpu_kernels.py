"""vit_jax/kernels/cpu.py: the C++ attention and LayerNorm kernels, and the fallbacks without them.

Correctness is measured against float64 computations of the same functions, never against
another float32 implementation at a tolerance tighter than float32's own error: a kernel must be
within `_SLACK` times the error of the XLA path, or of float64 attention from float32-rounded
logits where XLA does better than that (plus `_FLOOR`, a few float32 roundings). The
kernels are checked as built for this machine (`-march=native`) and, on x86-64, for two baseline
targets, so that an AVX-512 machine also tests the AVX2 code that an AVX2 machine runs, and the
scalar code of a machine without AVX2. What XLA computes depends on the CPU as well (it picks
its kernels at run time): the slow test runs the ill-conditioned case on an AVX2 CPU emulated by
QEMU, where XLA's gradient is 16x closer to float64 than on AVX-512.
"""

import json
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import REPO, xla_env
from vit_jax import models
from vit_jax.kernels import cpu as cpu_kernels
from vit_jax.models import ops

# x86-64-v3: AVX2 + FMA (the kernels' vector exp); x86-64-v2: SSE4.2 only (their scalar paths).
_BASELINES = ("x86-64-v3", "x86-64-v2") if platform.machine() == "x86_64" else ()
_SLACK = 2.0  # a kernel's error may be up to twice the XLA path's...
_FLOOR = 1e-6  # ...plus ~8 float32 roundings (relative to the largest element)
# Measured 3.4x on AVX-512 (grad 7.8e-6 against a floor of 2.3e-6 with logits in the thousands;
# with float sums for q k^T it was 1.3e-4, 56x).
_LOGITS_SLACK = 5.0


def _kernels_for(march):
  reason = cpu_kernels.unavailable_reason(march)
  if reason:  # install.sh installs g++: the kernels must build wherever the suite runs
    pytest.fail(f"the C++ kernels do not build for -march={march}: {reason} (install g++)")
  return cpu_kernels.for_target(march)


@pytest.fixture(scope="module", params=(cpu_kernels.NATIVE, *_BASELINES))
def kernels(request):
  return _kernels_for(request.param)


def _error(x, reference):
  """max |x - reference| relative to max |reference| (float64)."""
  x, reference = np.asarray(x, np.float64), np.asarray(reference, np.float64)
  return np.abs(x - reference).max() / np.abs(reference).max()


def _assert_as_accurate(name, got, xla, reference, floor=None):
  """`got` within _SLACK of the XLA path's error against float64, or, where `floor` (float64
  computed from float32-rounded logits) is given and XLA does better than float32 logits allow
  (its fusions keep more precision on some CPUs, not on others), within _SLACK of that floor."""
  got_error, xla_error = _error(got, reference), _error(xla, reference)
  floor_error = 0.0 if floor is None else _error(floor, reference)
  assert np.isfinite(np.asarray(got)).all(), name
  assert got_error <= _SLACK * max(xla_error, floor_error) + _FLOOR, (
    f"{name}: error vs float64 {got_error:.3g}, the XLA path's {xla_error:.3g}, float32 "
    f"logits' floor {floor_error:.3g}"
  )


def _xla_attention(qkv):
  """The same function by the XLA path: heads-major q, k, v, `_attention`, back to tokens-major."""
  q, k, v = qkv.transpose(2, 0, 3, 1, 4)
  return ops.attention(q, k, v).transpose(0, 2, 1, 3)


def _attention64(qkv, d_out, round_logits=False):
  """softmax(q k^T / sqrt(d)) v and its gradient for `d_out`, in float64 numpy.

  With `round_logits`, the logits are rounded once to float32 and the rest is float64: the
  error of that result is what any float32 implementation that holds its logits in float32
  incurs at the least, whatever the CPU.
  """
  qkv, d_out = np.float64(qkv), np.float64(d_out)
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [b, t, h, d]
  scale = 1.0 / np.sqrt(q.shape[-1])
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
  if round_logits:
    logits = np.float64(np.float32(logits))
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  out = np.einsum("bhqk,bkhd->bqhd", w, v)
  d_w = np.einsum("bqhd,bkhd->bhqk", d_out, v)
  d_v = np.einsum("bhqk,bqhd->bkhd", w, d_out)
  d_logits = w * (d_w - np.sum(d_w * w, -1, keepdims=True))
  d_q = np.einsum("bhqk,bkhd->bqhd", d_logits, k) * scale
  d_k = np.einsum("bhqk,bqhd->bkhd", d_logits, q) * scale
  return out, np.stack([d_q, d_k, d_v], axis=2)


@pytest.mark.parametrize(
  "batch, tokens, heads, head_dim, scale",
  [
    (2, 5, 2, 8, 1.0),  # fewer tokens than one 16-wide tile; head dim under 16
    (3, 17, 3, 40, 1.0),  # odd tokens, a head dim that is not a multiple of 16
    (2, 65, 4, 16, 1.0),  # the demo's model
    (1, 50, 2, 80, 1.0),  # ViT-H's head dim
    (2, 33, 2, 16, 30.0),  # logits in the hundreds: the softmax must subtract its maximum
  ],
)
def test_attention_is_as_accurate_as_xla(kernels, batch, tokens, heads, head_dim, scale):
  k1, k2 = jax.random.split(jax.random.key(0))
  qkv = scale * jax.random.normal(k1, (batch, tokens, 3, heads, head_dim))
  d_out = jax.random.normal(k2, (batch, tokens, heads, head_dim))
  out, vjp = jax.jit(lambda x: jax.vjp(kernels.attention, x))(qkv)
  xla_out, xla_vjp = jax.jit(lambda x: jax.vjp(_xla_attention, x))(qkv)
  want_out, want_grad = _attention64(qkv, d_out)
  assert out.shape == want_out.shape and out.dtype == jnp.float32
  # XLA's own error depends on the CPU (on AVX2 hardware its gradient was 17x closer to float64
  # than on AVX-512 in the last case, and 5x closer than float32 logits allow on an AVX2 EPYC),
  # so the kernel is held to XLA's error or the float32-logits floor, whichever is larger, and
  # to a bound that does not depend on the CPU: within _LOGITS_SLACK of that floor.
  floor_out, floor_grad = _attention64(qkv, d_out, round_logits=True)
  _assert_as_accurate("forward", out, xla_out, want_out, floor_out)
  _assert_as_accurate("gradient", vjp(d_out)[0], xla_vjp(d_out)[0], want_grad, floor_grad)
  for name, got, floor, want in (
    ("forward", out, floor_out, want_out),
    ("gradient", vjp(d_out)[0], floor_grad, want_grad),
  ):
    assert _error(got, want) <= _LOGITS_SLACK * _error(floor, want) + _FLOOR, (
      f"{name}: error vs float64 {_error(got, want):.3g}, float32 logits' floor "
      f"{_error(floor, want):.3g}"
    )


def test_attention_under_sharding_and_vmap_is_the_same_computation(kernels):
  """A sharded program (XLA gathers the custom call's operands) and vmap (one example at a
  time) run the same per-(batch, head) tasks: bit for bit the plain call's numbers."""
  qkv = jax.random.normal(jax.random.key(1), (8, 9, 3, 2, 8))
  want = jax.jit(kernels.attention)(qkv)
  _assert_as_accurate(
    "forward", want, jax.jit(_xla_attention)(qkv), _attention64(qkv, np.zeros((8, 9, 2, 8)))[0]
  )
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  sharded = jax.device_put(
    qkv, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  )
  np.testing.assert_array_equal(jax.jit(kernels.attention)(sharded), want)
  per_example = jax.jit(jax.vmap(lambda x: kernels.attention(x[None])[0]))(qkv)
  np.testing.assert_array_equal(per_example, want)


def _layer_norm64(x, scale, bias, d_y):
  """LayerNorm (epsilon 1e-6) and its gradients for `d_y`, in float64 numpy."""
  x, scale, bias, d_y = (np.float64(a) for a in (x, scale, bias, d_y))
  mean = x.mean(-1, keepdims=True)
  rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + cpu_kernels.LAYER_NORM_EPSILON)
  x_hat = (x - mean) * rstd
  g = d_y * scale
  d_x = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
  rows = tuple(range(x.ndim - 1))
  return x_hat * scale + bias, (d_x, (d_y * x_hat).sum(rows), d_y.sum(rows))


@pytest.mark.parametrize("shape", [(2, 65, 64), (3, 7, 40), (5, 8), (1, 197, 192)])
def test_layer_norm_is_as_accurate_as_xla(kernels, shape):
  k1, k2, k3, k4 = jax.random.split(jax.random.key(5), 4)
  x = 3.0 * jax.random.normal(k1, shape) + 1.0
  scale = jax.random.normal(k2, shape[-1:])
  bias = jax.random.normal(k3, shape[-1:])
  d_y = jax.random.normal(k4, shape)
  out, vjp = jax.jit(lambda *a: jax.vjp(kernels.layer_norm, *a))(x, scale, bias)
  xla_out, xla_vjp = jax.jit(lambda *a: jax.vjp(ops.layer_norm, *a))(x, scale, bias)
  want_out, want_grads = _layer_norm64(x, scale, bias, d_y)
  _assert_as_accurate("forward", out, xla_out, want_out)
  for name, got, xla, want in zip(
    ("d_x", "d_scale", "d_bias"), vjp(d_y), xla_vjp(d_y), want_grads, strict=True
  ):
    _assert_as_accurate(name, got, xla, want)


def _loss_and_grads(model, params, images):
  def loss(p):
    return jnp.sum(jnp.sin(model.apply({"params": p}, images, train=False)[0]))

  return jax.jit(jax.value_and_grad(loss))(params)


def test_model_auto_takes_the_kernels_on_one_cpu_device(monkeypatch):
  _kernels_for(cpu_kernels.NATIVE)
  model = models.get_model("testing", num_classes=4)  # attention_kernel 'auto'
  images = jax.random.uniform(jax.random.key(2), (2, 16, 16, 3), minval=-1, maxval=1)
  params = model.init(jax.random.key(3), images, train=False)["params"]
  params = jax.tree.map(
    lambda p: p + 0.3 * jax.random.normal(jax.random.key(4), p.shape), params
  )  # the head starts at zero
  calls = []
  real_attention, real_layer_norm = cpu_kernels.attention, cpu_kernels.layer_norm

  def spy(qkv):
    calls.append(qkv.shape)
    return real_attention(qkv)

  layer_norms = []

  def spy_layer_norm(x, scale, bias):
    layer_norms.append(x.shape)
    return real_layer_norm(x, scale, bias)

  monkeypatch.setattr(ops.cpu_kernels, "attention", spy)
  monkeypatch.setattr(ops.cpu_kernels, "layer_norm", spy_layer_norm)
  # The test process simulates 8 devices: 'auto' keeps XLA there (no sharding rule)...
  assert jax.device_count() > 1
  xla = model.clone(attention_kernel="xla", layer_norm_kernel="xla")
  want = _loss_and_grads(xla, params, images)
  _loss_and_grads(model, params, images)
  assert calls == [] and layer_norms == []
  # ...and takes the kernels on a one-device CPU backend, as accurate as XLA against float64.
  monkeypatch.setattr(ops.jax, "device_count", lambda: 1)
  got = _loss_and_grads(model, params, images)
  assert len(calls) == model.num_layers
  assert all(len(shape) == 5 and shape[2] == 3 for shape in calls)  # [b, t, 3, heads, head_dim]
  # Traced: two per block, the encoder's, and each block's map through it (`normed_blocks`,
  # which jit drops when nothing reads it).
  assert len(layer_norms) == 3 * model.num_layers + 1
  with jax.enable_x64(True):
    f64 = xla.clone(dtype=jnp.float64, param_dtype=jnp.float64)
    reference = _loss_and_grads(
      f64, jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), params), jnp.float64(images)
    )
  assert jax.tree.leaves(reference)[0].dtype == jnp.float64

  def flat(tree):  # all gradients as one vector: the key biases' true gradient is exactly zero
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])

  _assert_as_accurate("loss", got[0], want[0], reference[0])
  _assert_as_accurate("gradients", flat(got[1]), flat(want[1]), flat(reference[1]))
  # 'cpu' insists on it whatever the device count; bf16 is refused with the reason.
  monkeypatch.undo()
  monkeypatch.setattr(ops.cpu_kernels, "attention", spy)
  monkeypatch.setattr(ops.cpu_kernels, "layer_norm", spy_layer_norm)
  calls.clear()
  layer_norms.clear()
  _loss_and_grads(model.clone(attention_kernel="cpu"), params, images)
  assert len(calls) == model.num_layers and layer_norms == []
  _loss_and_grads(model.clone(layer_norm_kernel="cpu"), params, images)
  assert len(calls) == model.num_layers and len(layer_norms) == 3 * model.num_layers + 1
  with pytest.raises(ValueError, match="attention_kernel='cpu' runs float32.*bfloat16"):
    _loss_and_grads(model.clone(attention_kernel="cpu", dtype=jnp.bfloat16), params, images)


def test_without_a_compiler_auto_falls_back_and_cpu_says_why(monkeypatch, tmp_path, caplog):
  monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
  monkeypatch.setenv("VIT_JAX_KERNEL_CACHE", str(tmp_path / "cache"))
  for cached in (cpu_kernels.unavailable_reason, cpu_kernels.warn_unavailable):
    cached.cache_clear()
  monkeypatch.setattr(ops.jax, "device_count", lambda: 1)
  try:
    reason = cpu_kernels.unavailable_reason()
    assert reason.startswith("no C++ compiler") and "no-such-compiler" in reason
    with caplog.at_level(logging.WARNING):
      assert ops.attention_path("auto", jnp.float32, 16) == "xla"
    assert "C++ CPU kernels are unavailable (no C++ compiler" in caplog.text
    with pytest.raises(ValueError, match=r"attention_kernel='cpu': no C\+\+ compiler"):
      ops.attention_path("cpu", jnp.float32, 16)
    assert not ops.use_cpu_kernel("layer_norm_kernel", "auto", jnp.float32)
    with pytest.raises(ValueError, match=r"layer_norm_kernel='cpu': no C\+\+ compiler"):
      ops.use_cpu_kernel("layer_norm_kernel", "cpu", jnp.float32)
    with pytest.raises(RuntimeError, match=r"-march=x86-64-v2: no C\+\+ compiler"):
      cpu_kernels.for_target("x86-64-v2")
    assert not any((tmp_path / "cache").glob("*.so"))  # nothing half-built left behind
  finally:
    for cached in (cpu_kernels.unavailable_reason, cpu_kernels.warn_unavailable):
      cached.cache_clear()


def test_a_failed_build_names_the_compiler_error(monkeypatch, tmp_path):
  compiler = tmp_path / "failing-cxx"
  compiler.write_text("#!/bin/sh\necho 'cpu_kernels.cc:1: error: simulated' >&2\nexit 1\n")
  compiler.chmod(0o755)
  monkeypatch.setenv("CXX", str(compiler))
  monkeypatch.setenv("VIT_JAX_KERNEL_CACHE", str(tmp_path / "cache"))
  cpu_kernels.unavailable_reason.cache_clear()
  try:
    reason = cpu_kernels.unavailable_reason()
    assert "failing-cxx failed to build the kernels" in reason and "error: simulated" in reason
    # The temporary output was removed (the build lock's file stays).
    assert not list((tmp_path / "cache").glob("*.so"))
  finally:
    cpu_kernels.unavailable_reason.cache_clear()


# The ill-conditioned case of test_attention_is_as_accurate_as_xla on an AVX2 CPU without
# AVX-512, emulated by QEMU (Debian's qemu-user; its 'EPYC-Rome' model: AVX2 and FMA): XLA:CPU
# picks its kernels from the CPU it runs on (cpuid), which `--xla_cpu_max_isa` does not change.
_EMULATED = textwrap.dedent(
  """
  import json, sys
  sys.path[:0] = [{repo!r}, {tests!r}]
  import jax
  import test_cpu_kernels as t
  from vit_jax.kernels import cpu as cpu_kernels
  k1, k2 = jax.random.split(jax.random.key(0))
  qkv = 30.0 * jax.random.normal(k1, (2, 33, 3, 2, 16))
  d_out = jax.random.normal(k2, (2, 33, 2, 16))
  want = t._attention64(qkv, d_out)
  floor = t._attention64(qkv, d_out, round_logits=True)
  def errors(f):
    out, vjp = jax.jit(lambda x: jax.vjp(f, x))(qkv)
    return [t._error(out, want[0]), t._error(vjp(d_out)[0], want[1])]
  kernels = cpu_kernels.for_target("x86-64-v3")
  print(json.dumps(dict(xla=errors(t._xla_attention), kernel=errors(kernels.attention),
                        floor=[t._error(floor[0], want[0]), t._error(floor[1], want[1])])))
  """
)


@pytest.mark.slow  # ~5 minutes under emulation
@pytest.mark.skipif(platform.machine() != "x86_64", reason="emulates an x86-64 CPU")
def test_attention_on_an_emulated_avx2_cpu(tmp_path):
  qemu = shutil.which("qemu-x86_64")
  if qemu is None:
    pytest.skip("no qemu-x86_64 (Debian: apt-get install qemu-user)")
  code = _EMULATED.format(repo=str(REPO), tests=str(REPO / "tests"))
  # A kernel cache of its own: the machine's may hold libraries built for its own (AVX-512) CPU.
  env = xla_env.child_env(optimize=True, VIT_JAX_KERNEL_CACHE=str(tmp_path / "kernels"))
  proc = subprocess.run(
    [qemu, "-cpu", "EPYC-Rome", sys.executable, "-c", code],
    capture_output=True, text=True, env=env, cwd=REPO, timeout=1800,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  print(f"emulated AVX2 (forward, gradient) error vs float64: {got}")
  (kernel_out, kernel_grad), (xla_out, xla_grad) = got["kernel"], got["xla"]
  assert kernel_out <= _SLACK * xla_out + _FLOOR and kernel_grad <= _SLACK * xla_grad + _FLOOR
  assert kernel_grad <= _LOGITS_SLACK * got["floor"][1] + _FLOOR


_FAKE_CXX = """#!/bin/sh
case "$*" in
  *--version*) echo "fakecc {version}" ;;
  *--help=target*) echo "  -mfake [enabled]" ;;
  *) prev=""; for a in "$@"; do [ "$prev" = "-o" ] && echo garbage > "$a"; prev="$a"; done ;;
esac
"""


def _fake_cxx(tmp_path, version):
  path = tmp_path / f"fakecc-{version}"
  path.write_text(_FAKE_CXX.format(version=version))
  path.chmod(0o755)
  return str(path)


def test_the_cache_key_follows_the_compiler_and_the_cpu(tmp_path, monkeypatch):
  monkeypatch.setenv("VIT_JAX_KERNEL_CACHE", str(tmp_path / "cache"))
  one, two = _fake_cxx(tmp_path, "1.0"), _fake_cxx(tmp_path, "2.0")
  path = cpu_kernels.library_path(one, "native")
  assert path == cpu_kernels.library_path(one, "native")  # the same inputs, the same library
  assert cpu_kernels.library_path(two, "native") != path  # another compiler version
  assert cpu_kernels.library_path(one, "x86-64-v2") != path  # another -march
  monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: "Features\t: fp asimd sve")
  assert cpu_kernels.library_path(one, "native") != path  # another CPU (an ARM one)
  # The compiler's answers are kept per compiler binary: a changed compiler is asked again.
  pathlib.Path(one).write_text(_FAKE_CXX.format(version="1.1"))
  os.utime(one, (1_000_000_000, 1_000_000_000))  # a new modification time on any filesystem
  assert cpu_kernels.library_path(one, "native") not in (
    path,
    cpu_kernels.library_path(two, "native"),
  )


def test_a_library_that_fails_to_load_is_never_cached(tmp_path, monkeypatch):
  monkeypatch.setenv("VIT_JAX_KERNEL_CACHE", str(tmp_path / "cache"))
  with pytest.raises(OSError, match="the built library fails its load test"):
    cpu_kernels._build(_fake_cxx(tmp_path, "1.0"), "native")
  assert not list((tmp_path / "cache").glob("*.so"))  # neither the library nor its temporary
