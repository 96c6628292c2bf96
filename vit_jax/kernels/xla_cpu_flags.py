"""The XLA:CPU flags a command sets before JAX starts its backends: matmuls outside YNNPACK.

For the ViT's matmuls XLA's own (Eigen) dots are faster than YNNPACK's, so
`--xla_cpu_experimental_ynn_fusion_type=-individual_dot` takes them out of YNNPACK, which keeps
reductions and convolutions (docs/benchmarks.md, "Matmuls outside YNNPACK"). `apply()`, called by
vit_jax.runtime.process.configure (never on import), adds the flags that XLA_FLAGS does not
already set, so a value of the user's own wins; `VIT_JAX_KEEP_XLA_FLAGS=1` leaves XLA_FLAGS as it
is. Once JAX has started a backend it changes nothing (XLA reads XLA_FLAGS once, and children
would inherit flags this process never used). GPU and TPU backends ignore XLA:CPU flags.

This file must not import JAX.
"""

import os
import sys

DEFAULTS = ("--xla_cpu_experimental_ynn_fusion_type=-individual_dot",)
# Set (to anything but '' or '0'), `apply` leaves XLA_FLAGS alone.
OPT_OUT = "VIT_JAX_KEEP_XLA_FLAGS"
TOO_LATE = "left as given (JAX had started its backends before it was called)"


def backends_started() -> bool:
  """Whether JAX has created a backend in this process (XLA_FLAGS has then been read)."""
  bridge = sys.modules.get("jax._src.xla_bridge")
  started = getattr(bridge, "backends_are_initialized", None)
  return bool(started and started())


def apply(environ=os.environ) -> str:
  """Adds each of DEFAULTS to environ['XLA_FLAGS'] unless that flag is already there (or
  environ[OPT_OUT] is set, or, for this process's environment, a backend has started); returns
  what it did, in words."""
  if environ.get(OPT_OUT, "") not in ("", "0"):
    return f"left as given ({OPT_OUT} is set)"
  flags = environ.get("XLA_FLAGS", "")
  present = {f.split("=")[0] for f in flags.split()}
  added = [f for f in DEFAULTS if f.split("=")[0] not in present]
  if not added:
    return "vit_jax's defaults present"
  if environ is os.environ and backends_started():
    return TOO_LATE
  environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()
  return "added " + " ".join(added)
