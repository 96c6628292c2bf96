"""vit_jax: Vision Transformer (Dosovitskiy et al., 2021) in JAX/Flax.

Importing it adds vit_jax's XLA:CPU defaults to the XLA_FLAGS environment variable (matmuls
outside YNNPACK; a flag already there is kept): vit_jax.kernels.xla_cpu_flags.
VIT_JAX_KEEP_XLA_FLAGS=1 leaves XLA_FLAGS as it is.
"""

from vit_jax.kernels import xla_cpu_flags

xla_cpu_flags.apply()
