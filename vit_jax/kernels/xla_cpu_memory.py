"""glibc's allocator and JAX's CPU dispatch set so that XLA:CPU's step buffers stay mapped from
one step to the next.

XLA:CPU allocates each execution's temporary buffer (often more than a GiB for a train step) on
the thread that runs it and frees it at the end; glibc serves a block that large with a fresh
`mmap`, so every step faults in and zeroes every page again. `apply()` keeps such blocks in the
main thread's heap (`M_MMAP_MAX` 0, `M_TRIM_THRESHOLD` -1) and has JAX run a one-device CPU
computation on the calling thread (`jax_cpu_enable_async_dispatch` off), so a freed step buffer
is reused by the next step; the process keeps its peak memory. Why, and the measurements:
docs/process.md ("The allocator's costs"), docs/benchmarks.md.

It is called by vit_jax.runtime.process.configure, never on import, and must come before JAX
starts its backends (the CPU client's dispatch is fixed when it is made). It is skipped where the
C library is not glibc, where an accelerator is in use and with `VIT_JAX_KEEP_MALLOC` set (to
anything but '' or '0').

This file imports JAX only once the allocator is set.
"""

import ctypes
import glob
import os

from vit_jax.kernels import xla_cpu_flags

OPT_OUT = "VIT_JAX_KEEP_MALLOC"
# mallopt(3) parameters.
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
# Device nodes of a TPU (accel: v2-v4; vfio: v5 and later) or a GPU (NVIDIA, AMD).
TPU_NODES = ("/dev/accel*", "/dev/vfio/[0-9]*")
ACCELERATOR_NODES = (*TPU_NODES, "/dev/nvidia[0-9]*", "/dev/kfd")
APPLIED = "the main heap kept mapped, one-device CPU steps run on the calling thread"
TOO_LATE = "glibc's defaults (JAX had started its backends before it was called)"

# Why apply() did or did not change the allocator (printed by the benchmarks).
status = "not applied yet"


def _libc():
  """glibc's functions, or None where the C library is another one."""
  try:
    if not os.confstr("CS_GNU_LIBC_VERSION"):
      return None
    return ctypes.CDLL(None)
  except (ValueError, OSError, AttributeError):
    return None


def accelerator(environ) -> str | None:
  """What says an accelerator is in use, or None."""
  platforms = environ.get("JAX_PLATFORMS", "").strip()
  if platforms:
    first = platforms.split(",")[0].strip()
    return None if first == "cpu" else f"JAX_PLATFORMS={platforms}"
  return device_node(ACCELERATOR_NODES)


def device_node(patterns) -> str | None:
  """The first device node matching one of `patterns`, or None."""
  for pattern in patterns:
    found = sorted(glob.glob(pattern))
    if found:
      return found[0]
  return None


def apply(environ=os.environ) -> bool:
  """Sets glibc's allocator and JAX's CPU dispatch as the module docstring says; returns whether
  it did (the reason either way is in `status`). Calling it again once it has succeeded changes
  nothing."""
  global status
  if status == APPLIED:
    return True
  if environ.get(OPT_OUT, "") not in ("", "0"):
    status = f"glibc's defaults ({OPT_OUT} is set)"
    return False
  found = accelerator(environ)
  if found:
    status = f"glibc's defaults (an accelerator: {found})"
    return False
  libc = _libc()
  if libc is None:
    status = "the C library's defaults (not glibc)"
    return False
  if xla_cpu_flags.backends_started():
    status = TOO_LATE
    return False
  if not all(libc.mallopt(p, v) == 1 for p, v in ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))):
    status = "glibc refused mallopt; its defaults partly kept"
    return False
  import jax  # noqa: PLC0415 - after the allocator is set, before any backend starts

  jax.config.update("jax_cpu_enable_async_dispatch", False)
  status = APPLIED
  return True
