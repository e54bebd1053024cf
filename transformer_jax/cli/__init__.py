"""Command-line tools: train, translate, evaluate, average, download, prepare, plan.

Each runs as ``transformer-jax <command>`` (:mod:`.main`) and as
``python -m transformer_jax.<command>``; ``python train.py`` is the train command. They
share one flag library and one set of exit codes (:mod:`.flags`); what they compute is in
the library (``training``, ``inference``, ``data``, ``aot``).
"""
