"""Backend-specific fast paths (XLA:CPU layouts, fused dropout bits) and process settings."""
