"""The GPU program, checked without a GPU: the paper's base model lowered for CUDA.

``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` builds the StableHLO module a
GPU would compile, on this CPU host, from abstract parameters (no weights are made). For
the forward pass, the full train step (``pmap`` and ``shard_map``) and beam search it
checks: the module lowers; it holds no ``optimization_barrier`` and none of the CPU
kernel set's constructs (threefry written out as shifts); float32 products say
``precision = [HIGHEST, HIGHEST]``; bfloat16 products take bfloat16 operands; cuDNN
attention is cuDNN's fused-attention custom calls, forward and backward. Every failure
message carries the module's op counts.

JAX asks the installed cuDNN for its version while tracing cuDNN attention; this host
has none, so the fixture ``cudnn`` reports version 9.10 (``check_cudnn_version``).
``pmap``'s ``lower`` takes no platforms: the fixture ``lowering_for`` makes the
``Traced.lower`` it calls lower for CUDA.
"""

import collections
import re

import flax.linen as nn
import jax
import jax._src.cudnn.fused_attention_stablehlo as cudnn_attention
import jax.numpy as jnp
import optax
import pytest
from jax._src import stages

from transformer_jax import Transformer, TransformerConfig
from transformer_jax.inference.decoding import beam_search
from transformer_jax.model import variants
from transformer_jax.training import steps
from transformer_jax.training.mesh import make_parallel

BATCH, LENGTH = 8, 64  # the train step's per-device batch; a multiple of 8 (cuDNN)
CUDNN_FORWARD, CUDNN_BACKWARD = "__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"

ARITHMETIC = {  # name: the base model's settings
    "float32": {},
    "bfloat16-compute": {"dtype": jnp.bfloat16},
    "bfloat16-products": {"matmul_precision": "bfloat16"},
}
IMPLS = ("reference", "fused", "cudnn")
MATRIX = [
    (a, impl) for a in ARITHMETIC for impl in IMPLS if not (a == "float32" and impl == "cudnn")
]


@pytest.fixture(scope="module")
def cudnn():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cudnn_attention, "check_cudnn_version", lambda: 91000)
        yield


@pytest.fixture
def lowering_for(monkeypatch):
    lower = stages.Traced.lower

    def patch(platform):
        def lower_for(self, *, lowering_platforms=None, **kwargs):
            return lower(self, lowering_platforms=lowering_platforms or (platform,), **kwargs)

        monkeypatch.setattr(stages.Traced, "lower", lower_for)

    return patch


def config(arithmetic, impl, platform="gpu"):
    return TransformerConfig(platform=platform, attention_impl=impl, **ARITHMETIC[arithmetic])


def abstract_params(cfg):
    tokens = jnp.zeros((1, 8), jnp.int32)
    init = lambda: Transformer(cfg).init(jax.random.key(0), tokens, tokens)["params"]  # noqa: E731
    return nn.unbox(jax.eval_shape(init))


def tokens(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.int32)


def lowered(f, *args, platform="cuda"):
    return jax.jit(f).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def op_counts(module):
    """How often each StableHLO op and custom-call target occurs in ``module``."""
    counts = collections.Counter(re.findall(r"\bstablehlo\.(\w+)", module))
    counts.update(f"custom_call @{t}" for t in re.findall(r"custom_call @([^\(\s]+)\(", module))
    return dict(sorted(counts.items()))


def check_gpu_module(module, cfg):
    """The assertions every GPU module must pass; returns its op counts."""
    counts = op_counts(module)
    summary = f"op counts: {counts}"
    assert counts.get("dot_general", 0) > 0, summary
    assert "optimization_barrier" not in counts, summary
    shifts = counts.get("shift_left", 0)  # JAX's threefry: 40 in the base train step
    assert shifts <= 100, f"threefry written out ({shifts} left shifts); {summary}"
    products = [line.strip() for line in module.splitlines() if "stablehlo.dot_general" in line]
    operands = [re.search(r": \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)", p) for p in products]
    bf16 = "lhs_precision_type = bf16, rhs_precision_type = bf16"  # a dot algorithm's rounding
    wide = [p for p, o in zip(products, operands, strict=True) if "f32" in o.groups()]
    wide = [p for p in wide if bf16 not in p]
    if cfg.matmul_precision == "float32":
        low = [p for p in wide if "precision = [HIGHEST, HIGHEST]" not in p]
        assert not low, f"{len(low)} float32 products below HIGHEST, e.g. {low[0]}; {summary}"
    if cfg.matmul_precision == "bfloat16" or cfg.dtype == jnp.bfloat16:
        assert not wide, f"{len(wide)} float32 products, e.g. {wide[0]}; {summary}"
    return counts


def check_attention(counts, cfg, backward):
    summary = f"op counts: {counts}"
    forward = counts.get(f"custom_call @{CUDNN_FORWARD}", 0)
    grads = counts.get(f"custom_call @{CUDNN_BACKWARD}", 0)
    calls = cfg.num_encoder_layers + 2 * cfg.num_decoder_layers  # self, self + cross
    if cfg.attention_impl == "cudnn":
        assert forward == calls, f"{forward} cuDNN attention calls, expected {calls}; {summary}"
        assert grads == (calls if backward else 0), f"{grads} backward calls; {summary}"
    else:
        assert forward == grads == 0, summary


def forward(cfg):
    model = Transformer(cfg)
    return lambda p, s, t: model.apply({"params": p}, s, t)


def train_module(cfg, kind, lowering_for):
    """The data-parallel train step of ``training.parallel`` (one device), lowered."""
    model = Transformer(cfg)
    params = abstract_params(cfg)
    tx = optax.adam(1e-3)
    state = jax.eval_shape(lambda p: steps.create_train_state(p, tx, jax.random.PRNGKey(0)), params)
    parallel = make_parallel(kind, model, 0.1, devices=jax.local_devices()[:1])
    program = parallel.step_program(state, BATCH, LENGTH)
    if kind == "pmap":  # pmap's lower traces for the patched platform
        lowering_for("cuda")
        return program.fn.lower(*program.args).as_text()
    return program.fn.trace(*program.args).lower(lowering_platforms=("cuda",)).as_text()


# -- the default suite: the paper's program and each construct once -----------------------
@pytest.mark.parametrize(
    "arithmetic,impl,kind",
    [
        ("float32", "reference", "pmap"),  # the paper's program
        ("bfloat16-products", "cudnn", "shard_map"),
    ],
)
def test_train_step_lowers_for_cuda(arithmetic, impl, kind, cudnn, lowering_for):
    cfg = config(arithmetic, impl)
    counts = check_gpu_module(train_module(cfg, kind, lowering_for), cfg)
    check_attention(counts, cfg, backward=True)


def test_forward_and_beam_search_lower_for_cuda(cudnn):
    cfg = config("bfloat16-products", "cudnn")
    params = abstract_params(cfg)
    counts = check_gpu_module(lowered(forward(cfg), params, tokens(8, 64), tokens(8, 64)), cfg)
    check_attention(counts, cfg, backward=False)
    cfg = config("float32", "reference")
    search = lambda p, s: beam_search(cfg, p, s, beam_size=4)  # noqa: E731
    check_gpu_module(lowered(search, abstract_params(cfg), tokens(4, 32)), cfg)


def test_a_smaller_target_vocabulary_lowers_for_cuda(lowering_for):
    cfg = config("float32", "reference").replace(tgt_vocab_size=5120)
    params = abstract_params(cfg)
    module = lowered(forward(cfg), params, tokens(8, 64), tokens(8, 64))
    check_gpu_module(module, cfg)
    assert "x5120xf32>" in module  # the logits over the first 5,120 pieces
    search = lambda p, s: beam_search(cfg, p, s, beam_size=4)  # noqa: E731
    check_gpu_module(lowered(search, params, tokens(4, 32)), cfg)
    check_gpu_module(train_module(cfg, "shard_map", lowering_for), cfg)


def test_word_dropout_lowers_for_cuda(lowering_for):
    cfg = config("float32", "reference").replace(word_dropout_rate=0.1)
    check_gpu_module(train_module(cfg, "shard_map", lowering_for), cfg)


def test_a_variant_lowers_for_cuda():
    """SwiGLU + RMSNorm + RoPE (module attributes): its gradient and beam search."""
    cfg = config("float32", "reference").replace(positional="none", num_decoder_layers=2)
    pieces = dict(ffn=variants.GatedFeedForward, norm=variants.rms_norm, score_fn=variants.rope)
    model = Transformer(cfg, **pieces)
    ids = jnp.zeros((1, 8), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids)["params"])

    def grads(p, s, t):
        return jax.grad(lambda p: model.apply({"params": p}, s, t).sum())(p)

    check_gpu_module(lowered(grads, params, tokens(8, 64), tokens(8, 64)), cfg)
    search = lambda p, s: beam_search(model, p, s, beam_size=4)  # noqa: E731
    check_gpu_module(lowered(search, params, tokens(4, 32)), cfg)


def test_the_cpu_kernel_set_is_what_the_gpu_check_catches():
    """The same check fails on the gradient of ``kernels='cpu'`` lowered for CUDA."""
    cfg = TransformerConfig(platform="gpu", kernels="cpu", num_encoder_layers=1)
    cfg = cfg.replace(num_decoder_layers=1)
    model = Transformer(cfg)

    def grads(p, s, t):
        rngs = {"dropout": jax.random.PRNGKey(0)}
        loss = lambda p: model.apply({"params": p}, s, t, deterministic=False, rngs=rngs).sum()  # noqa: E731
        return jax.grad(loss)(p)

    module = lowered(grads, abstract_params(cfg), tokens(8, 64), tokens(8, 64))
    with pytest.raises(AssertionError, match="optimization_barrier"):
        check_gpu_module(module, cfg)


# -- the whole matrix (slow) --------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("arithmetic,impl", MATRIX)
def test_every_setting_lowers_for_cuda(arithmetic, impl, cudnn, lowering_for):
    cfg = config(arithmetic, impl)
    params = abstract_params(cfg)
    counts = check_gpu_module(lowered(forward(cfg), params, tokens(8, 64), tokens(8, 64)), cfg)
    check_attention(counts, cfg, backward=False)
    search = lambda p, s: beam_search(cfg, p, s, beam_size=4)  # noqa: E731
    check_gpu_module(lowered(search, params, tokens(4, 32)), cfg)
    for kind in ("pmap", "shard_map"):
        counts = check_gpu_module(train_module(cfg, kind, lowering_for), cfg)
        check_attention(counts, cfg, backward=True)


@pytest.mark.slow
@pytest.mark.parametrize("arithmetic", list(ARITHMETIC))
def test_forward_and_beam_search_lower_for_tpu(arithmetic):
    cfg = config(arithmetic, "fused", platform="tpu")
    params = abstract_params(cfg)
    check_gpu_module(
        lowered(forward(cfg), params, tokens(8, 64), tokens(8, 64), platform="tpu"), cfg
    )
    search = lambda p, s: beam_search(cfg, p, s, beam_size=4)  # noqa: E731
    check_gpu_module(lowered(search, params, tokens(4, 32), platform="tpu"), cfg)
