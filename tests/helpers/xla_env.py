"""XLA_FLAGS for the test processes and every child process they start.

The suite's programs are tiny (a 20k-parameter ViT, batches of 16): compiling them costs far
more than running them, and most of that is LLVM's optimisation of the generated code. So the
suite compiles at XLA's backend optimisation level 0, with XLA:CPU's legacy fusion emitters
instead of its MLIR ones, which take longer to compile (measured: docs/process.md, "The test
suite's process settings"). What the tests check holds with either: float32 results are held to
float64 references with bounds that do not depend on how XLA orders its sums, and bitwise checks
compare runs compiled with the same flags. Where the code XLA generates is itself measured (the
tests of the CPU kernels that compare with XLA's own code, tests/test_cpu_kernels.py, and the
tanh GELU's absolute error, tests/test_models.py: the legacy emitters' tanh at level 0 is less
accurate), a child runs with XLA's defaults, as users' programs are compiled.

Every process also gets the XLA:CPU flags a command sets (vit_jax.kernels.xla_cpu_flags), which
importing vit_jax does not: the tests compile what the commands run. A user's own XLA_FLAGS are
kept (their optimisation level, if they set one, wins); only a device count of theirs is
replaced by the one a test asks for.
"""

import os
import re

from vit_jax.kernels import xla_cpu_flags

DEVICE_COUNT = "--xla_force_host_platform_device_count"
OPT_LEVEL = "--xla_backend_optimization_level"
FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters"
SUITE = (f"{OPT_LEVEL}=0", f"{FUSION_EMITTERS}=false")
# Set (by tests/conftest.py) where OPENBLAS_NUM_THREADS=1 is the suite's setting.
SUITE_BLAS = "VIT_JAX_SUITE_SET_BLAS_THREADS"


def flags(devices: int | None = None, environ=None, optimize: bool = False) -> str:
  """XLA_FLAGS for a process of the suite: the user's flags without their device count, the
  suite's (unless `optimize`: XLA's defaults), a command's, and `devices` simulated CPU devices
  (None: one, as a user's process has)."""
  given = (os.environ if environ is None else environ).get("XLA_FLAGS", "")
  kept = re.sub(rf"{DEVICE_COUNT}=\S*", "", given).split()
  if optimize:
    kept = [f for f in kept if not f.startswith((f"{OPT_LEVEL}=", f"{FUSION_EMITTERS}="))]
  else:
    kept += [f for f in SUITE if f.split("=")[0] not in given]
  kept += [f for f in xla_cpu_flags.DEFAULTS if f.split("=")[0] not in given]
  if devices is not None:
    kept.append(f"{DEVICE_COUNT}={devices}")
  return " ".join(kept)


def child_env(devices: int | None = None, optimize: bool = False, **extra: str) -> dict:
  """os.environ for a child process: `flags(devices, optimize=optimize)`, plus `extra`."""
  return dict(os.environ, XLA_FLAGS=flags(devices, optimize=optimize), **extra)


def user_env(devices: int | None = None, **extra: str) -> dict:
  """os.environ for a child process that computes what a user's command computes, to the bit: an
  experiment's --quick profile compared with the fingerprint that its full run recorded
  (experiments/fingerprint.py). XLA's default optimisation (the suite's level 0 rounds
  differently, and the few-shot accuracies of a few training steps move by points with it) and
  OpenBLAS's default threads (the pixel baselines' fits), unless the user set them; plus
  `extra`."""
  env = child_env(devices, optimize=True, **extra)
  if env.pop(SUITE_BLAS, None):
    del env["OPENBLAS_NUM_THREADS"]
  return env
