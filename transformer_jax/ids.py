"""The special token ids of the shared vocabulary: PAD 0, UNK 1, BOS 2, EOS 3.

A leaf module (no imports), so that model, decoding, data code and the run config's checks
share the ids without depending on one another; the tokenizer trains its sentencepiece model
with these ids.
"""

PAD_ID = 0  # padding; masked as an attention key and excluded from the loss
UNK_ID = 1  # unknown piece (rare: byte fallback encodes unseen characters)
BOS_ID = 2  # begins every decoder input (``tgt_in``) and every decoded sequence
EOS_ID = 3  # ends every source and every target (``src``, ``tgt_out``)
NUM_SPECIAL_IDS = 4  # PAD, UNK, BOS, EOS: ids 0-3, before every piece
# the specials + 256 byte-fallback pieces (+ the characters of the corpus)
MIN_VOCAB_SIZE = NUM_SPECIAL_IDS + 256


def check_vocab_size(vocab_size: object) -> None:
    """ValueError naming ``model.vocab_size`` if a tokenizer cannot have that many pieces."""
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"model.vocab_size must be an integer >= {MIN_VOCAB_SIZE} (4 special ids + 256 "
            f"byte-fallback pieces), got {vocab_size!r}"
        )
