"""A process set up for vit_jax on a CPU, in one call: `configure()`.

Importing vit_jax changes nothing process-wide. Every command calls `configure()` first thing,
before JAX, TensorFlow or any other thread starts; a program that uses vit_jax as a library opts
in with the same call, as early:

    from vit_jax.runtime import process; process.configure()

What it sets and why (the allocator, XLA_FLAGS, JAX_PLATFORMS=cpu where libtpu is installed
without an accelerator: `quiet_libtpu`), and what else a command owns: docs/process.md. It logs
what it did, or why it left something as it was (an accelerator, JAX's backends already started,
an opt-out variable).

Importing this file imports neither JAX nor TensorFlow; `configure` imports JAX once it has set
JAX_PLATFORMS and the allocator.
"""

import dataclasses
import importlib.util
import os
import sys

from absl import logging

from vit_jax.kernels import xla_cpu_flags, xla_cpu_memory

# What libtpu would otherwise ask a TPU VM's metadata server, and JAX kept off a local accelerator.
_LIBTPU_WITHOUT_TPU = {
  "JAX_PLATFORMS": "cpu",
  "TPU_SKIP_MDS_QUERY": "1",
  "TPU_WORKER_HOSTNAMES": "localhost",
}


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `configure` did, in words."""

  allocator: str
  xla_flags: str
  platforms: str = ""  # what it set JAX_PLATFORMS to, and why ('' if nothing)

  @property
  def too_late(self) -> bool:
    """Whether something was left as it was because the call came too late."""
    return self.allocator == xla_cpu_memory.TOO_LATE or self.xla_flags == xla_cpu_flags.TOO_LATE

  def __str__(self) -> str:
    text = f"allocator: {self.allocator}; XLA_FLAGS: {self.xla_flags}"
    return text + (f"; JAX_PLATFORMS: {self.platforms}" if self.platforms else "")


_configured: list[Settings] = []  # what configure() did to this process's environment, if called


def configure(environ=os.environ) -> Settings:
  """Sets this process up as a command's is (see the module docstring); logs and returns what it
  did. Calling it again changes nothing more. `environ`: the environment whose XLA_FLAGS it
  sets and whose opt-out variables it reads."""
  platforms = ""
  if libtpu_without_accelerator(environ):  # before xla_cpu_memory imports JAX
    quiet_libtpu(environ)
    platforms = "cpu (libtpu is installed, no accelerator here)"
  xla_cpu_memory.apply(environ)
  settings = Settings(xla_cpu_memory.status, xla_cpu_flags.apply(environ), platforms)
  if environ is os.environ:
    _configured[:] = [settings]
  if settings.too_late:
    logging.warning(
      "vit_jax.runtime.process.configure() came too late for part of it (call it first thing, "
      "before JAX starts its backends): %s",
      settings,
    )
  else:
    logging.info("vit_jax process settings: %s", settings)
  return settings


def configured() -> Settings | None:
  """What `configure()` did to this process (None: not called: glibc's and XLA's defaults)."""
  return _configured[0] if _configured else None


def libtpu_without_accelerator(environ) -> bool:
  """libtpu installed, no accelerator's device node here, JAX_PLATFORMS unset, and (for this
  process's environment) JAX's backends not started yet, so that setting it still counts."""
  if environ.get("JAX_PLATFORMS") or xla_cpu_memory.accelerator(environ) is not None:
    return False
  if environ is os.environ and xla_cpu_flags.backends_started():
    return False
  return importlib.util.find_spec("libtpu") is not None


def quiet_libtpu(environ=os.environ) -> None:
  """For a process that compiles for TPU topologies without a TPU (vit_jax.tools.plan): JAX on
  the CPU, and libtpu told what it would ask a TPU VM's metadata server; only variables not set
  already. Before JAX starts its backends: JAX reads JAX_PLATFORMS when it is imported, so where
  it already is (and `environ` is this process's), its setting is made too unless chosen."""
  for name, value in _LIBTPU_WITHOUT_TPU.items():
    environ.setdefault(name, value)
  jax = sys.modules.get("jax")
  if environ is os.environ and jax is not None and not xla_cpu_flags.backends_started():
    if jax.config.jax_platforms is None:
      jax.config.update("jax_platforms", environ["JAX_PLATFORMS"])
