"""Every notebook runs headless, top to bottom, in a fresh kernel without errors.

Kernels start in notebooks/ with TJ_NOTEBOOK_QUICK=1 (small sizes, a 20-step training run)
on CPU; notebooks 02 and 04 share that run through TJ_NOTEBOOK_WORKDIR (a temporary folder).
Executing them is marked slow (``tests/conftest.py``): ``pytest -m slow tests/test_notebooks.py``
(one notebook: ``-k 03_positional``).
"""

import re

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient

NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
MAX_TOTAL_BYTES = 3 * 2**20


def test_the_seven_notebooks_are_committed_small_and_with_outputs():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"]
    assert sum(p.stat().st_size for p in NOTEBOOKS) < MAX_TOTAL_BYTES
    for path in NOTEBOOKS:
        outputs = [o for c in nbformat.read(path, as_version=4).cells for o in c.get("outputs", [])]
        assert not [o for o in outputs if o.output_type == "error"], path.name
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name}: no figure"


def output_texts(output) -> list[str]:
    """The text an output shows: a stream, an error's traceback, text/* and JSON data."""
    texts = [output.get("text", ""), *output.get("traceback", [])]
    for kind, value in output.get("data", {}).items():
        if kind.startswith("text/") or kind.endswith("json"):
            texts.append(value if isinstance(value, str) else str(value))
    return texts


MACHINE_PATHS = re.compile(r"(?<![\w.])/(work|root|tmp|home)/")


def test_outputs_carry_no_absolute_paths_of_the_machine_that_ran_them():
    found = [
        f"{path.name} cell {i}: {MACHINE_PATHS.search(text).group(0)}..."
        for path in NOTEBOOKS
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells)
        for output in cell.get("outputs", [])
        for text in output_texts(output)
        if MACHINE_PATHS.search(text)
    ]
    assert not found, found
    assert MACHINE_PATHS.search("the run in /work/main/runs/notebook is complete")
    assert not MACHINE_PATHS.search("the run in ../runs/notebook is complete")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("notebook_runs")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, run_dir, monkeypatch):
    monkeypatch.setenv("TJ_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("TJ_NOTEBOOK_WORKDIR", str(run_dir))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
