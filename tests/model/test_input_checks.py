"""Misused inputs are one-line errors where they enter, never NaN: ids outside the
vocabulary (eagerly, and under jit with checkify), masks that are not boolean of rank 4 or
do not fit, batches missing a key, ids outside the vocabulary in make_batch and in a prepared
split."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_CONFIG
from jax.experimental import checkify

import transformer_jax as tj
from transformer_jax.data.batching import EncodedPairs
from transformer_jax.data.prepared import check_vocabulary, open_split, write_split
from transformer_jax.data.sources import ReadCounts
from transformer_jax.model.attention import scaled_dot_product_attention

CFG = TINY_CONFIG.replace(dropout_rate=0.0)
SRC = jnp.array([[4, 5, 3, 0]], jnp.int32)
TGT = jnp.array([[2, 4, 5, 3]], jnp.int32)


@pytest.fixture(scope="module")
def params():
    return nn.unbox(tj.Transformer(CFG).init(jax.random.key(0), SRC, TGT)["params"])


def test_ids_outside_the_vocabulary_are_refused_eagerly(params):
    with pytest.raises(ValueError, match=r"src holds id 16 outside the vocabulary \[0, 16\)"):
        tj.Transformer(CFG).apply({"params": params}, SRC.at[0, 0].set(16), TGT)
    with pytest.raises(ValueError, match="tgt_in holds id -1 outside"):
        tj.Transformer(CFG).apply({"params": params}, SRC, TGT.at[0, 1].set(-1))
    with pytest.raises(ValueError, match="src holds id 16"):
        tj.decoding.greedy_search(CFG, params, SRC.at[0, 0].set(16))


def test_ids_outside_the_vocabulary_under_jit_with_check_ids(params):
    model = tj.Transformer(CFG, check_ids=True)
    apply = checkify.checkify(jax.jit(functools.partial(model.apply, {"params": params})))
    error, logits = apply(SRC, TGT)
    error.throw()  # in range: no error
    unchecked = tj.Transformer(CFG).apply({"params": params}, SRC, TGT)
    np.testing.assert_allclose(logits, unchecked, atol=1e-5)
    error, _ = apply(SRC, TGT.at[0, 2].set(99))
    with pytest.raises(checkify.JaxRuntimeError, match="tgt_in holds ids outside"):
        error.throw()


@pytest.mark.parametrize(
    "mask, message",
    [
        (jnp.ones((1, 1, 1, 4), jnp.float32), "must be boolean"),  # a 0/1 float mask
        (jnp.zeros((1, 1, 1, 4), jnp.float32), "must be boolean"),  # an additive mask
        (jnp.ones((1, 4), bool), "must be boolean .* of shape \\(1, 4\\)"),  # rank 2
        (jnp.ones((1, 1, 1, 5), bool), "its kv_len is 5"),  # wrong length
    ],
)
def test_masks_must_be_boolean_rank_4_and_fit(mask, message):
    q = jnp.ones((1, 3, 2, 8))
    kv = jnp.ones((1, 4, 2, 8))
    with pytest.raises(ValueError, match=message):
        scaled_dot_product_attention(q, kv, kv, mask)
    attention = tj.MultiHeadAttention(num_heads=2, qk_dim=4, v_dim=4)
    x = jnp.ones((1, 4, 8))
    with pytest.raises(ValueError, match=message.replace("kv_len is 5", "kv_len")):
        attention.init(jax.random.key(0), x, mask=mask)


def test_a_batch_missing_a_key_is_named(params):
    batch = tj.training.make_batch([[4, 5]], [[6, 7]])
    del batch["tgt_out"]
    model = tj.Transformer(CFG)
    with pytest.raises(
        ValueError, match=r"the batch has no 'tgt_out' \(it has \['src', 'tgt_in'\]\)"
    ):
        tj.training.eval_step(params, batch, model=model)


def test_make_batch_refuses_ids_outside_the_vocabulary():
    batch = tj.training.make_batch([[4, 15]], [[6, 7]], vocab_size=16)
    assert batch["src"].tolist() == [[4, 15, 3]]
    with pytest.raises(ValueError, match=r"src holds id 16 outside the vocabulary \[0, 16\)"):
        tj.training.make_batch([[4, 16]], [[6, 7]], vocab_size=16)
    with pytest.raises(ValueError, match="tgt_in holds id -2 outside the vocabulary"):
        tj.training.make_batch([[4]], [[-2, 7]])


def test_a_prepared_split_with_ids_outside_the_tokenizer_is_refused(tmp_path):
    encoded = EncodedPairs.from_lists([[4, 5]] * 3, [[6, 9]] * 3)
    path = str(tmp_path / "train-split")
    write_split(path, lambda done: [encoded][done:], ReadCounts(), 16)
    _, info = open_split(path)
    assert info["max_id"] == 9
    check_vocabulary(path, info, 10)
    with pytest.raises(ValueError, match=r"train-split holds id 9 outside .* \[0, 9\)"):
        check_vocabulary(path, info, 9)
