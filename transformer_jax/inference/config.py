"""``DecodeConfig``: the ``decode`` section of a run's config, beam search's settings, each
field declared once with its default, check and help (:func:`transformer_jax.fields.setting`).

Importing it imports no JAX: the commands read its defaults before the library is imported.
"""

from __future__ import annotations

import dataclasses

from transformer_jax.fields import integer, number, setting


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """``config.decode``: beam search (§6.1)."""

    beam_size: int = setting(4, "beams (§6.1)", integer(1), resumable=True)
    alpha: float = setting(0.6, "length penalty (§6.1)", number(0), resumable=True)
    max_extra_len: int = setting(
        50, "maximum output length = input length + this", integer(0), resumable=True
    )


PAPER = DecodeConfig()  # the paper's decoding (§6.1): the defaults of the decoding functions
