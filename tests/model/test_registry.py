"""One route to a piece (``transformer_jax.model.registry``): a user's registered piece is a
config name like the library's (``--config.model.ffn=NAME`` from a config file that imports
the module registering it), given by name or by module it makes the same model and tree,
module arguments are checked by the rules of their registration, a registered score hook
declares whether it replaces the added positions, and a user's attention module keeps its
decoding cache with the shared helper (``attention.kv_cache``)."""

import functools
import os
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from conftest import ROOT, TINY_CONFIG

import transformer_jax as tj
from transformer_jax.cli.flags import define_config_flag, run_config
from transformer_jax.inference import decoding
from transformer_jax.model import registry, variants
from transformer_jax.training.schema import help_text
from transformer_jax.training.validation import validate_config

CFG = TINY_CONFIG.replace(
    vocab_size=11, dropout_rate=0.0, max_len=24, num_encoder_layers=1, num_decoder_layers=1
)
SRC = jnp.array([[4, 5, 4, 5, 3], [5, 4, 3, 0, 0]], jnp.int32)
TGT = jnp.array([[2, 4, 7, 9, 5, 3], [2, 10, 4, 4, 0, 0]], jnp.int32)


def init(model):
    return nn.unbox(jax.jit(model.init)(jax.random.key(0), SRC, TGT)["params"])


def shapes(params):
    return jax.tree.map(jnp.shape, params)


def cached_equals_full(model, params):
    full = model.apply({"params": params}, SRC, TGT)
    step, cache = decoding.transformer_step(model, params, SRC, TGT.shape[1])
    for i in range(TGT.shape[1]):
        logits, cache = step(TGT[:, i : i + 1], cache)
        real = np.asarray(TGT[:, i] != 0)
        np.testing.assert_allclose(logits[real, -1], full[real, i], atol=1e-5)


class Bilinear(nn.Module):  # a user's FFN: (x W) * (x V) W2, called as ffn(config, name='ffn')
    config: tj.TransformerConfig

    @nn.compact
    def __call__(self, x):
        dense = lambda n, name: nn.Dense(n, use_bias=False, name=name)  # noqa: E731
        w, v = dense(self.config.d_ff, "w")(x), dense(self.config.d_ff, "v")(x)
        return dense(x.shape[-1], "out")(w * v)


def test_a_registered_piece_is_a_name_and_the_same_model_as_its_module():
    registry.register("ffn", "test_bilinear", Bilinear)
    named = tj.Transformer(CFG.replace(ffn="test_bilinear"))
    params = init(named)
    assert set(params["encoder"]["layer_0"]["ffn"]) == {"w", "v", "out"}
    given = tj.Transformer(CFG, ffn=Bilinear)
    assert shapes(init(given)) == shapes(params)
    np.testing.assert_array_equal(
        given.apply({"params": params}, SRC, TGT), named.apply({"params": params}, SRC, TGT)
    )
    assert "test_bilinear" in registry.names("ffn") and "'test_bilinear')" in help_text()
    registry.register("ffn", "test_bilinear", Bilinear)  # again (a re-run cell): replaced


def test_train_config_names_a_piece_its_config_file_registers(tmp_path):
    """``train.py --config my_run.py --config.model.ffn=test_file_glu``: the config file
    imports the user's module, which registers the piece before the config is checked."""
    (tmp_path / "my_pieces.py").write_text(
        textwrap.dedent("""
        import functools
        import jax
        import transformer_jax as tj

        glu = functools.partial(tj.variants.GatedFeedForward, activation=jax.nn.sigmoid)
        tj.variants.register("ffn", "test_file_glu", glu)
        """)
    )
    (tmp_path / "my_run.py").write_text(
        textwrap.dedent("""
        import os, sys
        sys.path.insert(0, os.path.dirname(__file__))
        import my_pieces  # registers the ffn 'test_file_glu'
        from transformer_jax.configs.tiny import get_config
        """)
    )
    argv = ["train", f"--config={tmp_path / 'my_run.py'}", "--config.model.ffn=test_file_glu"]
    values = flags.FlagValues()
    define_config_flag(values, argv)
    values(argv)
    model = validate_config(run_config(values))
    assert model.ffn == "test_file_glu"
    tree = jax.eval_shape(tj.Transformer(model).init, jax.random.key(0), SRC, TGT)["params"]
    assert set(tree["decoder"]["layer_0"]["ffn"]) == {"gate", "value", "out"}


def test_a_norm_by_name_or_by_module_is_the_same_tree():
    """Sub-layer norms are the modules ``norm``, whichever piece makes them."""
    own = lambda config, name=None: nn.RMSNorm(epsilon=1e-6, name=name)  # noqa: E731
    named = init(tj.Transformer(CFG.replace(norm_type="rms")))
    assert set(named["encoder"]["layer_0"]["ffn_block"]) == {"norm"}
    assert shapes(init(tj.Transformer(CFG, norm=variants.rms_norm))) == shapes(named)
    assert shapes(init(tj.Transformer(CFG, norm=own))) == shapes(named)


def relative(q, k, where, dot):  # a user's score hook: ALiBi with one slope for every head
    distance = jnp.abs(where.q_positions[:, None, :, None] - where.kv_positions[:, None, None, :])
    return dot(q, k) - 0.5 * distance


def test_a_registered_score_hook_declares_whether_it_replaces_the_positions():
    params = init(tj.Transformer(CFG))
    replacing = registry.register("positional", "test_relative", relative)
    alongside = functools.partial(relative)
    registry.register("positional", "test_relative_too", alongside, replaces_positions=False)

    def logits(model):
        return model.apply({"params": params}, SRC, TGT)

    none_added = logits(tj.Transformer(CFG.replace(positional="none"), score_fn=relative))
    np.testing.assert_array_equal(logits(tj.Transformer(CFG, score_fn=replacing)), none_added)
    by_name = logits(tj.Transformer(CFG.replace(positional="test_relative")))
    np.testing.assert_array_equal(by_name, none_added)
    sinusoidal = logits(tj.Transformer(CFG, score_fn=lambda *a: relative(*a)))  # anonymous
    np.testing.assert_array_equal(logits(tj.Transformer(CFG, score_fn=alongside)), sinusoidal)
    assert np.abs(np.asarray(sinusoidal - none_added)).max() > 1e-3


class Thirds(Bilinear):  # a piece that needs d_ff to be a multiple of 3
    pass


def thirds(config):
    return None if config.d_ff % 3 == 0 else f"needs d_ff % 3 == 0, got {config.d_ff}"


def test_a_declared_need_is_checked_for_the_name_and_the_module():
    registry.register("ffn", "test_thirds", Thirds, needs=thirds)
    with pytest.raises(ValueError, match=r"^ffn='test_thirds' needs d_ff % 3 == 0, got 32"):
        CFG.replace(ffn="test_thirds")
    with pytest.raises(ValueError, match=r"^ffn='test_thirds' needs d_ff % 3 == 0, got 32"):
        tj.Transformer(CFG, ffn=Thirds).init(jax.random.key(0), SRC, TGT)
    assert CFG.replace(d_ff=33, ffn="test_thirds").ffn == "test_thirds"


@pytest.mark.parametrize(
    "args, match",
    [
        (("activation", "relu", Bilinear), "kind must be one of"),
        (("ffn", "relu", Bilinear), "ffn='relu' is the library's"),
        (("ffn", "my-ffn", Bilinear), "must be an identifier"),
        (("norm", "test_nothing", 3), "must be callable"),
    ],
)
def test_a_bad_registration_is_one_line(args, match):
    with pytest.raises(ValueError, match=match):
        registry.register(*args)


class SharedKeyValue(nn.Module):  # a user's multi-query attention: one K/V head for all
    config: tj.TransformerConfig
    causal: bool = False
    decode: bool = False
    score_fn: object = None

    @nn.compact
    def __call__(self, x, kv=None, mask=None, deterministic=True, where=None):
        cfg, kv = self.config, x if kv is None else kv
        dense = functools.partial(nn.DenseGeneral, use_bias=False)
        q = dense((cfg.num_heads, cfg.head_qk_dim), name="query")(x)
        k = dense((1, cfg.head_qk_dim), name="key")(kv)
        v = dense((1, cfg.head_v_dim), name="value")(kv)
        if self.decode:  # the cache any attention module keeps
            k, v, mask, where = tj.attention.kv_cache(self, k, v, mask, where)
        causal = self.causal and not self.decode
        out = tj.attention.scaled_dot_product_attention(q, k, v, mask, is_causal=causal)
        return dense(x.shape[-1], axis=(-2, -1), name="out")(out)


def test_a_users_attention_module_decodes_over_the_shared_cache():
    """A user's multi-query attention in a dozen lines, registered: by name it is the shipped
    ``'multi_query'`` model (same tree, same logits), and decodes from its cache."""
    registry.register("attention", "test_shared_kv", SharedKeyValue)
    model = tj.Transformer(CFG.replace(attention="test_shared_kv"))
    params = init(model)
    shipped = tj.Transformer(CFG.replace(attention="multi_query"))
    assert shapes(init(shipped)) == shapes(params)
    np.testing.assert_allclose(
        model.apply({"params": params}, SRC, TGT),
        shipped.apply({"params": params}, SRC, TGT),
        atol=1e-6,
    )
    cached_equals_full(model, params)


def test_the_shipped_table_is_what_the_modules_ship():
    """``registry.SHIPPED`` (the names a config is checked against without Flax) lists each
    library piece in the module that ships it, and only those."""
    for kind, names in registry.SHIPPED.items():
        pieces = registry._pieces(kind)
        shipped = {name: piece.build for name, piece in pieces.items() if piece.shipped}
        assert tuple(shipped) == tuple(names), kind
        assert registry.names(kind)[: len(names)] == tuple(names)
    assert registry.SHIPPED["ffn"]["swiglu"] == variants.__name__
    with pytest.raises(ValueError, match=r"ffn='mine' is not in registry.SHIPPED\['ffn'\]"):
        registry.ship("ffn", "mine", variants.GatedFeedForward)


def test_config_names_are_checked_without_importing_flax():
    """A config's piece and dtype names are checked with the model's modules unimported (a
    command's config checks come before the library); making the config imports them."""
    code = textwrap.dedent(
        """
        import sys
        from transformer_jax.fields import check_values
        from transformer_jax.model.config import TransformerConfig
        from transformer_jax.model.registry import names
        good = {"ffn": "swiglu", "positional": "rope", "dtype": "bfloat16"}
        check_values(TransformerConfig, good)
        for bad in ({"ffn": "swish"}, {"dtype": "float64"}):
            try:
                check_values(TransformerConfig, bad)
            except ValueError as e:
                print(e)
        print(names("ffn"), sorted(m for m in ("jax", "flax") if m in sys.modules))
        config = TransformerConfig(positional="rope", dtype="bfloat16")
        import jax.numpy as jnp
        print(config.dtype is jnp.bfloat16, "transformer_jax.model.variants" in sys.modules)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "ffn must be one of ('relu', 'gelu', 'glu', 'geglu', 'swiglu'), got 'swish'",
        "dtype must be one of ('float32', 'bfloat16', 'float16'), got 'float64'",
        "('relu', 'gelu', 'glu', 'geglu', 'swiglu') []",
        "True True",
    ]
