"""The paper's big model on WMT14 English->German (Table 3, "big"; §6.1).

The arithmetic on GPU, and the usual fast GPU run, are ``base``'s (its docstring).

Batch: ``data.tokens_per_batch=25000`` per step over all devices, as ``base``: on 8 GPUs,
3,125 per GPU. In bfloat16 + cuDNN, 8 x 25,000 (``--config.data.tokens_per_batch=200000``)
needs 11.9 GiB per H100 80GB with pmap (10.9 GiB with its mesh), and one H100 holds steps
of up to ~147,000 (``python -m transformer_jax.plan``, README "GPUs": a deviceless compile,
not a measurement).
"""

from transformer_jax.training.schema import default_config


def get_config():
    config = default_config()
    config.model.d_model = 1024
    config.model.num_heads = 16
    config.model.d_ff = 4096
    config.model.dropout_rate = 0.3  # en-de big used P_drop = 0.3 (Table 3)
    config.train.num_steps = 300_000  # 300k steps (§5.2)
    config.train.parallel = "mesh"  # params and Adam state split over the GPUs, not copied to each
    return config
