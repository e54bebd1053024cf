"""Command-line tools: train, translate, evaluate, average.

Each runs as ``transformer-jax <command>`` (:mod:`.main`) and as
``python -m transformer_jax.<command>``; ``python train.py`` is the train command.
"""
