"""Decoding throughput: greedy and beam search over the KV cache vs re-running the decoder.

* ``greedy (cached)`` and ``beam-k (cached)``: the decoding engineer's
  ``transformer_jax.inference.decoding.greedy_search`` / ``beam_search`` (one new position per step
  over the KV cache inside a jitted ``while_loop``).
* ``greedy (uncached)``: written here with the library's ``Transformer.decode``: each step
  re-runs the whole decoder over a ``[batch, new_tokens]`` buffer of the prefix (positions
  after the current one are PAD, hidden by the causal mask) and takes the logits of the
  current position. That is how a static-shape jitted decoder without a cache works; it
  does the full-width work at every step.

The model has the ``small`` training configuration and random weights; the EOS embedding
row is zeroed so that its (tied) logit is 0 and no hypothesis ends early: every run emits
exactly ``--new-tokens`` tokens per sentence. The encoder runs once per call in all three.
Times are per call (a batch of sentences), compilation excluded, median of ``--repeats``.

    python benchmarks/decode_throughput.py
    python benchmarks/decode_throughput.py --batch 32 --new-tokens 64 --beam 4 --json out.json
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import jax
import jax.numpy as jnp
import numpy as np
from _common import describe_machine, machine, summary, table, time_calls, write_json

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.data.tokenizer import BOS_ID, EOS_ID
from transformer_jax.inference.decoding import beam_search, greedy_search

SMALL = dict(
    vocab_size=8000, d_model=256, num_heads=4, d_ff=1024, num_encoder_layers=3, num_decoder_layers=3
)
TINY = dict(
    vocab_size=64, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1
)


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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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

    sizes = TINY if args.smoke else SMALL
    if args.smoke:
        args.batch, args.src_len, args.new_tokens, args.beam, args.repeats = 2, 4, 4, 2, 1
    config = TransformerConfig(**sizes, max_len=max(args.src_len, args.new_tokens))
    src = np.random.default_rng(0).integers(
        4, config.vocab_size, (args.batch, args.src_len), dtype=np.int32
    )
    src = jnp.asarray(src)
    params = jax.jit(Transformer(config).init)(jax.random.PRNGKey(0), src[:1], src[:1])["params"]
    embedding = params["shared_embed"]["embedding"]
    params["shared_embed"]["embedding"] = embedding.at[EOS_ID].set(0.0)  # no early EOS

    n = args.new_tokens
    methods = {
        "greedy (cached)": (1, lambda: greedy_search(config, params, src, max_len=n)),
        "greedy (uncached)": (1, lambda: uncached_greedy(config, params, src, n)),
        f"beam-{args.beam} (cached)": (
            args.beam,
            lambda: beam_search(config, params, src, beam_size=args.beam, max_len=n),
        ),
    }
    outputs = {name: np.asarray(fn()) for name, (_, fn) in methods.items()}  # compiles
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):  # interleaved: each method sees the same load
        for name, (_, fn) in methods.items():
            times[name] += time_calls(lambda fn=fn: jax.block_until_ready(fn()), 1)
    lengths = {name: int(np.count_nonzero(out != config.pad_id)) for name, out in outputs.items()}
    agree = float(np.mean(outputs["greedy (cached)"] == outputs["greedy (uncached)"]))

    results = []
    for name, (hypotheses, _) in methods.items():
        s = summary(times[name])
        tokens = args.batch * n
        results.append(
            {
                "method": name,
                "seconds": s,
                "output_tokens": lengths[name],
                "tokens_per_s": tokens / s["median"],
                "hypothesis_tokens_per_s": tokens * hypotheses / s["median"],
                "sentences_per_s": args.batch / s["median"],
            }
        )
    by_name = {r["method"]: r for r in results}
    cached, uncached = by_name["greedy (cached)"], by_name["greedy (uncached)"]
    beam = by_name[f"beam-{args.beam} (cached)"]
    speedup = uncached["seconds"]["median"] / cached["seconds"]["median"]
    beam_cost = cached["hypothesis_tokens_per_s"] / beam["hypothesis_tokens_per_s"]
    info = machine()
    payload = {
        "machine": info,
        "settings": {**vars(args), "model": sizes},
        "results": results,
        "cached_vs_uncached_greedy": speedup,
        "beam_time_per_hypothesis_token_vs_greedy": beam_cost,
        "greedy_cached_uncached_token_agreement": agree,
    }
    print(f"machine: {describe_machine(info)}")
    print(
        f"batch {args.batch} x {args.src_len} source tokens, {n} new tokens per sentence "
        "(EOS suppressed), small model, random weights"
    )
    print(
        table(
            ["method", "s/batch", "min-max", "tokens/s", "hypothesis tok/s", "sentences/s"],
            [
                [
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
    print(f"cached greedy is {speedup:.1f}x uncached (target >= 5x)")
    print(f"beam-{args.beam} time per hypothesis token = {beam_cost:.2f}x greedy's (target <= 2x)")
    print(f"cached and uncached greedy agree on {100 * agree:.1f}% of tokens")
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
