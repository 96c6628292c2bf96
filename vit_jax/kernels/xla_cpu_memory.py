"""glibc's allocator set so that XLA:CPU's step buffers stay mapped from one step to the next.

XLA:CPU allocates each execution's temporary buffer (all the activations a train step keeps for
its backward pass, often more than a GiB) and frees it when the execution ends; glibc serves a
block that large with a fresh `mmap`, so every step faults in and zeroes every page of it again.
`apply()` makes every thread allocate from the main heap (`M_ARENA_MAX` 1), which grows with
`brk` (`M_MMAP_MAX` 0) and is never shrunk (`M_TRIM_THRESHOLD` -1), so a freed step buffer is
reused by the next step. The costs: the process keeps its peak memory, and all threads share
one arena's lock. Measurements: docs/benchmarks.md#step-buffers-kept-mapped.

It is called by vit_jax.runtime.process.configure (never on import), and only takes effect if
no thread but the main one has allocated yet (glibc fixes the arenas when the second is made).
It is skipped where the C library is not glibc, where an accelerator is in use (the step's
buffers live on the device; the host's input pipeline is better served by glibc's per-thread
arenas) and with `VIT_JAX_KEEP_MALLOC` set (to anything but '' or '0').

This file must not import JAX.
"""

import ctypes
import glob
import os
import re

OPT_OUT = "VIT_JAX_KEEP_MALLOC"
# mallopt(3) parameters.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
# Device nodes of a TPU (accel: v2-v4; vfio: v5 and later) or a GPU (NVIDIA, AMD).
ACCELERATOR_NODES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*", "/dev/kfd")
APPLIED = "one heap, kept mapped"
TOO_LATE = "glibc's defaults (other threads had allocated before it was called)"

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


def arenas(libc) -> int:
  """How many malloc arenas glibc has made so far (1: only the main thread has allocated)."""
  buf, size = ctypes.c_char_p(), ctypes.c_size_t()
  libc.open_memstream.restype = ctypes.c_void_p
  stream = ctypes.c_void_p(libc.open_memstream(ctypes.byref(buf), ctypes.byref(size)))
  try:
    libc.malloc_info(0, stream)
  finally:
    libc.fclose(stream)
  text = ctypes.string_at(buf, size.value).decode()
  libc.free(buf)
  return len(re.findall(r"<heap nr=", text))


def accelerator(environ) -> str | None:
  """What says an accelerator is in use, or None."""
  platforms = environ.get("JAX_PLATFORMS", "").strip()
  if platforms:
    first = platforms.split(",")[0].strip()
    return None if first == "cpu" else f"JAX_PLATFORMS={platforms}"
  for pattern in ACCELERATOR_NODES:
    found = sorted(glob.glob(pattern))
    if found:
      return found[0]
  return None


def apply(environ=os.environ) -> bool:
  """Sets glibc's allocator as the module docstring says; returns whether it did (the reason
  either way is in `status`). Calling it again once it has succeeded changes nothing."""
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
  if arenas(libc) > 1:
    status = TOO_LATE
    return False
  ok = all(
    libc.mallopt(param, value) == 1
    for param, value in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))
  )
  status = APPLIED if ok else "glibc refused mallopt; its defaults partly kept"
  return ok
