"""Analysis: FLOPs and attention-memory estimates (``costs``), attention maps and hidden
states (``introspection``)."""

from transformer_jax.analysis import costs, introspection
from transformer_jax.analysis.introspection import attention_maps, hidden_states

__all__ = ["attention_maps", "costs", "hidden_states", "introspection"]
