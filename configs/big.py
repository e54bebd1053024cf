"""The paper's big model on WMT14 English->German (Table 3, "big"; §6.1).

On GPU it runs the paper's arithmetic: float32 with every matrix product at
``Precision.HIGHEST`` (``model.matmul_precision='float32'``; the paper trained in float32
on P100s). The usual fast GPU run is bfloat16 compute with cuDNN attention:
``--config.model.dtype=bfloat16 --config.model.attention_impl=cudnn`` (``data.max_len``
stays a multiple of 8); ``model.matmul_precision='tf32'`` keeps float32 storage with
TF32 products.

Batch: ``data.tokens_per_batch=25000`` source (and as many target) tokens per step over
all devices, the paper's (§5.1): on 8 GPUs, 3,125 per GPU. Memory allows more: in
bfloat16 + cuDNN, 8 x 25,000 (``--config.data.tokens_per_batch=200000``) needs 15.6 GiB
per H100 80GB, and one H100 holds steps of up to ~109,000 (``python -m
transformer_jax.plan``, README "GPUs": a deviceless compile, not a measurement).
"""

from transformer_jax.training.defaults import default_config


def get_config():
    config = default_config()
    config.model.d_model = 1024
    config.model.num_heads = 16
    config.model.d_ff = 4096
    config.model.dropout_rate = 0.3  # en-de big used P_drop = 0.3 (Table 3)
    config.train.num_steps = 300_000  # 300k steps (§5.2)
    return config
