"""glibc's allocator set up so that XLA:CPU's step buffers stay mapped from one step to the next.

XLA:CPU allocates each execution's temporary buffer (all the activations a train step keeps for
its backward pass: 1.07 GiB for ViT-Ti/16 at batch 32) with `posix_memalign` on a worker thread
and frees it when the execution ends. glibc serves a block that size with a fresh `mmap` and
hands it back with `munmap`, so every step faults in and zeroes every page of it again: 285,000
page faults and ~0.5 CPU-s of kernel time per Ti/16 step on 2 cores, 15% of the step.

`apply()` makes every thread allocate from the main heap (`M_ARENA_MAX` 1), which grows with
`brk` (`M_MMAP_MAX` 0) and is never shrunk (`M_TRIM_THRESHOLD` -1), so a freed step buffer is
reused by the next step without a fault. The costs: the process's resident memory stays at its
peak (memory freed is kept for reuse, not given back to the system; ViT-Ti/16's train step at
batch 32: 2.9 instead of 1.9 GB between steps), and all threads share one arena's lock (the
demo's trainer on 2 cores: ~15 ms a step more around the step, against 37-54 ms less in it).
Figures: docs/benchmarks.md.

It only takes effect if no thread but the main one has allocated yet (glibc fixes the number of
arenas when the second one is made), so `vit_jax/__init__.py` calls it before anything else;
imported later, after JAX has started its thread pools, it changes nothing. It is skipped:
- where the C library is not glibc;
- where an accelerator is in use (`JAX_PLATFORMS` naming another platform first, or a TPU or
  GPU device node present): the step's buffers then live on the device, and the host's input
  pipeline, many threads on a TPU VM, is better served by glibc's per-thread arenas;
- with `VIT_JAX_KEEP_MALLOC` set (to anything but '' or '0').

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


def _accelerator(environ) -> str | None:
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
  either way is in `status`)."""
  global status
  if environ.get(OPT_OUT, "") not in ("", "0"):
    status = f"glibc's defaults ({OPT_OUT} is set)"
    return False
  accelerator = _accelerator(environ)
  if accelerator:
    status = f"glibc's defaults (an accelerator: {accelerator})"
    return False
  libc = _libc()
  if libc is None:
    status = "the C library's defaults (not glibc)"
    return False
  if arenas(libc) > 1:
    status = "glibc's defaults (other threads had allocated before vit_jax was imported)"
    return False
  ok = all(
    libc.mallopt(param, value) == 1
    for param, value in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))
  )
  status = "one heap, kept mapped" if ok else "glibc refused mallopt; its defaults partly kept"
  return ok
