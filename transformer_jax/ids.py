"""The special token ids of the shared vocabulary: PAD 0, UNK 1, BOS 2, EOS 3.

A leaf module (no imports), so that model, decoding and data code share the ids without
depending on one another; the tokenizer trains its sentencepiece model with these ids.
"""

PAD_ID = 0  # padding; masked as an attention key and excluded from the loss
UNK_ID = 1  # unknown piece (rare: byte fallback encodes unseen characters)
BOS_ID = 2  # begins every decoder input (``tgt_in``) and every decoded sequence
EOS_ID = 3  # ends every source and every target (``src``, ``tgt_out``)
