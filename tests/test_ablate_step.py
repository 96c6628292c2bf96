"""experiments/benchmarks/ablate_step.py: each variant really changes (or keeps) the traced step."""

import re

import pytest

from experiments.benchmarks import ablate_step
from vit_jax.runtime import cli


@pytest.mark.slow  # compiles every variant of the step (an experiment's run)
def test_variants_patch_the_step_and_restore_the_model(capsys):
  from vit_jax.models import ops

  originals = {n: getattr(ops, n) for n in ("attention", "layer_norm", "gelu_tanh")}
  cli.call(
    ablate_step,
    [
      "--model=testing",
      "--batch=4",
      "--image_size=16",
      "--num_classes=10",
      "--rounds=1",
      "--variants=" + ",".join(ablate_step.VARIANTS),
    ],
  )
  out = capsys.readouterr().out
  first = {
    m.group(1): float(m.group(2)) for m in re.finditer(r"compiled (\w+) in .* output (\S+)\)", out)
  }
  assert set(first) == set(ablate_step.VARIANTS)
  # The same function by another route gives the same loss; a removed part changes it.
  for same in (
    "xla_attention",
    "xla_layer_norm",
    "xla_kernels",
    "autodiff_attention",
    "autodiff_norms",
  ):
    assert abs(first[same] - first["full"]) < 1e-5, (same, first)
  for removed in ("no_attention", "no_layernorm", "no_gelu"):
    assert abs(first[removed] - first["full"]) > 1e-3, (removed, first)
  assert all(re.search(rf"^{name} +\d", out, re.M) for name in ablate_step.VARIANTS)
  assert {n: getattr(ops, n) for n in originals} == originals
