"""The package's import graph: acyclic, layered by data flow, no imports inside functions.

Every module under ``transformer_jax/`` (and ``train.py``) is parsed with ``ast``; an edge
``a -> b`` is an import of package module ``b`` anywhere in ``a`` (top level or in a function).
Imports flow one way: kernels <- model <- data <- multihost <- training/inference/interop <-
configs <- cli (README, Layout).
"""

import ast
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = "transformer_jax"

# Third-party modules a function may import lazily: optional or slow to import, and only
# needed on one path (TensorBoard logs, TFDS sources, the PyTorch baseline).
LAZY_IMPORTS_ALLOWED = {"tensorboardX", "tensorflow_datasets", "torch"}

LIBRARY = ("kernels", "model", "data", "training", "inference", "analysis", "interop", "multihost")
# (importer prefix, imported prefix): the importer must not import that part of the package.
FORBIDDEN = [
    ("transformer_jax.kernels", "transformer_jax.model"),
    ("transformer_jax.kernels", "transformer_jax.data"),
    ("transformer_jax.kernels", "transformer_jax.training"),
    ("transformer_jax.kernels", "transformer_jax.inference"),
    ("transformer_jax.kernels", "transformer_jax.analysis"),
    ("transformer_jax.model", "transformer_jax.data"),
    ("transformer_jax.model", "transformer_jax.training"),
    ("transformer_jax.model", "transformer_jax.inference"),
    ("transformer_jax.model", "transformer_jax.analysis"),
    ("transformer_jax.data", "transformer_jax.training"),
    ("transformer_jax.data", "transformer_jax.inference"),
    ("transformer_jax.data", "transformer_jax.analysis"),
    *(("transformer_jax.interop", f"transformer_jax.{part}") for part in LIBRARY[2:6]),
    *((f"transformer_jax.{part}", "transformer_jax.interop") for part in LIBRARY[:6]),
    # The processes of a run (multihost) sit below the training loop and inference.
    *((f"transformer_jax.{part}", "transformer_jax.multihost") for part in LIBRARY[:3]),
    ("transformer_jax.multihost", "transformer_jax.inference"),
    ("transformer_jax.multihost", "transformer_jax.training"),
    ("transformer_jax.analysis", "transformer_jax.data"),
    ("transformer_jax.analysis", "transformer_jax.training"),
    ("transformer_jax.analysis", "transformer_jax.inference"),
    # Inference may read a run's files (training.checkpoints), never the training loop.
    ("transformer_jax.inference", "transformer_jax.training.loop"),
    ("transformer_jax.inference", "transformer_jax.training.steps"),
    ("transformer_jax.inference", "transformer_jax.training.parallel"),
    ("transformer_jax.inference", "transformer_jax.training.optimizer"),
    ("transformer_jax.inference", "transformer_jax.training.loss"),
    # The run configurations (built on training.schema) are read by the commands only.
    *((f"transformer_jax.{part}", "transformer_jax.configs") for part in LIBRARY),
]
# Only the commands (and their ``python -m transformer_jax.<command>`` shims) import cli.
CLI_SHIMS = {
    "transformer_jax.translate",
    "transformer_jax.evaluate",
    "transformer_jax.average",
    "transformer_jax.train",
    "transformer_jax.download",
    "transformer_jax.plan",
    "transformer_jax.data.prepare",
}
# Leaf modules hold the ids, enums and config sections that others validate against: they
# import no other package module except other leaves (modules that import nothing from the
# package), so that a command's --help and config checks import no JAX.
LEAVES = {
    "transformer_jax.ids",
    "transformer_jax.options",
    "transformer_jax.fields",
    "transformer_jax.model.config",
    "transformer_jax.model.registry",
    "transformer_jax.data.config",
    "transformer_jax.training.config",
    "transformer_jax.inference.config",
}
# Known departures from the target layout, each to be removed by the change that fixes it.
PENDING: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files() -> dict[str, Path]:
    files = {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}
    files["train"] = ROOT / "train.py"
    return files


def imported(node: ast.AST, importer: str, is_package: bool) -> list[tuple[str, str | None]]:
    """(module, name) pairs of one import statement: ``import a`` (a, None), ``from a import b``
    (a, b), with relative imports resolved against the importer's package."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    module = node.module
    if node.level:
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    return [(module, alias.name) for alias in node.names]


def scan(source: str, importer: str, is_package: bool = False):
    """(every (module, name) the source imports when run, the modules imported inside
    functions)."""
    imports, lazy = set(), set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) == "TYPE_CHECKING":
                continue  # imports for annotations only: not run
            if isinstance(child, ast.Import | ast.ImportFrom):
                found = imported(child, importer, is_package)
                imports.update(found)
                if in_function:
                    lazy.update(module for module, _ in found)
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, inside)

    visit(ast.parse(source), False)
    return imports, lazy


def resolve(imports, modules) -> set[str]:
    """The package modules that imports name: ``from pkg import sub`` is the module pkg.sub
    when there is one, else an attribute of pkg (its ``__init__``)."""
    found = set()
    for module, name in imports:
        submodule = f"{module}.{name}"
        found.add(submodule if name and submodule in modules else module)
    return found & set(modules)


def build_graph(files: dict[str, Path]):
    """{module: set of package modules it imports}, {module: modules imported in functions}."""
    graph, lazy = {}, {}
    for name, path in files.items():
        imports, in_functions = scan(path.read_text(), name, path.name == "__init__.py")
        graph[name] = resolve(imports, files) - {name}
        lazy[name] = in_functions
    return graph, lazy


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle ``[a, b, ..., a]`` of the directed graph, or None (depth-first search)."""
    state = {}  # 1: on the current path, 2: done
    path = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Edges that break the layering (FORBIDDEN, cli imports, leaves importing non-leaves)."""

    def under(name, prefix):
        return name == prefix or name.startswith(prefix + ".")

    bad = set()
    for importer, imported in graph.items():
        for target in imported:
            if any(under(importer, a) and under(target, b) for a, b in FORBIDDEN):
                bad.add((importer, target))
            commands = under(importer, "transformer_jax.cli") or importer in CLI_SHIMS
            if under(target, "transformer_jax.cli") and not (commands or importer == "train"):
                bad.add((importer, target))
            if importer in LEAVES and {m for m in graph[target] if m != PACKAGE}:
                bad.add((importer, target))
    return bad


@pytest.fixture(scope="module")
def graph_and_lazy():
    return build_graph(package_files())


def test_the_import_graph_is_acyclic(graph_and_lazy):
    graph, _ = graph_and_lazy
    assert len(graph) > 30  # the whole package was parsed
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def lazy_import_allowed(importer: str, name: str) -> bool:
    """An optional heavy dependency, or the library imported by a command once it has
    parsed its command line (``--help`` and a bad flag import no JAX: cli/flags.py)."""
    command = importer.startswith("transformer_jax.cli.")
    return command or name.split(".")[0] in LAZY_IMPORTS_ALLOWED


def test_no_imports_inside_functions_except_optional_heavy_dependencies(graph_and_lazy):
    _, lazy = graph_and_lazy
    found = {
        f"{module}: {name}"
        for module, names in lazy.items()
        for name in names
        if not lazy_import_allowed(module, name)
    }
    assert not found, sorted(found)
    assert not lazy_import_allowed("transformer_jax.training.loop", "jax")
    assert lazy_import_allowed("transformer_jax.cli.train", "jax")


def test_the_package_is_layered_by_data_flow(graph_and_lazy):
    graph, _ = graph_and_lazy
    bad = violations(graph)
    assert not bad - PENDING, sorted(bad - PENDING)
    assert not PENDING - bad, f"fixed, remove from PENDING: {sorted(PENDING - bad)}"


# The checker itself, on synthetic graphs and sources.


def test_find_cycle_finds_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"a"}, "a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_scan_sees_imports_in_functions_and_resolves_relative_ones():
    source = (
        "import os\n"
        "from transformer_jax.model import config\n"
        "from transformer_jax import Transformer\n"
        "def f():\n"
        "    import torch\n"
        "    from transformer_jax.training.loop import train_and_evaluate\n"
        "class C:\n"
        "    def g(self):\n"
        "        from .tokenizer import BOS_ID\n"
    )
    imports, lazy = scan(source, "transformer_jax.data.batching")
    assert lazy == {"torch", "transformer_jax.training.loop", "transformer_jax.data.tokenizer"}
    modules = [
        "transformer_jax",
        "transformer_jax.model",
        "transformer_jax.model.config",
        "transformer_jax.data.tokenizer",
        "transformer_jax.training.loop",
    ]
    assert resolve(imports, modules) == {
        "transformer_jax",  # Transformer: an attribute of the package's __init__
        "transformer_jax.model.config",  # a submodule: not transformer_jax.model
        "transformer_jax.training.loop",
        "transformer_jax.data.tokenizer",
    }


def test_violations_finds_each_kind_of_layering_break():
    graph = {
        "transformer_jax.model.layers": {"transformer_jax.training.steps"},
        "transformer_jax.training.steps": set(),
        "transformer_jax.inference.decoding": {"transformer_jax.cli.common"},
        "transformer_jax.cli.common": {"transformer_jax.training.checkpoints"},
        "transformer_jax.training.checkpoints": set(),
        "transformer_jax.model.config": {"transformer_jax.model.layers"},
        "transformer_jax.translate": {"transformer_jax.cli.common"},
    }
    assert violations(graph) == {
        ("transformer_jax.model.layers", "transformer_jax.training.steps"),
        ("transformer_jax.inference.decoding", "transformer_jax.cli.common"),
        ("transformer_jax.model.config", "transformer_jax.model.layers"),
    }
