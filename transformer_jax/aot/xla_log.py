"""What XLA logs while it compiles, read into the plan's own fields.

XLA writes its warnings to the process's stderr (file descriptor 2, from C++): the
rematerialization pass says when it could not bring a program under the device's memory
limit, and the slow-operation alarm prints "Very slow compile?" banners as errors. While a
program compiles, :func:`captured_stderr` sends descriptor 2 to a file; :func:`read_xla_log`
turns the rematerialization line into ``could_not_fit``, drops the alarm's banners (a
deviceless compile of a large step is slow by nature) and gives every other line back.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

_REMAT = re.compile(
    r"Can't reduce memory use below \S+ \((\d+) bytes\) by rematerialization; "
    r"only reduced to \S+ \((\d+) bytes\)(?:, down from \S+ \((\d+) bytes\))?"
)
_ALARM = re.compile(r"slow_operation_alarm|Very slow compile\?|^\*+$|Constant folding an instr")


def read_xla_log(text: str) -> tuple[dict[str, Any], list[str]]:
    """``(notes, other_lines)`` of XLA's log ``text``: notes ``could_not_fit`` (None, or the
    rematerialization pass's ``limit_bytes``, ``reached_bytes`` and ``original_bytes``) and
    ``slow_compile_alarms`` (how many banners were dropped)."""
    notes: dict[str, Any] = {"could_not_fit": None, "slow_compile_alarms": 0}
    others = []
    for line in text.splitlines():
        remat = _REMAT.search(line)
        if remat:
            limit, reached, original = remat.groups()
            notes["could_not_fit"] = {
                "limit_bytes": int(limit),
                "reached_bytes": int(reached),
                "original_bytes": int(original) if original else None,
            }
        elif _ALARM.search(line.strip()):
            notes["slow_compile_alarms"] += "Very slow compile?" in line
        elif line.strip():
            others.append(line)
    return notes, others


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Descriptor 2 goes to a file for the block; the yielded list then holds its text."""
    sys.stderr.flush()
    saved = os.dup(2)
    captured: list[str] = []
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode(errors="replace"))
