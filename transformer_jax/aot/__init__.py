"""Ahead-of-time compilation for GPUs without one: target configs, programs, the plan."""
