"""The README's shell recipes write only into folders a clone ignores (``.gitignore``) or
outside the clone: a user who runs them keeps a clean working tree."""

import re

from conftest import ROOT

# What a recipe writes: a file opened for writing, a run's or a download's folder, evaluate's
# hypotheses (next to --src), a shell redirection.
WRITES = re.compile(
    r"open\('([^']+)', *'w'\)|--(?:workdir|dest|out|src)[ =](\S+)|(?:^|\s)>\s*(\S+)"
)


def written_paths(markdown: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", markdown, re.S)
    return [next(g for g in m.groups() if g) for b in blocks for m in WRITES.finditer(b)]


def test_readme_recipes_write_into_ignored_folders_or_outside_the_clone():
    ignored = {line.strip("/") for line in (ROOT / ".gitignore").read_text().split()}
    written = written_paths((ROOT / "README.md").read_text())
    assert "runs/tiny" in written  # the recipes were read
    inside = [path for path in written if not path.startswith("/")]
    tracked = [path for path in inside if path.split("/")[0] not in ignored]
    assert not tracked, tracked


def test_written_paths_finds_each_kind_of_write():
    recipe = (
        "```bash\n"
        "python -c \"print(1, file=open('test.en', 'w'))\"\n"
        "python -m transformer_jax.evaluate --workdir runs/x --src a.en --ref b.de\n"
        "python -m transformer_jax.download multi30k --dest=data/m > log.txt  # en->de\n"
        "```\n"
    )
    assert written_paths(recipe) == ["test.en", "runs/x", "a.en", "data/m", "log.txt"]
