"""vit_jax: Vision Transformer (Dosovitskiy et al., 2021) in JAX/Flax."""
