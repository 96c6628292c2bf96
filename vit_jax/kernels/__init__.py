"""What runs below XLA: C++ kernels for XLA:CPU, and the XLA:CPU flags and allocator settings.

  cpu            the loader: compiles `attention.cc` and `layer_norm.cc` (with `parallel.h`)
                 with g++ on first use and registers them as XLA FFI custom calls
  xla_cpu_flags  the XLA:CPU flags a command adds to XLA_FLAGS
  xla_cpu_memory glibc's allocator and JAX's CPU dispatch set so that XLA:CPU's step buffers
                 are reused from one step to the next instead of faulted in again

The last two are applied by vit_jax.runtime.process.configure, never on import. Which
implementation a model runs is decided in vit_jax.models.ops, not here. This file and
xla_cpu_flags must not import JAX (xla_cpu_memory imports it once the allocator is set).
"""
