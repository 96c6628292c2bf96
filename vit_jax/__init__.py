"""vit_jax: Vision Transformer (Dosovitskiy et al., 2021) in JAX/Flax."""

from vit_jax.kernels import xla_cpu_flags

xla_cpu_flags.apply()
