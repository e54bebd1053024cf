"""Decoding throughput: the generic searches over the KV cache, greedy over a log-softmax step,
and re-running the decoder without a cache.

* ``greedy (cached)`` and ``beam-k (cached)``: ``transformer_jax.inference.decoding``'s
  ``greedy_search`` / ``beam_search``, the generic searches of ``inference.search`` over
  the Transformer's step function (one new position per step over the KV cache inside a
  jitted ``while_loop``); greedy takes the argmax of the logits.
* ``greedy (log-softmax)``: the same search over a step that returns the log-softmax of
  the logits over the whole vocabulary at every step: what the argmax spares (its outputs
  are the same tokens).
* ``greedy (uncached)`` (``small`` only): written here with ``Transformer.decode``: each
  step re-runs the whole decoder over a ``[batch, new_tokens]`` buffer of the prefix
  (positions after the current one are PAD, hidden by the causal mask) and takes the
  logits of the current position, as a static-shape decoder without a cache does.

Models: the ``small`` and ``base`` training configurations with random weights; the EOS
embedding row is zeroed so that its (tied) logit is 0 and no hypothesis ends early: every
run emits exactly ``--new-tokens`` tokens per sentence. The encoder runs once per call,
and the encoder-decoder keys and values once per call (XLA hoists them out of the loop).
Times are per call (a batch of sentences), compilation excluded, median of ``--repeats``
interleaved calls.

    python benchmarks/decode_throughput.py
    python benchmarks/decode_throughput.py --configs small --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from _common import describe_machine, machine, summary, table, time_calls, write_json
from _throughput_settings import SETTINGS

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.ids import BOS_ID, EOS_ID
from transformer_jax.inference.decoding import beam_search, greedy_search, transformer_step
from transformer_jax.inference.search import greedy

CONFIGS = {
    "small": SETTINGS["small"].model,  # train_throughput.py's small model
    "base": dict(vocab_size=37000),  # the paper's base model (TransformerConfig's defaults)
    "tiny": dict(
        vocab_size=64, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1
    ),
}


@functools.partial(jax.jit, static_argnums=(0, 3))
def log_softmax_greedy(
    config: TransformerConfig, params: Any, src: jax.Array, new_tokens: int
) -> jax.Array:
    """Greedy search over a step that normalises the logits over the vocabulary first."""
    step, cache = transformer_step(config, params, src, new_tokens)

    def normalised(tokens: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        logits, cache = step(tokens, cache)
        return jax.nn.log_softmax(logits.at[..., config.pad_id].set(-jnp.inf)), cache

    return greedy(normalised, cache, src.shape[0], new_tokens, pad_id=config.pad_id)


@functools.partial(jax.jit, static_argnums=(0, 3))
def uncached_greedy(
    config: TransformerConfig, params: Any, src: jax.Array, new_tokens: int
) -> jax.Array:
    """Greedy decoding without a cache: the full decoder over the prefix buffer each step."""
    model = Transformer(config)
    variables = {"params": params}
    encoded = model.apply(variables, src, method="encode")
    batch = src.shape[0]
    pad = config.pad_id
    tokens = jnp.full((batch, new_tokens + 1), pad, jnp.int32).at[:, 0].set(BOS_ID)

    def step(t: Any, tokens: Any) -> Any:
        logits = model.apply(variables, encoded, src, tokens[:, :-1], method="decode")
        current = jax.lax.dynamic_index_in_dim(logits, t, axis=1, keepdims=False)
        current = current.at[:, pad].set(-jnp.inf)  # PAD is never predicted
        return tokens.at[:, t + 1].set(jnp.argmax(current, axis=-1).astype(jnp.int32))

    return jax.lax.fori_loop(0, new_tokens, step, tokens)[:, 1:]


def measure(name: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of one model configuration and its ratios."""
    config = TransformerConfig(
        **CONFIGS[name], dropout_rate=0.0, max_len=max(args.src_len, args.new_tokens)
    )
    src = np.random.default_rng(0).integers(
        4, config.vocab_size, (args.batch, args.src_len), dtype=np.int32
    )
    src = jnp.asarray(src)
    init = jax.jit(Transformer(config).init)
    params = nn.unbox(init(jax.random.PRNGKey(0), src[:1], src[:1])["params"])
    embedding = params["shared_embed"]["embedding"]
    params["shared_embed"]["embedding"] = embedding.at[EOS_ID].set(0.0)  # no early EOS

    n = args.new_tokens
    methods = {
        "greedy (cached)": (1, lambda: greedy_search(config, params, src, max_len=n)),
        "greedy (log-softmax)": (1, lambda: log_softmax_greedy(config, params, src, n)),
    }
    if name != "base":  # the full decoder at every step: minutes at base size
        methods["greedy (uncached)"] = (1, lambda: uncached_greedy(config, params, src, n))
    methods[f"beam-{args.beam} (cached)"] = (
        args.beam,
        lambda: beam_search(config, params, src, beam_size=args.beam, max_len=n),
    )
    outputs = {method: np.asarray(fn()) for method, (_, fn) in methods.items()}  # compiles
    times: dict[str, list[float]] = {method: [] for method in methods}
    for _ in range(args.repeats):  # interleaved: each method sees the same load
        for method, (_, fn) in methods.items():
            times[method] += time_calls(lambda fn=fn: jax.block_until_ready(fn()), 1)

    rows = []
    for method, (hypotheses, _) in methods.items():
        s = summary(times[method])
        tokens = args.batch * n
        rows.append(
            {
                "model": name,
                "method": method,
                "seconds": s,
                "output_tokens": int(np.count_nonzero(outputs[method] != config.pad_id)),
                "tokens_per_s": tokens / s["median"],
                "hypothesis_tokens_per_s": tokens * hypotheses / s["median"],
                "sentences_per_s": args.batch / s["median"],
            }
        )
    median = {r["method"]: r["seconds"]["median"] for r in rows}
    reference = outputs["greedy (cached)"]
    ratios = {
        "model": name,
        "greedy_vs_log_softmax_greedy": median["greedy (log-softmax)"] / median["greedy (cached)"],
        "beam_time_per_hypothesis_token_vs_greedy": median[f"beam-{args.beam} (cached)"]
        / (args.beam * median["greedy (cached)"]),
        "log_softmax_greedy_token_agreement": float(
            np.mean(outputs["greedy (log-softmax)"] == reference)
        ),
    }
    if "greedy (uncached)" in median:
        ratios["cached_vs_uncached_greedy"] = (
            median["greedy (uncached)"] / median["greedy (cached)"]
        )
        ratios["greedy_cached_uncached_token_agreement"] = float(
            np.mean(outputs["greedy (uncached)"] == reference)
        )
    return rows, ratios


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="small,base", help=f"of {sorted(CONFIGS)}")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=32, help="source tokens per sentence")
    parser.add_argument("--new-tokens", type=int, default=64, help="output tokens per sentence")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls of each method")
    parser.add_argument("--smoke", action="store_true", help="tiny model, one timed call")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    for name in ("batch", "src_len", "new_tokens", "beam", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    configs = args.configs.split(",")
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        raise ValueError(f"--configs: unknown {unknown}; choose from {sorted(CONFIGS)}")
    if args.smoke:
        configs = ["tiny"]
        args.batch, args.src_len, args.new_tokens, args.beam, args.repeats = 2, 4, 4, 2, 1

    info = machine()
    print(f"machine: {describe_machine(info)}")
    print(
        f"batch {args.batch} x {args.src_len} source tokens, {args.new_tokens} new tokens per "
        "sentence (EOS suppressed), random weights"
    )
    results, ratios = [], []
    for name in configs:
        rows, ratio = measure(name, args)
        results += rows
        ratios.append(ratio)
    print(
        table(
            ["model", "method", "s/batch", "min-max", "tokens/s", "hypothesis tok/s", "sent/s"],
            [
                [
                    r["model"],
                    r["method"],
                    r["seconds"]["median"],
                    f"{r['seconds']['min']:.3g}-{r['seconds']['max']:.3g}",
                    r["tokens_per_s"],
                    r["hypothesis_tokens_per_s"],
                    r["sentences_per_s"],
                ]
                for r in results
            ],
        )
    )
    for ratio in ratios:
        line = (
            f"{ratio['model']}: greedy (argmax) is {ratio['greedy_vs_log_softmax_greedy']:.2f}x "
            f"greedy with a log-softmax per step; beam-{args.beam} time per hypothesis token = "
            f"{ratio['beam_time_per_hypothesis_token_vs_greedy']:.2f}x greedy's"
        )
        if "cached_vs_uncached_greedy" in ratio:
            line += f"; cached greedy is {ratio['cached_vs_uncached_greedy']:.1f}x uncached"
        print(line)
    payload = {
        "machine": info,
        "settings": {**vars(args), "models": {c: CONFIGS[c] for c in configs}},
        "results": results,
        "ratios": ratios,
    }
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
