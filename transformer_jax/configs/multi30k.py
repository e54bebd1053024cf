"""Multi30k English->German on two CPU cores: the time-to-BLEU setting of ``benchmarks/quality.py``.

    python -m transformer_jax.download multi30k --dest data/multi30k   # once: the data
    python train.py --config multi30k
    python train.py --config multi30k:60   # the settings tuned for 60 minutes
    python benchmarks/quality.py --config configs/multi30k.py:60x2 --ensemble 2 --minutes 60

The paper's architecture and training (post-LN, sinusoidal positions, shared and tied
embeddings, label smoothing 0.1, Adam(0.9, 0.98, 1e-9) with the warmup schedule) at the
size of the PyTorch baseline's small model, for 29,000 short captions and 30 minutes of two
CPU cores; ``:60``: a smaller, deeper model for 60 minutes; ``:60x2``: two such models
trained side by side for 60 minutes, one core each, with weight decay, decoded as an
ensemble. Each comment says what its setting is; the settings were chosen on ``val``.
Results: ``benchmarks/README.md``; the settings tried:
``python benchmarks/tables.py --benchmark quality --notes``.
"""

from transformer_jax.training.schema import default_config

BUDGETS = ("30", "60", "60x2")  # minutes of training (x models side by side)


def get_config(budget: str = "30"):
    if budget not in BUDGETS:
        raise ValueError(f"--config multi30k:BUDGET takes one of {BUDGETS}, got {budget!r}")
    config = default_config()
    config.model.vocab_size = 8000  # shared BPE pieces for English and German
    config.model.d_model = 256  # the PyTorch baseline's
    config.model.num_heads = 4  # d_k = d_v = 64, as in the paper
    config.model.d_ff = 1024  # 4 x d_model, as in the paper
    config.model.num_encoder_layers = 3  # half the paper's, as the baseline
    config.model.num_decoder_layers = 3
    config.model.dropout_rate = 0.1  # the paper's base P_drop
    # bfloat16 operands with float32 accumulation where the target multiplies bfloat16 in
    # hardware (CPUs with AVX-512 BF16 or AMX), float32 products on other CPUs: chosen at run
    # start and recorded in run_info.json
    config.model.matmul_precision = "auto"
    config.model.max_len = 128  # positions for the longest caption plus decoding's extra 50

    config.data.source = "text"
    config.data.text_dir = "data/multi30k"  # in the clone: python -m transformer_jax.download
    config.data.src_lang = "en"
    config.data.tgt_lang = "de"
    config.data.train_split = "train"
    config.data.eval_split = "val"
    config.data.test_split = "test_2016_flickr"
    config.data.tokenizer_train_sentences = 100_000  # all 2 x 29,000 sentences
    config.data.max_len = 64  # row length when packing; longer pairs (a handful) are dropped
    config.data.tokens_per_batch = 4096  # as the baseline's ~4,096-token batches
    config.data.packing = True  # several pairs per row: few padding slots

    config.train.num_steps = 100_000  # quality.py stops the run at its wall-clock budget
    config.train.warmup_steps = 200  # as the baseline: the peak after ~1.7 epochs
    config.train.learning_rate_scale = 0.6  # peak 2.65e-3 at step 200
    config.train.log_every = 20
    config.train.eval_every = 0  # dev loss and BLEU only at the end (decoding costs minutes)
    config.train.eval_sentences = 200
    config.train.checkpoint_every = 100  # fine enough to average the last few (paper §6.1)
    config.train.keep_checkpoints = 5  # the 5 averaged at the end (quality.py --average 5)
    if budget in ("60", "60x2"):
        # A model half as wide and one layer deeper: twice the steps in the same time.
        config.model.d_model = 128
        config.model.num_heads = 4  # d_k = d_v = 32
        config.model.d_ff = 256
        config.model.num_encoder_layers = 4
        config.model.num_decoder_layers = 4
        config.model.dropout_rate = 0.2  # more steps over the same pairs: more regularization
        # A long warmup to a high peak: 4.9e-3 at step 2,000, 2.5e-3 at step 8,000
        config.train.warmup_steps = 2000
        config.train.learning_rate_scale = 2.5
        # A stronger length penalty: this model's beam outputs run short with alpha 0.6
        config.decode.alpha = 1.5
    if budget == "60x2":
        # For the ~5,700 steps of a model on one core: the same peak (4.9e-3) at step 1,000,
        # 0.71x the rate after it (2.1e-3 at step 5,700)
        config.train.warmup_steps = 1000
        config.train.learning_rate_scale = 1.77
        # Not in the paper: AdamW's decoupled decay of the matrices
        config.train.weight_decay = 0.1
    return config
