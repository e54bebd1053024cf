"""The persistent compilation cache the commands share: compiled programs kept on disk, so a
second start of the same run (a resume after preemption, translate after train) loads them.

JAX's cache (``jax_compilation_cache_dir``) is keyed by the lowered program, the compile
options, the devices, the XLA flags and the jax/jaxlib versions: an entry is reused only by
the same program on the same kind of machine. Every program is kept, however fast it
compiled (``jax_persistent_cache_min_compile_time_secs=0``); on GPUs the cache folder also
holds XLA's autotuning results (JAX's ``jax_persistent_cache_enable_xla_caches``).

The folder: the command's ``--compilation_cache_dir``, else ``$JAX_COMPILATION_CACHE_DIR``,
else ``$XDG_CACHE_HOME/transformer_jax/xla``, else ``~/.cache/transformer_jax/xla``.
"""

from __future__ import annotations

import os
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

ENV_DIR = "JAX_COMPILATION_CACHE_DIR"  # JAX's own variable
ENV_MIN_SECONDS = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def default_directory() -> str:
    """``$JAX_COMPILATION_CACHE_DIR``, else the user's cache folder's ``transformer_jax/xla``."""
    if os.environ.get(ENV_DIR):
        return os.environ[ENV_DIR]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "transformer_jax", "xla")


def use_compilation_cache(directory: str | None = None, enabled: bool = True) -> str | None:
    """Keep every program this process compiles in ``directory`` (default
    :func:`default_directory`), or, with ``enabled=False``, none; call it before the
    first compile. Returns the folder in use (None when off); ValueError if it cannot be
    made."""
    directory = os.path.abspath(os.path.expanduser(directory or default_directory()))
    if enabled:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise ValueError(
                f"--compilation_cache_dir {directory!r} cannot be made ({e.strerror}): choose "
                "another folder, or --nocompilation_cache"
            ) from None
    before = (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir)
    jax.config.update("jax_enable_compilation_cache", enabled)
    if enabled:
        jax.config.update("jax_compilation_cache_dir", directory)
    if ENV_MIN_SECONDS not in os.environ:  # the user's choice stands
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    if before != (enabled, jax.config.jax_compilation_cache_dir):
        compilation_cache.reset_cache()  # JAX decides once per process whether it is used
    return directory if enabled else None


def use_cache_flags(values: Any) -> str | None:
    """:func:`use_compilation_cache` of a command's ``--[no]compilation_cache`` and
    ``--compilation_cache_dir`` (``transformer_jax.cli.flags.define_cache_flags``)."""
    return use_compilation_cache(values.compilation_cache_dir, values.compilation_cache)
