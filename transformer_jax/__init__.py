"""transformer_jax: the Transformer of "Attention Is All You Need" in JAX/Flax.

The public API, one import away:

* ``Transformer``, ``TransformerConfig`` (defaults: the paper's base model), ``Encoder``,
  ``Decoder`` (also decoder-only);
* the model's pieces: ``attention`` (Eq. 1, masks, ``MultiHeadAttention``), ``embeddings``
  (scaled embeddings, sinusoidal or learned positions), ``layers`` (``FeedForward``,
  encoder and decoder layers), and ``variants`` beyond the paper for the modules' injection
  points (RoPE, ALiBi, GLU and GELU FFNs, RMSNorm, grouped-query attention), with
  ``variants.register``, which makes a piece of your own a config name;
* ``decoding``: greedy, beam search and sampling over any step function ``(tokens, cache)
  -> (logits, cache)``, and the Transformer's ``greedy_search`` / ``beam_search``;
* ``training``: ``make_batch``, ``create_train_state``, ``train_step`` / ``eval_step``,
  the label-smoothed loss, the paper's optimizer and schedule;
* ``data``: the tokenizer, sources and token-budget batches; ``ids``: PAD, UNK, BOS, EOS;
* ``analysis``: cost estimates, attention maps and hidden states;
* ``kernels``: the backend seam (fast paths chosen by the target platform);
* ``interop``: ``torch.nn.Transformer`` state dicts to and from parameters (``interop.torch``).

Each name is imported when first used (a module ``__getattr__``): ``import transformer_jax``
imports neither JAX nor Flax. No module installs a signal handler or reads the interpreter's
command line on import: the handlers are the train command's (:mod:`transformer_jax.cli.train`).
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> (module, attribute of it; None: the module itself)
_PUBLIC: dict[str, tuple[str, str | None]] = {
    **{
        name: (f"transformer_jax.{name}", None)
        for name in ("analysis", "data", "ids", "interop", "kernels", "training")
    },
    "decoding": ("transformer_jax.inference.decoding", None),
    **{
        name: (f"transformer_jax.model.{name}", None)
        for name in ("attention", "embeddings", "layers", "variants")
    },
    **{
        name: ("transformer_jax.model.attention", name)
        for name in (
            "MultiHeadAttention",
            "causal_mask",
            "padding_mask",
            "scaled_dot_product_attention",
        )
    },
    "TransformerConfig": ("transformer_jax.model.config", "TransformerConfig"),
    "sinusoidal_positions": ("transformer_jax.model.embeddings", "sinusoidal_positions"),
    "FeedForward": ("transformer_jax.model.layers", "FeedForward"),
    **{
        name: ("transformer_jax.model.transformer", name)
        for name in ("Decoder", "Encoder", "Transformer")
    },
}
__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name, imported on first use."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'transformer_jax' has no attribute {name!r}")
    module, attribute = _PUBLIC[name]
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
