"""The benchmarks' tables, made from their records: ``benchmarks/results/*.json``, one file
per run (or per set of runs compared in one table), each with the benchmark, a title, the
date, the machine, library versions, the command and config, the table's columns and rows,
and the notes that came with it (``context``). ``current: true`` marks the records whose
tables ``benchmarks/README.md`` shows; the others are past runs and settings tried.

    python benchmarks/tables.py                       # every record's table
    python benchmarks/tables.py --current             # the tables of benchmarks/README.md
    python benchmarks/tables.py --benchmark quality --notes
    python benchmarks/tables.py --check               # every record parses, has every key
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
# Each record's keys and the types their values take (None: the run did not record it).
REQUIRED: dict[str, tuple[type | None, ...]] = {
    "benchmark": (str,),  # the script: benchmarks/{benchmark}.py
    "title": (str,),
    "date": (str, None),  # YYYY-MM-DD
    "machine": (str, None),  # the CPU (or GPU), its cores
    "versions": (dict,),  # {"jax": ..., "torch": ...}, values None where not recorded
    "command": (str, None),
    "config": (str, None),
    "current": (bool,),
    "columns": (list,),
    "rows": (list,),  # lists of cells: numbers, text or None (empty)
    "context": (list,),  # the notes that came with the table, one paragraph each
}


def problems(record: Any, name: str) -> list[str]:
    """What is wrong with one record (empty if nothing): missing keys, wrong types, a date
    not YYYY-MM-DD, a benchmark without its script, rows not as wide as the columns."""
    if not isinstance(record, dict):
        return [f"{name}: not a JSON object"]
    found = []
    for key, types in REQUIRED.items():
        if key not in record:
            found.append(f"{name}: no {key!r}")
        elif not isinstance(record[key], tuple(type(None) if t is None else t for t in types)):
            found.append(f"{name}: {key!r} is {type(record[key]).__name__}")
    if found:
        return found
    if record["date"] is not None and not re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"]):
        found.append(f"{name}: date {record['date']!r} is not YYYY-MM-DD")
    if not os.path.isfile(os.path.join(HERE, f"{record['benchmark']}.py")):
        found.append(f"{name}: no script benchmarks/{record['benchmark']}.py")
    for i, row in enumerate(record["rows"]):
        if not isinstance(row, list) or len(row) != len(record["columns"]):
            found.append(f"{name}: row {i} does not have {len(record['columns'])} cells")
        elif not all(isinstance(c, str | int | float | None) for c in row):
            found.append(f"{name}: row {i} has a cell that is not a number, text or null")
    return found


def load_records(folder: str = RESULTS) -> dict[str, dict[str, Any]]:
    """Every record in ``folder`` by file name; ValueError listing the problems if any."""
    records, found = {}, []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        name = os.path.basename(path)
        try:
            with open(path) as f:
                records[name] = json.load(f)
        except json.JSONDecodeError as e:
            found.append(f"{name}: not JSON ({e})")
            continue
        found += problems(records[name], name)
    if found:
        raise ValueError("; ".join(found))
    return records


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _numeric(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def caption(record: dict[str, Any]) -> str:
    """One line: the command (and config), the machine, the date and the versions."""
    parts = [f"`{record['command']}`" if record["command"] else "command not recorded"]
    if record["config"]:
        parts[0] += f" ({record['config']})"
    parts.append(record["machine"] or "machine not recorded")
    parts += [record["date"]] if record["date"] else []
    versions = [f"{k} {v}" for k, v in record["versions"].items() if v]
    parts += [", ".join(versions)] if versions else []
    return "; ".join(parts) + ":"


def render(record: dict[str, Any]) -> str:
    """The record's caption and its table in GitHub markdown (numeric columns right-aligned)."""
    columns, rows = record["columns"], record["rows"]
    numeric = [all(_numeric(row[i]) for row in rows) for i in range(len(columns))]
    lines = [
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---:" if right else "---" for right in numeric) + "|",
        *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows),
    ]
    return caption(record) + "\n\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--current", action="store_true", help="only the README's tables")
    parser.add_argument("--benchmark", help="only this benchmark's records (e.g. quality)")
    parser.add_argument("--notes", action="store_true", help="print each record's notes too")
    parser.add_argument("--check", action="store_true", help="check the records, print none")
    args = parser.parse_args(argv)
    try:
        records = load_records()
    except ValueError as e:
        print(f"tables.py: {e}", file=sys.stderr)
        return 1
    if args.check:
        print(f"{len(records)} records in {RESULTS}: every one parses and has every key")
        return 0
    for name, record in records.items():
        if (args.current and not record["current"]) or args.benchmark not in (
            None,
            record["benchmark"],
        ):
            continue
        print(f"### {record['title']} ({name})\n\n{render(record)}\n")
        for paragraph in record["context"] + record.get("context_after", []) if args.notes else []:
            print(f"{paragraph}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
