"""Token-budget batching: budget, coverage, over-length counts, packing, resume, pipeline."""

import collections
import dataclasses
import os

import numpy as np
import pytest
from conftest import TINY_CONFIG

from transformer_jax.data import batching, grouping, pipeline, preparation
from transformer_jax.data.batching import Batcher, EncodedPairs, TrainIterator, eval_batches
from transformer_jax.data.config import DataConfig
from transformer_jax.data.synthetic import synthetic_pairs
from transformer_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

MAX_LEN = 32


def random_pairs(n=600, seed=0, longest=40):
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 50, rng.integers(1, longest)).tolist() for _ in range(n)]
    tgt = [rng.integers(4, 50, rng.integers(1, longest)).tolist() for _ in range(n)]
    return EncodedPairs.from_lists(src, tgt)


def unpack(batch):
    """(source ids, target ids) of every pair in a batch, checking the layout on the way."""
    found = []
    for r in range(batch["src"].shape[0]):
        if "src_segments" in batch:
            segments = sorted(set(batch["src_segments"][r]) - {0})
            assert segments == sorted(set(batch["tgt_segments"][r]) - {0})
            assert segments == list(range(1, len(segments) + 1))
            parts = [
                (batch["src_segments"][r] == s, batch["tgt_segments"][r] == s) for s in segments
            ]
            for key in ("src", "tgt_in", "tgt_out"):  # padding exactly where segment is 0
                seg = batch[key[:3] + "_segments"][r]
                assert ((batch[key][r] == PAD_ID) == (seg == 0)).all()
        else:
            parts = [(batch["src"][r] != PAD_ID, batch["tgt_out"][r] != PAD_ID)]
        for src_mask, tgt_mask in parts:
            if not src_mask.any():
                assert not tgt_mask.any()  # an empty row
                continue
            src, tgt_in, tgt_out = (
                batch["src"][r][src_mask],
                batch["tgt_in"][r][tgt_mask],
                batch["tgt_out"][r][tgt_mask],
            )
            assert src[-1] == EOS_ID and tgt_out[-1] == EOS_ID and tgt_in[0] == BOS_ID
            assert (tgt_in[1:] == tgt_out[:-1]).all()
            if "src_positions" in batch:  # positions restart at 0 in every segment
                assert (batch["src_positions"][r][src_mask] == np.arange(len(src))).all()
                assert (batch["tgt_positions"][r][tgt_mask] == np.arange(len(tgt_in))).all()
            found.append((tuple(src[:-1]), tuple(tgt_out[:-1])))
    return found


def expected(pairs, max_len=MAX_LEN):
    all_pairs = [(tuple(pairs.source(i)), tuple(pairs.target(i))) for i in range(len(pairs))]
    return collections.Counter(p for p in all_pairs if max(len(p[0]), len(p[1])) + 1 <= max_len)


@pytest.mark.parametrize("packing", [False, True])
def test_one_epoch_has_every_pair_once_within_budget(packing):
    pairs = random_pairs()
    batcher = Batcher(pairs, tokens_per_batch=512, max_len=MAX_LEN, packing=packing, num_shards=4)
    iterator = TrainIterator(batcher, seed=1)
    plan = iterator.epoch_plan(0)  # packing: planned whole here, one batch at a time below
    n = len(plan)
    seen, shapes = collections.Counter(), set()
    for planned in plan:
        batch = next(iterator)
        np.testing.assert_array_equal(batch["src"], batcher.fill(planned)["src"])
        shapes.add(batch["src"].shape)
        for key, value in batch.items():
            assert value.dtype == np.int32 and value.shape == batch["src"].shape, key
        rows, length = batch["src"].shape
        assert rows * length <= 512 and rows % 4 == 0 and length <= MAX_LEN
        seen.update(unpack(batch))
    assert seen == expected(pairs)
    stats = iterator.stats()
    end = {"pair": stats["pairs"]} if packing else {}
    assert iterator.get_state() == {"epoch": 0, "index": n, **end}
    assert stats["batches_per_epoch"] == (None if packing else n)
    assert len(shapes) <= len(grouping.bucket_lengths(MAX_LEN))
    assert stats["dropped_too_long"] == len(pairs) - sum(expected(pairs).values()) > 0
    assert stats["pairs"] == sum(expected(pairs).values())
    assert 0.3 < stats["padding_efficiency"] <= 1.0
    if packing:
        assert shapes == {(16, MAX_LEN)}


def test_epochs_reshuffle_deterministically():
    pairs = random_pairs()
    make = lambda seed: TrainIterator(Batcher(pairs, tokens_per_batch=512, max_len=MAX_LEN), seed)
    a, b, c = make(0), make(0), make(1)
    first = [next(a)["src"] for _ in range(a.stats()["batches_per_epoch"])]
    assert all((x == next(b)["src"]).all() for x in first)
    assert any(x.shape != next(c)["src"].shape or (x != next(c)["src"]).any() for x in first)
    second = next(a)  # epoch 1 starts with a different order
    assert a.get_state() == {"epoch": 1, "index": 1}
    assert second["src"].shape != first[0].shape or (second["src"] != first[0]).any()


@pytest.mark.parametrize("packing", [False, True])
def test_resume_yields_the_same_batches(packing):
    pairs = random_pairs(300)
    batcher = Batcher(pairs, tokens_per_batch=256, max_len=MAX_LEN, packing=packing)
    run = TrainIterator(batcher, seed=5)
    per_epoch = len(run.epoch_plan(0))
    for _ in range(per_epoch - 2):
        next(run)
    state = run.get_state()
    assert all(type(v) is int for v in state.values())
    resumed = TrainIterator(
        Batcher(pairs, tokens_per_batch=256, max_len=MAX_LEN, packing=packing), seed=5
    )
    resumed.set_state(state)
    for _ in range(5):  # across the epoch boundary
        expected_batch, batch = next(run), next(resumed)
        assert expected_batch.keys() == batch.keys()
        for key in batch:
            np.testing.assert_array_equal(batch[key], expected_batch[key])
    with pytest.raises(ValueError, match="state"):
        resumed.set_state({"epoch": 0, "index": per_epoch + 1, "pair": len(batcher.kept) + 1})
    if packing:  # a state without the pair resumes only where an epoch starts
        resumed.set_state({"epoch": 1, "index": 0})
        assert resumed.get_state() == {"epoch": 1, "index": 0, "pair": 0}
        with pytest.raises(ValueError, match="has no 'pair'"):
            resumed.set_state({"epoch": 1, "index": 3})


def test_processes_split_rows_of_the_same_global_batch():
    pairs = random_pairs(300)
    make = lambda p: Batcher(
        pairs, tokens_per_batch=512, max_len=MAX_LEN, num_shards=4, process_index=p, process_count=2
    )
    whole = Batcher(pairs, tokens_per_batch=512, max_len=MAX_LEN, num_shards=4)
    for planned in whole.plan(whole.kept):
        parts = [make(p).fill(planned) for p in range(2)]
        full = whole.fill(planned)
        np.testing.assert_array_equal(np.concatenate([p["src"] for p in parts]), full["src"])
    with pytest.raises(ValueError, match="process_count"):
        Batcher(pairs, tokens_per_batch=512, max_len=MAX_LEN, num_shards=3, process_count=2)


def test_eval_batches_are_deterministic_and_complete():
    pairs = random_pairs(400)
    batcher = Batcher(pairs, tokens_per_batch=512, max_len=MAX_LEN, num_shards=2)
    batches = eval_batches(batcher)
    again = eval_batches(Batcher(pairs, tokens_per_batch=512, max_len=MAX_LEN, num_shards=2))
    assert all((a["tgt_out"] == b["tgt_out"]).all() for a, b in zip(batches, again, strict=True))
    seen = collections.Counter(p for b in batches for p in unpack(b))
    assert seen == expected(pairs)
    assert batcher.dropped_too_long == len(pairs) - sum(seen.values())


def test_packing_pads_less_than_bucketing():
    pairs = random_pairs(longest=12)
    efficiency = {}
    for packing in (False, True):
        iterator = TrainIterator(
            Batcher(pairs, tokens_per_batch=512, max_len=MAX_LEN, packing=packing)
        )
        for _ in range(len(iterator.epoch_plan(0))):
            next(iterator)
        efficiency[packing] = iterator.stats()["padding_efficiency"]
    assert efficiency[True] > 0.8 and efficiency[True] > efficiency[False]


def test_padding_efficiency_value():
    batch = {
        "src": np.array([[5, 6, EOS_ID, 0], [7, EOS_ID, 0, 0]], np.int32),
        "tgt_out": np.array([[8, EOS_ID, 0, 0], [0, 0, 0, 0]], np.int32),
    }
    assert batching.padding_efficiency(batch) == 7 / 16


def test_budget_errors():
    with pytest.raises(ValueError, match=r"data\.tokens_per_batch=100 .*data\.max_len=64"):
        Batcher(random_pairs(10), tokens_per_batch=100, max_len=64, num_shards=2)
    with pytest.raises(ValueError, match="data.max_len=2"):
        TrainIterator(Batcher(random_pairs(10), tokens_per_batch=100, max_len=2))


def laid_out_one_by_one(pairs, planned, packing, process_index, process_count):
    """One planned batch's rows of a process, pair by pair: in each row, a row's pairs in
    order, each sequence where the one before it ends (ids + EOS, BOS + ids), then padding."""
    local = planned.num_rows // process_count
    keys = ("src", "tgt_in", "tgt_out")
    keys += ("src_segments", "src_positions", "tgt_segments", "tgt_positions") * packing
    rows = {key: [[] for _ in range(local)] for key in keys}
    for pair, row in zip(planned.pairs.tolist(), planned.rows.tolist(), strict=True):
        r = row - process_index * local
        if not 0 <= r < local:
            continue
        src, tgt = pairs.source(pair).tolist(), pairs.target(pair).tolist()
        rows["src"][r] += src + [EOS_ID]
        rows["tgt_in"][r] += [BOS_ID] + tgt
        rows["tgt_out"][r] += tgt + [EOS_ID]
        if packing:
            segment = len(set(rows["src_segments"][r])) + 1
            for side, ids in (("src", src), ("tgt", tgt)):
                rows[f"{side}_segments"][r] += [segment] * (len(ids) + 1)
                rows[f"{side}_positions"][r] += list(range(len(ids) + 1))
    return {
        key: np.array([row + [PAD_ID] * (planned.length - len(row)) for row in table], np.int32)
        for key, table in rows.items()
    }


def batch_hash(batch):
    return hash(tuple((key, batch[key].shape, batch[key].tobytes()) for key in sorted(batch)))


@pytest.mark.parametrize(
    "packing,tokens_per_batch,max_len,shards,process_count,longest",
    [
        (False, 512, 32, 2, 1, 40),
        (False, 1024, 64, 4, 2, 70),
        (True, 512, 32, 2, 1, 40),
        (True, 1024, 64, 4, 2, 70),  # a process fills half the rows
        (True, 64, 16, 1, 1, 4),  # many pairs per row
        (True, 2048, 256, 8, 1, 120),  # base's max_len, 8 rows
    ],
)
def test_batches_equal_the_pair_by_pair_layout(
    packing, tokens_per_batch, max_len, shards, process_count, longest
):
    """An epoch's batches and the eval batches, filled, against the same plans laid out one
    pair at a time (the sorted hashes of all batches, and each batch in order)."""
    pairs = random_pairs(1500, seed=max_len, longest=longest)
    for index in range(process_count):
        batcher = Batcher(
            pairs,
            tokens_per_batch=tokens_per_batch,
            max_len=max_len,
            packing=packing,
            num_shards=shards,
            process_index=index,
            process_count=process_count,
        )
        iterator = TrainIterator(batcher, seed=5)
        epoch = iterator.epoch_plan(0)
        batches = [next(iterator) for _ in epoch] + eval_batches(batcher)
        shortest_first = batcher.kept[np.argsort(batcher.lengths[batcher.kept], kind="stable")]
        plan = [*epoch, *batcher.plan(shortest_first)]
        laid_out = [laid_out_one_by_one(pairs, p, packing, index, process_count) for p in plan]
        assert len(epoch) > 3 and iterator.get_state()["epoch"] == 0
        assert sorted(map(batch_hash, batches)) == sorted(map(batch_hash, laid_out))
        for batch, expect in zip(batches, laid_out, strict=True):
            assert batch.keys() == expect.keys()
            for key in batch:
                np.testing.assert_array_equal(batch[key], expect[key], err_msg=key)


def test_sequence_lengths_read_blocks_of_mapped_offsets(tmp_path, monkeypatch):
    monkeypatch.setattr(batching, "_BLOCK", 7)  # 100 pairs in 15 blocks
    rng = np.random.default_rng(0)
    offsets = np.cumsum(np.r_[0, rng.integers(0, 40, 100)]).astype(np.int64)
    np.save(tmp_path / "offsets.npy", offsets)
    mapped = np.load(tmp_path / "offsets.npy", mmap_mode="r")
    capped = np.minimum(np.diff(offsets) + 1, 33)  # ids + EOS, at most max_len + 1
    for array, expect in ((offsets, capped), (mapped, capped), (mapped[10:], capped[10:])):
        lengths = batching._sequence_lengths(array, 32)
        assert lengths.dtype == np.uint16
        assert lengths.tolist() == expect.tolist()
    assert batching._sequence_lengths(offsets, 1 << 16).dtype == np.uint32


def test_packed_masks_isolate_segments():
    from transformer_jax.model.transformer import cross_attention_mask, encoder_mask

    pairs = EncodedPairs.from_lists(
        [[5, 6, 7], [8, 9], [10, 11, 12, 13]], [[14, 15], [16, 17, 18], [19]]
    )
    (packed,) = eval_batches(Batcher(pairs, tokens_per_batch=16, max_len=16, packing=True))
    src_seg, tgt_seg = packed["src_segments"], packed["tgt_segments"]
    assert src_seg.tolist() == [[1] * 4 + [2] * 3 + [3] * 5 + [0] * 4]
    assert tgt_seg.tolist() == [[1] * 3 + [2] * 4 + [3] * 2 + [0] * 7]
    assert packed["src_positions"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0, 0, 0, 0]]
    same = lambda q, k: (q[0][:, None] == k[0][None, :]) & (k[0] != 0)[None, :]
    enc = np.asarray(encoder_mask(packed["src"], PAD_ID, src_seg))[0, 0]
    cross = np.asarray(cross_attention_mask(packed["src"], PAD_ID, src_seg, tgt_seg))[0, 0]
    np.testing.assert_array_equal(enc, same(src_seg, src_seg))
    np.testing.assert_array_equal(cross, same(tgt_seg, src_seg))


@pytest.mark.slow
def test_packed_segments_are_isolated_in_the_model():
    """A packed row gives each pair the logits it gets alone: masks and positions are right."""
    import jax

    from transformer_jax.model.transformer import Transformer

    pairs = EncodedPairs.from_lists(
        [[5, 6, 7], [8, 9], [10, 11, 12, 13]], [[14, 15], [16, 17, 18], [19]]
    )
    (packed,) = eval_batches(Batcher(pairs, tokens_per_batch=16, max_len=16, packing=True))
    cfg = TINY_CONFIG.replace(vocab_size=32, num_encoder_layers=1, num_decoder_layers=1, max_len=16)
    model = Transformer(cfg)
    params = model.init(jax.random.key(0), packed["src"], packed["tgt_in"])["params"]
    keys = ("src_segments", "tgt_segments", "src_positions", "tgt_positions")
    logits = model.apply(
        {"params": params}, packed["src"], packed["tgt_in"], **{k: packed[k] for k in keys}
    )
    for s in range(1, 4):
        src_row = packed["src"][:, packed["src_segments"][0] == s]
        mask = packed["tgt_segments"][0] == s
        alone = model.apply({"params": params}, src_row, packed["tgt_in"][:, mask])
        np.testing.assert_allclose(logits[:, mask], alone, atol=1e-5)


def test_pipeline_encodes_targets_with_the_first_pieces(tmp_path, monkeypatch):
    config = DataConfig(source="synthetic", max_len=64, tokenizer_train_sentences=2000)
    workdir = str(tmp_path)
    stream, reads = preparation.stream_pairs, []
    monkeypatch.setattr(
        preparation,
        "stream_pairs",
        lambda c, split, counts: reads.append(split) or stream(c, split, counts),
    )
    limited = preparation.get_tokenizer(config, workdir, 500, target_vocab_size=100)
    assert limited.target_vocab_size == 100 and reads == ["train"]  # one pass: both orders
    encoded = pipeline.encoded_split(config, "validation", limited, workdir)
    assert encoded.tgt.max() < 100 <= encoded.src.max()
    pairs = synthetic_pairs("validation")
    targets = [encoded.target(i) for i in range(len(encoded))]
    assert limited.decode_batch(targets) == [t for _, t in pairs]
    whole = preparation.get_tokenizer(config, workdir, 500)  # the same file, all pieces
    assert whole.target_vocab_size is None and whole.fingerprint == limited.fingerprint
    assert pipeline.encoded_split(config, "validation", whole, workdir).tgt.max() >= 100
    cache = os.listdir(os.path.join(workdir, "data_cache"))
    assert sorted(name.split("-")[0] for name in cache if not name.endswith(".spool")) == [
        "validation",
        "validation",
    ]

    # a tokenizer trained without the limit is refused for it, naming the file and the field
    plain = str(tmp_path / "plain")
    unnumbered = preparation.get_tokenizer(config, plain, 500)
    assert unnumbered.model_proto != limited.model_proto
    again = preparation.get_tokenizer(config, plain, 500, target_vocab_size=100)
    reads.clear()
    with pytest.raises(ValueError, match=r"tokenizer.model does not number .*tgt_vocab_size=100"):
        pipeline.encoded_split(config, "train", again, plain)
    assert reads == []  # checked on the spool the tokenizer was trained from, before encoding
    cache = os.listdir(os.path.join(plain, "data_cache"))
    assert [f for f in cache if f.startswith("train")] == [f for f in cache if f.endswith(".spool")]
    assert pipeline.encoded_split(config, "train", limited, workdir).tgt.max() < 100


def test_pipeline_trains_tokenizer_once_and_caches_ids(tmp_path):
    config = DataConfig(
        source="synthetic", max_len=64, tokens_per_batch=2048, tokenizer_train_sentences=2000
    )
    workdir = str(tmp_path)
    tokenizer = preparation.get_tokenizer(config, workdir, 500)
    assert os.path.isfile(os.path.join(workdir, "tokenizer.model"))
    assert preparation.get_tokenizer(config, workdir, 500).fingerprint == tokenizer.fingerprint
    encoded = pipeline.encoded_split(config, "validation", tokenizer, workdir)
    spool, cache = sorted(os.listdir(os.path.join(workdir, "data_cache")))
    assert spool.startswith("train-") and spool.endswith(".spool")  # kept to encode train
    assert cache.startswith("validation-") and encoded.src.dtype == np.uint16
    cached = pipeline.encoded_split(config, "validation", tokenizer, workdir)
    np.testing.assert_array_equal(cached.tgt, encoded.tgt)
    np.testing.assert_array_equal(cached.src_offsets, encoded.src_offsets)
    assert len(encoded) == 1000
    batches, counts = pipeline.eval_split_batches(config, workdir, tokenizer, num_shards=2)
    assert counts == {"pairs": 1000, "dropped_too_long": 0}
    decoded = {tokenizer.decode(row) for b in batches for row in b["src"] if row.any()}
    assert len(decoded) == 1000 and "a bright castle jumped" not in decoded
    config = dataclasses.replace(config, tokens_per_batch=4096, packing=True)
    iterator = pipeline.train_iterator(
        config, workdir, tokenizer, num_shards=2, state={"epoch": 2, "index": 3, "pair": 9}
    )
    assert iterator.get_state() == {"epoch": 2, "index": 3, "pair": 9}
    assert next(iterator)["src_segments"].shape == (64, 64)

    config = dataclasses.replace(config, bpe_dropout=0.2, max_len=128)  # new, smaller pieces
    sampled = pipeline.train_iterator(config, workdir, tokenizer, num_shards=2)
    config = dataclasses.replace(config, bpe_dropout=0.0)
    plain = pipeline.train_iterator(config, workdir, tokenizer, num_shards=2)
    epoch = lambda it, e: collections.Counter(
        p for planned in it.epoch_plan(e) for p in unpack(it.batcher.fill(planned))
    )
    pairs = [epoch(sampled, 0), epoch(sampled, 1), epoch(plain, 0)]
    assert pairs[0] != pairs[1] and pairs[0] == epoch(sampled, 0)
    text = lambda c: collections.Counter(
        (tokenizer.decode(s), tokenizer.decode(t)) for s, t in c.elements()
    )
    assert text(pairs[0]) == text(pairs[1]) == text(pairs[2])  # the same pairs, aligned
    targets = lambda c: collections.Counter(t for _, t in c.elements())
    assert targets(pairs[0]) == targets(pairs[2])  # targets in the plain segmentation
    source_tokens = lambda c: sum(len(s) for s, _ in c.elements())
    assert source_tokens(pairs[0]) > 1.1 * source_tokens(pairs[2])


def test_resampled_epochs_hold_their_own_pairs_and_resume_exactly():
    def resample(epoch):  # new lengths every epoch, as BPE-dropout gives
        return random_pairs(300, seed=100 + epoch)

    def make():
        batcher = Batcher(random_pairs(300), tokens_per_batch=256, max_len=MAX_LEN, packing=True)
        return TrainIterator(batcher, seed=5, resample=resample)

    run = make()
    epochs = []
    for epoch in range(2):
        batches = [next(run) for _ in range(len(make().epoch_plan(epoch)))]
        assert run.get_state() == {
            "epoch": epoch,
            "index": len(batches),
            "pair": len(run.batcher.kept),
        }
        found = collections.Counter(p for b in batches for p in unpack(b))
        assert found == expected(resample(epoch))
        epochs.append(found)
    assert epochs[0] != epochs[1]

    run, resumed = make(), make()
    for _ in range(len(run.epoch_plan(0)) - 2):
        next(run)
    resumed.set_state(run.get_state())
    for _ in range(5):  # across the epoch boundary
        expected_batch, batch = next(run), next(resumed)
        for key in batch:
            np.testing.assert_array_equal(batch[key], expected_batch[key])
