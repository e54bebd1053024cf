"""The run configurations, one module each with ``get_config()``, chosen by name or by file.

``--config base`` is this package's ``base.py``, ``--config multi30k:60`` its ``multi30k.py``
with ``get_config('60')``; any other value is the path of a config file
(``--config configs/base.py`` in a clone, ``--config my_config.py``).
"""

from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = tuple(sorted(f[:-3] for f in os.listdir(HERE) if f.endswith(".py") and f[0] != "_"))


def config_file(spec: str) -> str:
    """The file of ``--config SPEC`` with its ``:ARGS`` kept: a packaged config's name as the
    path of its module here, any other value as given (a path)."""
    name, colon, args = spec.partition(":")
    if name in NAMES and not os.path.isfile(name):
        return os.path.join(HERE, f"{name}.py") + colon + args
    return spec
