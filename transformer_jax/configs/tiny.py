"""A small Transformer on the embedded synthetic English->Lantic task: ``python train.py``.

Trains in a few minutes on two CPU cores. The architecture is the paper's (post-LN,
sinusoidal positions, shared and tied embeddings, label smoothing 0.1, Adam with the
warmup schedule); only the sizes, the batch and the schedule length are scaled down.
"""

from transformer_jax.training.schema import default_config


def get_config():
    config = default_config()
    config.model.vocab_size = 1000  # BPE vocabulary shared by English and Lantic
    config.model.d_model = 128
    config.model.num_heads = 4
    config.model.d_ff = 512
    config.model.num_encoder_layers = 2
    config.model.num_decoder_layers = 2
    config.model.dropout_rate = 0.1
    config.model.max_len = 64

    config.data.source = "synthetic"
    config.data.src_lang = "en"  # the embedded task: English-like sentences ...
    config.data.tgt_lang = "lantic"  # ... into Lantic (transformer_jax.data.synthetic)
    config.data.max_len = 64
    config.data.tokens_per_batch = 2048
    config.data.packing = True  # one batch shape: one compilation (buckets would need 8)
    config.data.tokenizer_train_sentences = 100_000

    config.train.num_steps = 1000
    config.train.warmup_steps = 300
    config.train.learning_rate_scale = 1.0
    config.train.log_every = 50
    config.train.eval_every = 0  # dev loss and BLEU at the end only
    config.train.eval_sentences = 200
    config.train.checkpoint_every = 200
    config.train.keep_checkpoints = 3

    config.decode.max_extra_len = 10  # Lantic sentences are about as long as English ones
    return config
