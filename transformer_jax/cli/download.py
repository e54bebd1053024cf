"""Download a data set into the layout ``train.py`` reads.

    transformer-jax download multi30k --dest data/multi30k

writes ``data/multi30k/{train,val,test_2016_flickr}.{en,de,fr}`` (6 MB), the files
``configs/multi30k.py`` and ``benchmarks/quality.py`` read by default. ``--base_url`` takes
another copy of the Multi30k repository's ``data/task1/raw`` folder (``file://`` too).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import flags

from transformer_jax.cli.flags import run, usage_error
from transformer_jax.data.download import (
    MULTI30K_LANGS,
    MULTI30K_SPLITS,
    MULTI30K_URL,
    WMT14,
    download_multi30k,
)

DATASETS = ("multi30k",)


def define_flags(values: flags.FlagValues, argv: list[str]) -> None:
    define = {"flag_values": values}
    flags.DEFINE_string("dest", None, "The folder to write ({split}.{lang}).", **define)
    flags.mark_flag_as_required("dest", flag_values=values)
    flags.DEFINE_string("base_url", MULTI30K_URL, "Where the .gz files are.", **define)
    flags.DEFINE_list("langs", list(MULTI30K_LANGS), "Comma list of languages to get.", **define)
    flags.register_validator(
        "langs",
        lambda langs: set(langs) <= set(MULTI30K_LANGS),
        f"Multi30k has the languages {list(MULTI30K_LANGS)}",
        flag_values=values,
    )


def _download(values: flags.FlagValues, positional: list[str]) -> None:
    if positional not in ([name] for name in DATASETS):
        raise usage_error(f"name one data set of {list(DATASETS)}, got {positional}")
    written = download_multi30k(values.dest, values.base_url, values.langs)
    kept = len(MULTI30K_SPLITS) * len(values.langs) - len(written)
    print(f"Multi30k in {values.dest}: wrote {len(written)} files, kept {kept} complete ones")


def main(argv: Sequence[str] | None = None) -> int:
    """``transformer-jax download``: download with the command line ``argv``; the exit code."""
    doc = f"{__doc__.rstrip()}\n\n{WMT14}.\n"
    return run(doc, define_flags, _download, argv, "transformer-jax download")


if __name__ == "__main__":
    sys.exit(main())
