"""The paper's base model on WMT14 English->German (Table 3, "base").

On GPU it runs the paper's arithmetic: float32 with every matrix product at
``Precision.HIGHEST`` (``model.matmul_precision='float32'``; the paper trained in float32
on P100s). The usual fast GPU run is bfloat16 compute with cuDNN attention:
``--config.model.dtype=bfloat16 --config.model.attention_impl=cudnn`` (``data.max_len``
stays a multiple of 8); ``model.matmul_precision='tf32'`` keeps float32 storage with
TF32 products.

Batch: ``data.tokens_per_batch=25000`` source (and as many target) tokens per step over
all devices, the paper's (§5.1): on 8 GPUs, 3,125 per GPU. Memory allows more: in
bfloat16 + cuDNN, 8 x 25,000 (``--config.data.tokens_per_batch=200000``) needs 6.7 GiB
per H100 80GB, and one H100 holds steps of up to ~234,000 (``python -m
transformer_jax.plan``, README "GPUs": a deviceless compile, not a measurement).
"""

from transformer_jax.training.schema import default_config


def get_config():
    return default_config()
