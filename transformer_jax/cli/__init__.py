"""Command-line tools: translate, evaluate, average (``python -m transformer_jax.<command>``)."""
