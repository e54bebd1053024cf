"""The model's pieces by name: one route from a config's name or a module argument to a piece,
what it declares and what it needs of the config.

Each kind of piece is named by a ``TransformerConfig`` field and given to ``Transformer``,
``Encoder``, ``Decoder`` (and the layers) as a module attribute (kind: field, attribute):

- ``ffn``: ``ffn``, ``ffn``; ``ffn(config, name='ffn')``, a module d_model -> d_model;
- ``norm``: ``norm_type``, ``norm``; ``norm(config, name=...)``, normalising the last axis;
- ``positional``: ``positional``, ``score_fn``; a score hook (``attention.ScoreFn``), or None
  for positions added to the embeddings only;
- ``attention``: ``attention``, ``attention``; ``attention(config, *, causal, decode,
  score_fn, name)``, a module called as ``(x, kv, mask, deterministic, where)``.

:func:`register` adds a piece under a name (the config's field then accepts that name: a config
file that imports the module registering it makes ``--config.model.ffn=NAME`` work). A piece
given as a module attribute is looked up here by identity: a registered one brings its
declarations and checks, another one is anonymous (no checks of its own; a score hook keeps the
positions the config names). :func:`check` holds the rules, for names and module arguments alike.
The library's names are listed in :data:`SHIPPED` with the module that ships each: a config's
names are checked without importing Flax, the pieces are imported once a config is made.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # model.config imports this module
    from transformer_jax.model.config import TransformerConfig

FIELDS = {"ffn": "ffn", "norm": "norm_type", "positional": "positional", "attention": "attention"}
ATTRIBUTES = {"ffn": "ffn", "norm": "norm", "positional": "score_fn", "attention": "attention"}

# The library's pieces: each kind's names, in order, and the module that ships each (its
# ``ship`` call). A config's names are checked against these without importing the modules
# (Flax); the pieces themselves are read once a config is made or a model built (:func:`named`).
_MODEL = "transformer_jax.model"
SHIPPED: dict[str, dict[str, str]] = {
    "positional": {
        **dict.fromkeys(("sinusoidal", "learned", "none"), f"{_MODEL}.embeddings"),
        **dict.fromkeys(("rope", "alibi"), f"{_MODEL}.variants"),
    },
    "ffn": {
        "relu": f"{_MODEL}.layers",
        **dict.fromkeys(("gelu", "glu", "geglu", "swiglu"), f"{_MODEL}.variants"),
    },
    "norm": {"layer": f"{_MODEL}.layers", "rms": f"{_MODEL}.variants"},
    "attention": {
        "multi_head": f"{_MODEL}.layers",
        **dict.fromkeys(("grouped_query", "multi_query"), f"{_MODEL}.variants"),
    },
}


@dataclasses.dataclass(frozen=True)
class Piece:
    """A piece and its declarations: ``adds`` (positional: the positions added to the
    embeddings, 'none' when its score hook replaces them), ``needs`` (``needs(config)``: what
    the piece needs of the config, in words, or None), ``shipped`` (the library's own)."""

    kind: str
    name: str
    build: Any
    adds: str | None = None
    needs: Callable[[Any], str | None] | None = None
    shipped: bool = False
    registered: bool = True

    def describe(self) -> str:
        """``positional='rope'`` for a named piece, ``score_fn=my_hook`` for a given one."""
        if self.registered:
            return f"{FIELDS[self.kind]}={self.name!r}"
        return f"{ATTRIBUTES[self.kind]}={self.name}"


_PIECES: dict[str, dict[str, Piece]] = {kind: {} for kind in FIELDS}


def register(
    kind: str,
    name: str,
    piece: Any,
    *,
    replaces_positions: bool = True,
    needs: Callable[[Any], str | None] | None = None,
) -> Any:
    """Register ``piece`` of ``kind`` ('ffn', 'norm', 'positional' (a score hook),
    'attention') as ``name``: the config field of that kind accepts the name, and the piece
    given as a module attribute is checked as the name is. Returns ``piece``.

    ``replaces_positions`` (positional): the hook carries the positions, so none are added to
    the embeddings (RoPE, ALiBi); False: the paper's sinusoidal ones are. ``needs(config)``:
    what the piece needs of the config, in one line (e.g. "needs an even d_k, got 7"), or None.
    Registering a name again replaces a registered piece (a re-run notebook cell); a
    shipped name is kept.
    """
    if kind not in FIELDS:
        raise ValueError(f"kind must be one of {tuple(FIELDS)}, got {kind!r}")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a {kind} name must be an identifier, got {name!r}")
    if name in SHIPPED[kind]:
        raise ValueError(f"{FIELDS[kind]}={name!r} is the library's: register yours as another")
    if not callable(piece):
        raise ValueError(f"the {kind} piece {name!r} must be callable, got {piece!r}")
    adds = ("none" if replaces_positions else "sinusoidal") if kind == "positional" else None
    _PIECES[kind][name] = Piece(kind, name, piece, adds, needs)
    return piece


def ship(
    kind: str,
    name: str,
    piece: Any,
    *,
    adds: str | None = None,
    needs: Callable[[Any], str | None] | None = None,
) -> Any:
    """Register one of the library's pieces (kept for good: config files name it), as
    :data:`SHIPPED` lists it; ``piece`` None with ``adds``: positions added to the
    embeddings, no score hook."""
    if name not in SHIPPED[kind]:
        raise ValueError(f"{FIELDS[kind]}={name!r} is not in registry.SHIPPED[{kind!r}]")
    _PIECES[kind][name] = Piece(kind, name, piece, adds, needs, shipped=True)
    return piece


def names(kind: str) -> tuple[str, ...]:
    """The names registered for ``kind``, the library's first (none of its modules imported)."""
    return (*SHIPPED[kind], *(name for name in _PIECES[kind] if name not in SHIPPED[kind]))


def _pieces(kind: str) -> dict[str, Piece]:
    """Every piece of ``kind``, the library's first: the modules that ship them imported."""
    for module in dict.fromkeys(SHIPPED[kind].values()):
        importlib.import_module(module)
    shipped = {name: _PIECES[kind][name] for name in SHIPPED[kind]}
    return {**shipped, **_PIECES[kind]}


def named(config: TransformerConfig) -> dict[str, Piece]:
    """The piece of each kind that ``config`` names."""
    return {kind: _pieces(kind)[getattr(config, field)] for kind, field in FIELDS.items()}


def _given(kind: str, build: Any, config_piece: Piece) -> Piece:
    """The registered piece that ``build`` is (its first name), else ``build`` as an
    anonymous piece."""
    for piece in _pieces(kind).values():
        if piece.build is build:
            return piece
    name = getattr(build, "__name__", None) or type(build).__name__
    return Piece(kind, name, build, config_piece.adds, registered=False)


def resolve(config: TransformerConfig, given: Mapping[str, Any]) -> dict[str, Piece]:
    """The piece of each kind: the one ``given`` (by module attribute name, e.g.
    ``{'score_fn': rope}``; None: not given), else the one ``config`` names; checked
    (:func:`check`)."""
    pieces = named(config)
    for kind, attribute in ATTRIBUTES.items():
        if given.get(attribute) is not None:
            pieces[kind] = _given(kind, given[attribute], pieces[kind])
    check(config, pieces)
    return pieces


def check(config: TransformerConfig, pieces: Mapping[str, Piece]) -> None:
    """ValueError, in one line naming the piece, for the first piece whose needs ``config``
    does not meet: a score hook needs the reference attention (the fused ones compute the
    paper's scores), and each piece what it declared."""
    for piece in pieces.values():
        problem = piece.needs(config) if piece.needs is not None else None
        if piece.kind == "positional" and piece.build is not None:
            if config.attention_impl != "reference":
                problem = (
                    "changes the attention scores: it needs attention_impl='reference', got "
                    f"{config.attention_impl!r}"
                )
        if problem:
            raise ValueError(f"{piece.describe()} {problem}")
