"""vit_jax/cpu_kernels.py: the C++ attention and LayerNorm kernels against the XLA path, and the
fallbacks without them."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import cpu_kernels, models, models_vit


@pytest.fixture(scope="module")
def kernel():
  reason = cpu_kernels.unavailable_reason()
  assert reason is None, reason  # install.sh installs g++: the kernels must build here
  return cpu_kernels.attention


def _xla_attention(qkv):
  """The same function by the XLA path: heads-major q, k, v, `_attention`, back to tokens-major."""
  q, k, v = qkv.transpose(2, 0, 3, 1, 4)
  return models_vit._attention(q, k, v).transpose(0, 2, 1, 3)


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
def test_kernel_matches_xla_forward_and_backward(kernel, batch, tokens, heads, head_dim, scale):
  k1, k2 = jax.random.split(jax.random.key(0))
  qkv = scale * jax.random.normal(k1, (batch, tokens, 3, heads, head_dim))
  d_out = jax.random.normal(k2, (batch, tokens, heads, head_dim))
  out, vjp = jax.jit(lambda x: jax.vjp(kernel, x))(qkv)
  want, want_vjp = jax.jit(lambda x: jax.vjp(_xla_attention, x))(qkv)
  assert out.shape == want.shape and out.dtype == jnp.float32
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-6 * scale)
  (got_grad,), (want_grad,) = vjp(d_out), want_vjp(d_out)
  assert np.isfinite(got_grad).all()
  np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=2e-5 * scale)


def test_kernel_under_sharding_and_vmap(kernel):
  """A sharded program (XLA gathers the custom call's operands) and vmap give the same numbers."""
  qkv = jax.random.normal(jax.random.key(1), (8, 9, 3, 2, 8))
  want = jax.jit(_xla_attention)(qkv)
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  sharded = jax.device_put(
    qkv, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  )
  np.testing.assert_allclose(jax.jit(kernel)(sharded), want, rtol=1e-5, atol=2e-6)
  per_example = jax.jit(jax.vmap(lambda x: kernel(x[None])[0]))(qkv)
  np.testing.assert_allclose(per_example, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("shape", [(2, 65, 64), (3, 7, 40), (5, 8), (1, 197, 192)])
def test_layer_norm_kernel_matches_xla_forward_and_backward(kernel, shape):
  k1, k2, k3, k4 = jax.random.split(jax.random.key(5), 4)
  x = 3.0 * jax.random.normal(k1, shape) + 1.0
  scale = jax.random.normal(k2, shape[-1:])
  bias = jax.random.normal(k3, shape[-1:])
  d_y = jax.random.normal(k4, shape)
  out, vjp = jax.jit(lambda *a: jax.vjp(cpu_kernels.layer_norm, *a))(x, scale, bias)
  want, want_vjp = jax.jit(lambda *a: jax.vjp(models_vit._layer_norm, *a))(x, scale, bias)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  for got, expected in zip(vjp(d_y), want_vjp(d_y), strict=True):
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def _loss_and_grads(model, params, images):
  def loss(p):
    return jnp.sum(jnp.sin(model.apply({"params": p}, images, train=False)))

  return jax.jit(jax.value_and_grad(loss))(params)


def test_model_auto_takes_the_kernels_on_one_cpu_device(kernel, monkeypatch):
  model = models.get_model("testing", num_classes=4)  # attention_kernel 'auto'
  images = jax.random.uniform(jax.random.key(2), (2, 16, 16, 3), minval=-1, maxval=1)
  params = model.init(jax.random.key(3), images, train=False)["params"]
  params = jax.tree.map(
    lambda p: p + 0.3 * jax.random.normal(jax.random.key(4), p.shape), params
  )  # the head starts at zero
  calls = []

  def spy(qkv):
    calls.append(qkv.shape)
    return kernel(qkv)

  layer_norms = []
  real_layer_norm = cpu_kernels.layer_norm

  def spy_layer_norm(x, scale, bias):
    layer_norms.append(x.shape)
    return real_layer_norm(x, scale, bias)

  monkeypatch.setattr(models_vit.cpu_kernels, "attention", spy)
  monkeypatch.setattr(models_vit.cpu_kernels, "layer_norm", spy_layer_norm)
  # The test process simulates 8 devices: 'auto' keeps XLA there (no sharding rule)...
  assert jax.device_count() > 1
  xla = model.clone(attention_kernel="xla", layer_norm_kernel="xla")
  want = _loss_and_grads(xla, params, images)
  _loss_and_grads(model, params, images)
  assert calls == [] and layer_norms == []
  # ...and takes the kernels on a one-device CPU backend, with the same loss and gradients.
  monkeypatch.setattr(models_vit.jax, "device_count", lambda: 1)
  got = _loss_and_grads(model, params, images)
  assert len(calls) == model.num_layers
  assert all(len(shape) == 5 and shape[2] == 3 for shape in calls)  # [b, t, 3, heads, head_dim]
  assert len(layer_norms) == 2 * model.num_layers + 1  # two per block and the encoder's
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
  # 'cpu' insists on it whatever the device count; bf16 is refused with the reason.
  monkeypatch.undo()
  monkeypatch.setattr(models_vit.cpu_kernels, "attention", spy)
  monkeypatch.setattr(models_vit.cpu_kernels, "layer_norm", spy_layer_norm)
  calls.clear()
  layer_norms.clear()
  _loss_and_grads(model.clone(attention_kernel="cpu"), params, images)
  assert len(calls) == model.num_layers and layer_norms == []
  _loss_and_grads(model.clone(layer_norm_kernel="cpu"), params, images)
  assert len(calls) == model.num_layers and len(layer_norms) == 2 * model.num_layers + 1
  with pytest.raises(ValueError, match="attention_kernel='cpu' runs float32.*bfloat16"):
    _loss_and_grads(model.clone(attention_kernel="cpu", dtype=jnp.bfloat16), params, images)


def test_without_a_compiler_auto_falls_back_and_cpu_says_why(monkeypatch, tmp_path, caplog):
  monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
  monkeypatch.setenv("VIT_JAX_KERNEL_CACHE", str(tmp_path / "cache"))
  for cached in (cpu_kernels.unavailable_reason, cpu_kernels.warn_unavailable):
    cached.cache_clear()
  monkeypatch.setattr(models_vit.jax, "device_count", lambda: 1)
  try:
    reason = cpu_kernels.unavailable_reason()
    assert reason.startswith("no C++ compiler") and "no-such-compiler" in reason
    with caplog.at_level(logging.WARNING):
      assert models_vit._attention_path("auto", jnp.float32, 16) == "xla"
    assert "C++ CPU kernels are unavailable (no C++ compiler" in caplog.text
    with pytest.raises(ValueError, match=r"attention_kernel='cpu': no C\+\+ compiler"):
      models_vit._attention_path("cpu", jnp.float32, 16)
    assert not models_vit._use_cpu_kernel("layer_norm_kernel", "auto", jnp.float32)
    with pytest.raises(ValueError, match=r"layer_norm_kernel='cpu': no C\+\+ compiler"):
      models_vit._use_cpu_kernel("layer_norm_kernel", "cpu", jnp.float32)
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
    assert not any((tmp_path / "cache").iterdir())  # the temporary output was removed
  finally:
    cpu_kernels.unavailable_reason.cache_clear()
