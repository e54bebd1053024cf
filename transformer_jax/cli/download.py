"""Download a data set into the layout ``train.py`` reads.

    python -m transformer_jax.download multi30k --dest data/multi30k

writes ``data/multi30k/{train,val,test_2016_flickr}.{en,de,fr}`` (6 MB), the files
``configs/multi30k.py`` and ``benchmarks/quality.py`` read by default. ``--base-url`` takes
another copy of the Multi30k repository's ``data/task1/raw`` folder (``file://`` too).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from transformer_jax.data.download import (
    MULTI30K_LANGS,
    MULTI30K_SPLITS,
    MULTI30K_URL,
    WMT14,
    download_multi30k,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_jax.download",
        description=__doc__,
        epilog=WMT14 + ".",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dataset", choices=["multi30k"], help="the data set")
    parser.add_argument("--dest", required=True, help="the folder to write ({split}.{lang})")
    parser.add_argument("--base-url", default=MULTI30K_URL, help="where the .gz files are")
    parser.add_argument(
        "--langs", default=",".join(MULTI30K_LANGS), help="comma list of languages to get"
    )
    args = parser.parse_args(argv)
    langs = args.langs.split(",")
    if unknown := sorted(set(langs) - set(MULTI30K_LANGS)):
        parser.error(f"--langs: Multi30k has no {unknown}; it has {list(MULTI30K_LANGS)}")
    try:
        written = download_multi30k(args.dest, args.base_url, langs)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    kept = len(MULTI30K_SPLITS) * len(langs) - len(written)
    print(f"Multi30k in {args.dest}: wrote {len(written)} files, kept {kept} complete ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
