"""The README's shell recipes write only into paths a clone ignores (``.gitignore``, asked
of git) or outside the clone: a user who runs them leaves no untracked file in it."""

import re
import shutil
import subprocess

import pytest
from conftest import ROOT

# What a recipe writes: a file opened for writing, a run's or a download's folder, a plan's
# or evaluate's output file, evaluate's default hypotheses and scores ({src}.hyp and
# {src}.hyp.bleu, so --src), a shell redirection.
WRITES = re.compile(
    r"open\('([^']+)', *'w'\)|--(?:workdir|dest|out|json|src)[ =](\S+)|(?:^|\s)>\s*(\S+)"
)


def written_paths(markdown: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", markdown, re.S)
    found = [(m[0], next(g for g in m.groups() if g)) for b in blocks for m in WRITES.finditer(b)]
    hypotheses = [
        f"{path}.hyp{end}" for text, path in found if "--src" in text for end in ("", ".bleu")
    ]
    return [path for _, path in found] + hypotheses


def not_ignored(paths: list[str]) -> list[str]:
    """The paths (relative to the clone) that git would list as untracked files."""
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        input="\n".join(paths),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert ignored.returncode in (0, 1), ignored.stderr  # 1: none ignored
    return sorted(set(paths) - set(ignored.stdout.splitlines()))


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git clone"
)
def test_readme_recipes_write_into_ignored_paths_or_outside_the_clone():
    written = written_paths((ROOT / "README.md").read_text())
    assert "runs/tiny" in written and "runs/tiny/test.en.hyp" in written  # recipes were read
    inside = [path for path in written if not path.startswith(("/", "~", "$"))]
    assert not not_ignored(inside), not_ignored(inside)
    assert not_ignored(["test.en.hyp", "runs/tiny/test.en"]) == ["test.en.hyp"]  # git asked


def test_written_paths_finds_each_kind_of_write():
    recipe = (
        "```bash\n"
        "python -c \"print(1, file=open('test.en', 'w'))\"\n"
        "python -m transformer_jax.evaluate --workdir runs/x --src a.en --ref b.de\n"
        "python -m transformer_jax.download multi30k --dest=data/m > log.txt  # en->de\n"
        "```\n"
    )
    assert written_paths(recipe) == [
        "test.en",
        "runs/x",
        "a.en",
        "data/m",
        "log.txt",
        "a.en.hyp",
        "a.en.hyp.bleu",
    ]
