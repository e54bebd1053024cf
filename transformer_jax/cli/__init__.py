"""Command-line tools: train, translate, evaluate, average, download, prepare, plan.

Each runs as ``transformer-jax <command>`` (:mod:`.main`) and as
``python -m transformer_jax.<command>``; ``python train.py`` is the train command. They
share one flag library and one set of exit codes (:mod:`.flags`); what they compute is in
the library (``training``, ``multihost``, ``inference``, ``data``, ``aot``), which each
imports once its command line is parsed. ``python -m transformer_jax.<command>`` (the
package's one-line modules) runs a command where the console script is not on PATH.
"""
