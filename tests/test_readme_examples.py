"""Every Python block of the README run as a user runs it: written to a file and started as
``python example.py`` in the environment pytest was started in (without the suite's XLA
settings), its printed lines checked against the block's ``# prints:`` comments, in order
(``...`` stands for any text). A block that needs an optional package says so on the line
before it, ``<!-- needs: torch -->``, and is skipped with that reason where it is missing."""

import doctest
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, SESSION_VARIABLES, user_environment

README = ROOT / "README.md"
BLOCK = re.compile(r"(?:<!-- needs: (?P<needs>[\w, ]+) -->\n)?```python\n(?P<code>.*?)```", re.S)
PRINTS = re.compile(r"#\s*prints:\s*(?P<text>.*?)\s*$")


def examples() -> list:
    """``pytest.param(code, needs)`` for each block, named by its section's heading and its
    number there (``library-1``)."""
    text = README.read_text(encoding="utf-8")
    params, numbers = [], {}
    for match in BLOCK.finditer(text):
        headings = re.findall(r"^## (.+)$", text[: match.start()], re.M)
        section = re.sub(r"\W+", "-", (headings or ["top"])[-1].lower().removeprefix("the "))
        numbers[section] = numbers.get(section, 0) + 1
        needs = [n.strip() for n in (match["needs"] or "").split(",") if n.strip()]
        params.append(pytest.param(match["code"], needs, id=f"{section}-{numbers[section]}"))
    return params


def expected_lines(code: str) -> list[str]:
    """What the block says it prints: one ``# prints:`` comment on each line that prints."""
    lines = []
    for number, line in enumerate(code.splitlines(), 1):
        said = PRINTS.search(line)
        assert bool(said) == ("print(" in line), f"line {number} of the block: {line!r}"
        if said:
            lines.append(said["text"])
    return lines


def test_the_readme_has_its_examples_and_each_says_what_it_prints():
    found = {param.id: param.values for param in examples()}
    assert {"library-1", "library-2", "library-3"} <= set(found), sorted(found)
    for name, (code, needs) in found.items():
        assert expected_lines(code), f"{name} prints nothing the test could check"
        assert set(needs) <= {"torch"}, f"{name} needs {needs}: a module the test knows"
    assert found["library-3"][1] == ["torch"]


def test_the_examples_get_the_environment_pytest_found():
    """Not the suite's unoptimised XLA code or its compilation cache (set by conftest.py)."""
    assert "--xla_backend_optimization_level=0" in os.environ["XLA_FLAGS"]
    found = json.loads(os.environ["TRANSFORMER_JAX_TESTS_FOUND_ENVIRONMENT"])
    environment = user_environment()
    assert {name: environment.get(name) for name in SESSION_VARIABLES} == found
    assert environment["PATH"] == os.environ["PATH"]


def test_matching_allows_ellipsis_and_nothing_more():
    summary = "{'loss': 0.1, 'nll': 0.2, 'accuracy': 1.0, 'perplexity': 1.2}\n"
    assert matches(["{'loss': ..., 'accuracy': ..., ...}"], summary)
    assert not matches(["attention is all you need"], "atention is alll you need\n")
    assert not matches(["a"], "a\nb\n")


def matches(expected: list[str], stdout: str) -> bool:
    printed = stdout.splitlines()
    if len(printed) != len(expected):
        return False
    check = doctest.OutputChecker().check_output
    pairs = zip(expected, printed, strict=True)
    return all(check(want + "\n", got + "\n", doctest.ELLIPSIS) for want, got in pairs)


@pytest.mark.parametrize("code, needs", examples())
def test_readme_example_prints_what_it_says(code, needs, tmp_path):
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: not installed")
    (tmp_path / "example.py").write_text(code, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=user_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    expected = expected_lines(code)
    assert matches(expected, run.stdout), f"printed:\n{run.stdout}expected:\n" + "\n".join(expected)
