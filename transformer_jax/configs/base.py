"""The paper's base model on WMT14 English->German (Table 3, "base").

On GPU it runs the paper's arithmetic: float32 with every matrix product at
``Precision.HIGHEST`` (``model.matmul_precision='float32'``; the paper trained in float32
on P100s). The usual fast GPU run is bfloat16 compute with cuDNN attention:
``--config.model.dtype=bfloat16 --config.model.attention_impl=cudnn`` (``data.max_len``
stays a multiple of 8); ``model.matmul_precision='tf32'`` keeps float32 storage with
TF32 products.
"""

from transformer_jax.training.defaults import default_config


def get_config():
    return default_config()
