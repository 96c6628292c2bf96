"""Model FLOPs against the analytic count, and the one device-peak table."""

import jax
import ml_collections
import pytest

from vit_jax import models
from vit_jax.cost import devices, flops


def _closed_form(p, d, m, layers, image_size, classes):
  """2 FLOPs per multiply-add: patch embedding, per layer QKV + q k^T + weights @ v + out + MLP,
  the head on the class token (written out here, independently of vit_jax.cost.flops)."""
  n = (image_size // p) ** 2
  t = n + 1
  per_layer = (
    2 * t * d * (3 * d) + 2 * t * t * d + 2 * t * t * d + 2 * t * d * d + 2 * 2 * t * d * m
  )
  return 2 * n * (p * p * 3) * d + layers * per_layer + 2 * d * classes


def test_vit_b16_forward_flops_equal_the_analytic_count():
  config = models.get_model_config("B/16")
  model = models.get_model(config, 1000)
  expected = _closed_form(16, 768, 3072, 12, 224, 1000)
  assert expected == 35_127_656_448  # 17.56 G multiply-adds: timm's "17.6 GMACs"
  assert flops.forward_flops(model, (224, 224)) == expected
  assert flops.vit_forward_flops(config, 224, 1000) == expected
  assert flops.model_flops_per_example(model, (224, 224)) == 3 * expected


@pytest.mark.parametrize(
  "overrides",
  [dict(attention_kernel="cpu", layer_norm_kernel="cpu"), dict(scan=True), dict(remat=True)],
)
def test_the_count_does_not_depend_on_kernels_scan_or_remat(overrides):
  """XLA's cost analysis misses the C++ kernels' custom calls (the attention core's 4 T^2 D per
  layer); the count is taken on the XLA path, layers unrolled, so it is the same whatever runs."""
  config = models.get_model_config("testing")
  plain = flops.forward_flops(models.get_model(config, 10), (32, 32))
  assert flops.forward_flops(models.get_model(config, 10, **overrides), (32, 32)) == plain
  assert plain == flops.vit_forward_flops(config, 32, 10)


def test_hybrid_and_bit_counts_include_their_convolutions():
  hybrid = models.get_model_config("R50+ViT-B_16")
  vit_part = flops.vit_forward_flops(
    ml_collections.ConfigDict(dict(hybrid.to_dict(), resnet=None, patch_size=16)), 224, 10
  )
  # The stem's convolutions come on top of the transformer on the same 14x14 grid.
  assert flops.forward_flops(models.get_model(hybrid, 10), (224, 224)) > vit_part
  bit = flops.forward_flops(models.get_model("BiT-R50x1", 10), (224, 224))
  assert 7.5e9 < bit < 8.5e9  # ResNet-50: 4.1 G multiply-adds


def test_jaxpr_count_of_a_plain_matmul_and_a_scan():
  x = jax.ShapeDtypeStruct((4, 8), "float32")
  w = jax.ShapeDtypeStruct((8, 16), "float32")
  assert flops.jaxpr_matmul_flops(jax.make_jaxpr(lambda a, b: a @ b)(x, w).jaxpr) == 2 * 4 * 8 * 16

  def scanned(a, b):
    return jax.lax.scan(lambda c, _: (c, c @ b), a, None, length=5)[1]

  assert flops.jaxpr_matmul_flops(jax.make_jaxpr(scanned)(x, w).jaxpr) == 5 * 2 * 4 * 8 * 16


def test_one_peak_table():
  assert devices.peak_flops("TPU v3") == 61.5e12  # a v3 chip is two devices
  assert devices.peak_flops("TPU v4") == devices.peak_flops("TPU v4", "float32") == 275e12
  assert devices.peak_flops("TPU v5 lite") == 197e12
  assert devices.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
  assert devices.peak_flops("NVIDIA H100 80GB HBM3", "float32") == 494.5e12  # TF32
  assert devices.peak_flops("cpu") is None
  assert devices.device_peak("gpu", "NVIDIA H200", "bfloat16") == (989e12, "table: NVIDIA H200")
  assert devices.device_peak("tpu", "TPU v9", "bfloat16")[0] is None
