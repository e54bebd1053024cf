"""``torch.nn.Transformer`` state dicts to and from the model's parameters.

:func:`from_torch` reads the state dict of ``nn.Transformer(..., batch_first=True)``, post-LN
(``norm_first=False``) or pre-LN (``norm_first=True``), with ReLU feed-forward layers (torch
tensors or numpy arrays; torch is not imported), and gives ``(config, params)`` for
:class:`~transformer_jax.model.transformer.Transformer`: ``attention_bias`` / ``ffn_bias``
(torch's ``bias``), ``final_norm=True`` (torch's ``encoder.norm`` / ``decoder.norm``) and
``layer_norm_eps`` (torch's 1e-5). Per layer: ``self_attn`` / ``multihead_attn``
``in_proj_*`` -> ``query`` / ``key`` / ``value``, ``out_proj`` -> ``out``, ``linear1`` /
``linear2`` -> ``ffn/w1`` / ``ffn/w2``, ``norm1..3`` -> the sub-layers' ``norm``.

``nn.Transformer`` has no embeddings, positions nor output projection: the user's
``nn.Embedding`` weights are given as ``src_embedding`` (also the target's when shared) and
``tgt_embedding``, an ``nn.Linear(d_model, vocab)`` as ``output_weight`` / ``output_bias``
(an untied output); what is not given stays initialised (``seed``). The model multiplies
embeddings by sqrt(d_model) and adds ``config.positional`` positions; a torch model that does
otherwise is fed its own embeddings (``src_embeds`` / ``tgt_embeds``, ``positional='none'``).
:func:`to_torch` is the inverse, for ``nn.Transformer(**torch_options(config))``, and
:func:`embeddings` gives the arrays kept outside it. What cannot map (another activation,
norm_first or eps than the config's, shapes, unknown keys) is refused with one line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from transformer_jax.model import registry
from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.transformer import Transformer

__all__ = ["embeddings", "from_torch", "to_torch", "torch_options"]


class Entry(NamedTuple):
    """One torch array (or one of the three parts of an ``in_proj``) and its parameter."""

    torch_key: str
    part: int | None  # 0, 1, 2: the query, key, value rows of an in_proj; None: the whole
    path: tuple[str, ...]  # the parameter's path, layers unrolled (layer_{i})
    kind: str  # how the layouts differ: see _to_ours


def _layer_entries(stack: str, i: int, attentions: Any, norms: Any) -> Iterator[Entry]:
    torch, ours = f"{stack}.layers.{i}.", (stack, f"layer_{i}")
    for torch_attention, attention in attentions:
        prefix, at = torch + torch_attention, (*ours, attention)
        for part, projection in enumerate(("query", "key", "value")):
            yield Entry(f"{prefix}.in_proj_weight", part, (*at, projection, "kernel"), "heads_in")
            yield Entry(f"{prefix}.in_proj_bias", part, (*at, projection, "bias"), "heads_bias")
        yield Entry(f"{prefix}.out_proj.weight", None, (*at, "out", "kernel"), "heads_out")
        yield Entry(f"{prefix}.out_proj.bias", None, (*at, "out", "bias"), "same")
    for linear, w in (("linear1", "w1"), ("linear2", "w2")):
        yield Entry(f"{torch}{linear}.weight", None, (*ours, "ffn", w, "kernel"), "dense")
        yield Entry(f"{torch}{linear}.bias", None, (*ours, "ffn", w, "bias"), "same")
    for norm, block in norms:
        yield Entry(f"{torch}{norm}.weight", None, (*ours, block, "norm", "scale"), "same")
        yield Entry(f"{torch}{norm}.bias", None, (*ours, block, "norm", "bias"), "same")


def _final_norm(stack: str) -> list[Entry]:
    path = (stack, "final_norm")
    return [
        Entry(f"{stack}.norm.weight", None, (*path, "scale"), "same"),
        Entry(f"{stack}.norm.bias", None, (*path, "bias"), "same"),
    ]


def entries(config: TransformerConfig) -> list[Entry]:
    """Every array of ``nn.Transformer(**torch_options(config))``'s state dict, in order."""
    found = []
    for i in range(config.num_encoder_layers):
        norms = (("norm1", "attention_block"), ("norm2", "ffn_block"))
        found += _layer_entries("encoder", i, (("self_attn", "self_attention"),), norms)
    found += _final_norm("encoder") if config.uses_final_norm else []
    for i in range(config.num_decoder_layers):
        attentions = (("self_attn", "self_attention"), ("multihead_attn", "cross_attention"))
        norms = (
            ("norm1", "self_attention_block"),
            ("norm2", "cross_attention_block"),
            ("norm3", "ffn_block"),
        )
        found += _layer_entries("decoder", i, attentions, norms)
    return found + (_final_norm("decoder") if config.uses_final_norm else [])


def outside_entries(config: TransformerConfig) -> list[Entry]:
    """The arrays a torch model keeps outside ``nn.Transformer``, keyed as
    :func:`from_torch`'s arguments."""
    src = "shared_embed" if config.share_embeddings else "src_embed"
    found = [Entry("src_embedding", None, (src, "embedding"), "same")]
    if not config.share_embeddings:
        found.append(Entry("tgt_embedding", None, ("tgt_embed", "embedding"), "same"))
    if not config.tie_output:
        found.append(Entry("output_weight", None, ("decoder", "logits", "kernel"), "dense"))
        found.append(Entry("output_bias", None, ("decoder", "logits", "bias"), "same"))
    return found


def _to_ours(array: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """A torch array in the layout of a parameter of ``shape``: Linear weights are
    ``[out, in]`` (Flax kernels ``[in, out]``), attention splits ``d_model`` into heads."""
    if kind in ("dense", "heads_in", "heads_out"):
        array = array.T
    return array.reshape(shape)


def _to_torch(array: np.ndarray, kind: str) -> np.ndarray:
    if kind == "dense":
        return array.T
    if kind == "heads_in":  # [d_model, heads, d_k] -> [heads * d_k, d_model]
        return array.reshape(array.shape[0], -1).T
    if kind == "heads_out":  # [heads, d_v, d_model] -> [d_model, heads * d_v]
        return array.reshape(-1, array.shape[-1]).T
    return array.reshape(-1) if kind == "heads_bias" else array


def _numpy(value: Any) -> np.ndarray:
    """A torch tensor (any device or float dtype) or array-like as a float32 numpy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, np.float32)


def _layer_index(path: tuple[str, ...], scanned: bool) -> tuple[tuple[str, ...], int | None]:
    """The path in the parameter tree and the layer's index on its leading axis when the
    layers are scanned (``config.scan_layers``: stacked under ``layers``)."""
    if scanned and len(path) > 1 and path[1].startswith("layer_"):
        return (path[0], "layers", *path[2:]), int(path[1][len("layer_") :])
    return path, None


def torch_options(config: TransformerConfig) -> dict[str, Any]:
    """The ``torch.nn.Transformer`` keyword arguments of the model ``config`` describes
    (biases on: absent ones are exported as zeros)."""
    return dict(
        d_model=config.d_model,
        nhead=config.num_heads,
        num_encoder_layers=config.num_encoder_layers,
        num_decoder_layers=config.num_decoder_layers,
        dim_feedforward=config.d_ff,
        dropout=config.dropout_rate,
        layer_norm_eps=config.layer_norm_eps,
        batch_first=True,
        norm_first=config.norm == "pre",
        bias=True,
    )


def infer_config(
    arrays: Mapping[str, np.ndarray],
    nhead: int | None,
    vocab_size: int | None,
    norm_first: bool,
    layer_norm_eps: float,
    outside: Mapping[str, np.ndarray],
) -> TransformerConfig:
    """The config of a state dict's ``nn.Transformer`` (the head count and, without
    embeddings or an output projection, the vocabulary size are not in it)."""
    if nhead is None:
        raise ValueError("from_torch needs nhead (or a config): a state dict does not record it")
    layers = {
        stack: len({k.split(".")[2] for k in arrays if k.startswith(f"{stack}.layers.")})
        for stack in ("encoder", "decoder")
    }
    stack = "encoder" if layers["encoder"] else "decoder"
    if not layers[stack]:
        raise ValueError("the state dict holds no encoder.layers.* or decoder.layers.* arrays")
    if f"{stack}.layers.0.linear1.weight" not in arrays:
        raise ValueError(f"the state dict lacks {stack}.layers.0.linear1.weight")
    d_ff, d_model = arrays[f"{stack}.layers.0.linear1.weight"].shape
    src, tgt, out = (outside.get(k) for k in ("src_embedding", "tgt_embedding", "output_weight"))
    tgt_rows = [len(a) for a in (out, tgt) if a is not None]
    src_vocab = len(src) if src is not None else vocab_size or (tgt_rows or [None])[0]
    if src_vocab is None:
        raise ValueError(
            "from_torch needs vocab_size (or src_embedding / output_weight, or a config)"
        )
    tgt_vocab = (tgt_rows or [src_vocab])[0]
    return TransformerConfig(
        vocab_size=src_vocab,
        tgt_vocab_size=tgt_vocab if tgt_vocab != src_vocab else None,
        d_model=d_model,
        num_heads=nhead,
        d_ff=d_ff,
        num_encoder_layers=layers["encoder"],
        num_decoder_layers=layers["decoder"],
        norm="pre" if norm_first else "post",
        final_norm="encoder.norm.weight" in arrays or "decoder.norm.weight" in arrays,
        layer_norm_eps=layer_norm_eps,
        attention_bias=f"{stack}.layers.0.self_attn.in_proj_bias" in arrays,
        ffn_bias=f"{stack}.layers.0.linear1.bias" in arrays,
        share_embeddings="tgt_embedding" not in outside,
        tie_output="output_weight" not in outside,
    )


def check_config(
    config: TransformerConfig, activation: str, norm_first: bool, layer_norm_eps: float
) -> None:
    """Refuse, in one line, what ``nn.Transformer`` cannot be for ``config``."""
    if activation != "relu":
        raise ValueError(
            f"activation={activation!r} does not map: the model's FeedForward is ReLU (Eq. 2)"
        )
    if norm_first != (config.norm == "pre"):
        raise ValueError(f"norm_first={norm_first} does not match config.norm={config.norm!r}")
    if layer_norm_eps != config.layer_norm_eps:
        raise ValueError(
            f"layer_norm_eps={layer_norm_eps} does not match config.layer_norm_eps="
            f"{config.layer_norm_eps}"
        )
    if not config.uses_final_norm:
        raise ValueError("nn.Transformer ends each stack in a LayerNorm: set final_norm=True")
    for kind, piece in registry.named(config).items():  # positions are added outside it
        paper = TransformerConfig.__dataclass_fields__[registry.FIELDS[kind]].default
        if piece.build is not None if kind == "positional" else piece.name != paper:
            raise ValueError(f"nn.Transformer has the paper's pieces, not {piece.describe()}")
    if config.head_qk_dim * config.num_heads != config.d_model or config.qk_dim != config.v_dim:
        raise ValueError("nn.Transformer's heads are d_model / nhead wide: unset qk_dim, v_dim")


def from_torch(
    state_dict: Mapping[str, Any],
    config: TransformerConfig | None = None,
    *,
    nhead: int | None = None,
    vocab_size: int | None = None,
    norm_first: bool = False,
    activation: str = "relu",
    layer_norm_eps: float = 1e-5,
    seed: int = 0,
    **outside: Any,
) -> tuple[TransformerConfig, Any]:
    """``(config, params)`` of an ``nn.Transformer`` state dict (module doc).

    ``config``: checked against the state dict; ``None``: read from it (with ``nhead``, and
    ``vocab_size`` when no embedding or output projection is given). ``norm_first``,
    ``activation``, ``layer_norm_eps``: as given to ``nn.Transformer`` (a state dict does
    not record them). ``outside``: ``src_embedding``, ``tgt_embedding`` ``[vocab, d_model]``,
    ``output_weight`` ``[vocab, d_model]``, ``output_bias`` ``[vocab]``.
    """
    arrays = {key: _numpy(value) for key, value in state_dict.items()}
    given = {key: _numpy(value) for key, value in outside.items() if value is not None}
    if config is None:
        config = infer_config(arrays, nhead, vocab_size, norm_first, layer_norm_eps, given)
    if nhead not in (None, config.num_heads):
        raise ValueError(f"nhead={nhead} does not match config.num_heads={config.num_heads}")
    check_config(config, activation, norm_first, layer_norm_eps)
    known = {e.torch_key for e in outside_entries(config)}
    if set(given) - known:
        raise ValueError(
            f"from_torch got {sorted(set(given) - known)}; with this config it takes "
            f"{sorted(known)} (share_embeddings / tie_output leave out the others)"
        )
    tokens = jnp.zeros((1, 1), jnp.int32)
    init = jax.jit(Transformer(config).init)(jax.random.key(seed), tokens, tokens)["params"]
    init = nn.unbox(init)
    flat = {k: np.array(v) for k, v in traverse_util.flatten_dict(init).items()}
    used = set()
    for source, found in ((arrays, entries(config)), (given, outside_entries(config))):
        for entry in found:
            if entry.torch_key not in source:
                if entry.torch_key.endswith("bias") or source is given:
                    continue  # no bias is a zero bias (as initialised); no embedding: initialised
                raise ValueError(f"the state dict lacks {entry.torch_key}")
            used.add(entry.torch_key)
            array = source[entry.torch_key]
            if entry.part is not None:
                if len(array) % 3:
                    raise ValueError(f"{entry.torch_key} of shape {array.shape}: not 3 equal parts")
                array = np.split(array, 3)[entry.part]
            _store(flat, entry, array, config.scan_layers)
    unused = sorted(set(arrays) - used)
    if unused:
        raise ValueError(f"state dict entries that do not map: {unused[:4]}")
    params = traverse_util.unflatten_dict(flat)
    return config, jax.tree.map(lambda p, i: jnp.asarray(p, i.dtype), params, init)


def _store(flat: dict, entry: Entry, array: np.ndarray, scanned: bool) -> None:
    """Write one torch array into the flat parameters, in their layout; a torch bias the
    config has none for must be zero."""
    path, layer = _layer_index(entry.path, scanned)
    if path not in flat:
        if np.any(array):
            flag = "attention_bias" if "attention" in entry.path[2] else "ffn_bias"
            raise ValueError(f"{entry.torch_key} is not zero: the config needs {flag}=True")
        return
    target = flat[path] if layer is None else flat[path][layer]
    try:
        value = _to_ours(array, entry.kind, target.shape)
    except ValueError:
        value = None
    if value is None or _to_torch(value, entry.kind).shape != array.shape:
        raise ValueError(
            f"{entry.torch_key} of shape {array.shape} does not fit the config's "
            f"{'/'.join(entry.path)} {target.shape}"
        )
    if layer is None:
        flat[path] = value
    else:
        flat[path][layer] = value


def _arrays(params: Any, config: TransformerConfig, found: list[Entry]) -> dict[str, np.ndarray]:
    """The torch arrays of ``found`` from ``params``: in_proj parts joined, the biases the
    config has none for as zeros."""
    flat = traverse_util.flatten_dict(jax.device_get(nn.unbox(params)))  # boxed or plain
    parts: dict[str, list[np.ndarray]] = {}
    out = {}
    for entry in found:
        path, layer = _layer_index(entry.path, config.scan_layers)
        if path in flat:
            value = np.asarray(flat[path] if layer is None else flat[path][layer], np.float32)
            value = _to_torch(value, entry.kind)
        else:  # a bias the config has none for: the rows of the weight before it
            weight = entry.torch_key[: -len("bias")] + "weight"
            rows = (parts[weight][entry.part] if entry.part is not None else out[weight]).shape[0]
            value = np.zeros(rows, np.float32)
        if entry.part is None:
            out[entry.torch_key] = value
        else:
            parts.setdefault(entry.torch_key, []).append(value)
            if len(parts[entry.torch_key]) == 3:
                out[entry.torch_key] = np.concatenate(parts[entry.torch_key])
    return out


def to_torch(params: Any, config: TransformerConfig, numpy: bool = False) -> dict[str, Any]:
    """The state dict of ``nn.Transformer(**torch_options(config))`` holding ``params``:
    torch tensors (``numpy=True``: float32 numpy arrays, without torch)."""
    check_config(config, "relu", config.norm == "pre", config.layer_norm_eps)
    state = _arrays(params, config, entries(config))
    if numpy:
        return state
    import torch

    return {key: torch.from_numpy(np.array(value)) for key, value in state.items()}


def embeddings(params: Any, config: TransformerConfig) -> dict[str, np.ndarray]:
    """The arrays a torch model keeps outside ``nn.Transformer`` (embedding tables, the untied
    output projection ``nn.Linear``'s weight and bias), in torch layouts, keyed as
    :func:`from_torch`'s arguments."""
    return _arrays(params, config, outside_entries(config))
