"""Analysis: FLOPs and attention-memory estimates, attention maps."""
