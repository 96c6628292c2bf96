"""XLA:CPU settings vit_jax applies before JAX starts its backends: matmuls outside YNNPACK.

jax 0.10's CPU backend hands every dot (and convolution) to YNNPACK by default and reductions to
YNNPACK fusions. For the ViT's matmuls XLA's own (Eigen) dots are faster, so
`--xla_cpu_experimental_ynn_fusion_type=-individual_dot` takes them out of YNNPACK (which keeps
the reductions and convolutions); the measurements: docs/benchmarks.md.

`apply()` runs when vit_jax is imported: it rewrites the process's XLA_FLAGS. It only adds flags
XLA_FLAGS does not already set, so `XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=` (or any
other value) overrides it; `VIT_JAX_KEEP_XLA_FLAGS=1` leaves XLA_FLAGS as it is. It changes
nothing once JAX has created a backend (XLA reads XLA_FLAGS once). GPU and TPU backends ignore
XLA:CPU flags.

This file must not import JAX.
"""

import os

DEFAULTS = ("--xla_cpu_experimental_ynn_fusion_type=-individual_dot",)
# Set (to anything but '' or '0'), `apply` leaves XLA_FLAGS alone.
OPT_OUT = "VIT_JAX_KEEP_XLA_FLAGS"


def apply(environ=os.environ) -> None:
  """Adds each of DEFAULTS to environ['XLA_FLAGS'] unless that flag is already there (or
  environ[OPT_OUT] is set)."""
  if environ.get(OPT_OUT, "") not in ("", "0"):
    return
  flags = environ.get("XLA_FLAGS", "")
  present = {f.split("=")[0] for f in flags.split()}
  added = [f for f in DEFAULTS if f.split("=")[0] not in present]
  if added:
    environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()
