"""vit_jax: Vision Transformer (Dosovitskiy et al., 2021) in JAX/Flax.

Importing it changes nothing process-wide (allocator, environment, signals, garbage collector).
The commands set their process up first thing; a program of your own opts in with
`vit_jax.runtime.process.configure()` (docs/process.md).
"""
