"""What runs below XLA: C++ kernels for XLA:CPU and the XLA:CPU flags vit_jax sets.

  cpu            the loader: compiles `attention.cc` and `layer_norm.cc` (with `parallel.h`)
                 with g++ on first use and registers them as XLA FFI custom calls
  xla_cpu_flags  the XLA:CPU defaults `import vit_jax` adds to XLA_FLAGS

Which implementation a model runs is decided in vit_jax.models.ops, not here. This file (and
xla_cpu_flags, which runs before JAX starts its backends) must not import JAX.
"""
