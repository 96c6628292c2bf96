"""vit_jax: Vision Transformer (Dosovitskiy et al., 2021) in JAX/Flax.

Importing it first sets glibc's allocator to keep XLA:CPU's step buffers mapped between steps
(on a machine without an accelerator, before other threads allocate):
vit_jax.kernels.xla_cpu_memory; VIT_JAX_KEEP_MALLOC=1 leaves the allocator as it is. Then it
adds vit_jax's XLA:CPU defaults to the XLA_FLAGS environment variable (matmuls outside YNNPACK;
a flag already there is kept): vit_jax.kernels.xla_cpu_flags; VIT_JAX_KEEP_XLA_FLAGS=1 leaves
XLA_FLAGS as it is.
"""

from vit_jax.kernels import xla_cpu_flags, xla_cpu_memory

xla_cpu_memory.apply()
xla_cpu_flags.apply()
