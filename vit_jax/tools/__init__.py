"""Command-line tools (`python -m vit_jax.tools.<name>`)."""
