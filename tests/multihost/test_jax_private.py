"""JAX's private names that multi-host runs use: all in ``multihost/jax_private.py``, all in
the installed jax, and a jax that moved one is named in one line before any process connects."""

import ast
import importlib.metadata
import re

import pytest
from conftest import ROOT

from transformer_jax.multihost import distributed, jax_private

PRIVATE_MODULES = ("jax._src", "jaxlib")


def test_the_installed_jax_has_every_private_name_multihost_runs_use():
    missing = jax_private.missing()
    assert not missing, "the installed jax moved what multi-host runs use:\n" + "\n".join(missing)
    state = jax_private.global_state()  # before initialization: one process, no client
    assert (state.client, state.process_id, state.num_processes) == (None, 0, 1)


def test_a_moved_name_is_named_with_the_jax_version(monkeypatch):
    moved = ("jax._src.distributed", "_jax.get_distributed_runtime_client_v2", "a client")
    monkeypatch.setitem(jax_private.PRIVATE, "client_factory", moved)
    version = importlib.metadata.version("jax")
    named = f"jax {version} has no jax._src.distributed._jax.get_distributed_runtime_client_v2"
    with pytest.raises(jax_private.MissingPrivateAPI, match=re.escape(named)):
        with jax_private.connect_errors_raised():
            pass
    assert [line.startswith(named) for line in jax_private.missing()] == [True]
    with pytest.raises(ValueError, match=re.escape(named)):  # before connecting to anything
        distributed.initialize(True, coordinator_address="h:1", num_processes=2, process_id=1)
    monkeypatch.setitem(jax_private.PRIVATE, "service", ("jaxlib._no_such_module", "f", "x"))
    with pytest.raises(jax_private.MissingPrivateAPI, match=r"no jaxlib\._no_such_module\.f"):
        jax_private.coordination_service("[::]:0", 2, 60)


def test_the_client_gets_an_error_callback_while_connecting_and_only_then(monkeypatch):
    made = []
    runtime, attribute = jax_private._owner("client_factory")  # what jax.distributed calls
    monkeypatch.setattr(runtime, attribute, lambda *a, **kw: made.append(kw))
    with jax_private.connect_errors_raised():
        getattr(runtime, attribute)("h:9", 1, init_timeout=5)
    getattr(runtime, attribute)("h:9", 1)
    assert callable(made[0].pop("missed_heartbeat_callback"))
    assert made == [{"init_timeout": 5}, {}]


def private_uses(path) -> list[str]:
    """The imports of JAX's private modules in a source file, and the strings naming them
    (docstrings aside)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings and re.search(r"jax\._src|jaxlib\._", node.value):
                found.append(node.value)
    return [name for name in found if name.startswith(PRIVATE_MODULES) or "jax._src" in name]


def test_private_jax_is_reached_from_jax_private_alone():
    files = sorted((ROOT / "transformer_jax").rglob("*.py")) + [ROOT / "train.py"]
    uses = {
        str(path.relative_to(ROOT)): found
        for path in files
        if path.name != "jax_private.py" and (found := private_uses(path))
    }
    assert not uses, uses
    assert private_uses(ROOT / "transformer_jax/multihost/jax_private.py")  # the checker sees
