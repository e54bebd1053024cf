"""The disk trials of ``hostile_trials.py``: one flipped bit in the newest checkpoint or in
the prepared data under each command (train, translate, evaluate, average, prepare), a
read-only workdir and a full disk (a small tmpfs when this process may mount one, else a
file-size limit, ``ulimit -f``)."""

from __future__ import annotations

import filecmp
import glob
import os
import re
import shutil
from collections.abc import Callable

import _hostile_runs as hr

Trial = Callable[[str, str, float], tuple[str, str]]
COMMANDS = ("train", "translate", "evaluate", "average", "prepare")


def command(name: str, workdir: str, tmp: str) -> list[str]:
    """``name``'s command line on ``workdir`` (translate and evaluate: two sentences)."""
    text = os.path.join(tmp, "src.txt")
    with open(text, "w") as f:
        f.write("the small dog sees the red house .\nthe bird sings .\n")
    return {
        "train": lambda: hr.train_command(workdir),
        "translate": lambda: hr.module_command(
            "translate", f"--workdir={workdir}", f"--input={text}"
        ),
        "evaluate": lambda: hr.module_command(
            "evaluate", f"--workdir={workdir}", f"--src={text}", f"--ref={text}"
        ),
        "average": lambda: hr.module_command("average", f"--workdir={workdir}", "--last=3"),
        "prepare": lambda: hr.module_command("data.prepare", f"--workdir={workdir}", *hr.MICRO),
    }[name]()


def flip_a_bit(folder: str) -> str:
    """Flip one bit in the middle of the largest file under ``folder``; its path."""
    paths = [os.path.join(b, n) for b, _, names in os.walk(folder) for n in names]
    path = max(paths, key=os.path.getsize)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(path, "wb").write(bytes(data))
    return path


def damaged_checkpoint(name: str, same_run: Callable[[str, str], str | None]) -> Trial:
    """The newest checkpoint damaged (its largest file; of its parameters for the commands
    that read only those): used only with a line naming it; prepare does not read it."""

    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"), trained=True)
        newest = os.path.join(workdir, "checkpoints", str(hr.STEPS))
        flip_a_bit(newest if name in ("train", "prepare") else os.path.join(newest, "params"))
        ran = hr.run(command(name, workdir, tmp), f"{workdir}.log", timeout)
        if crash := hr.crashed(ran):
            return crash
        if name == "prepare":
            if ran.code != 0 or not os.path.isdir(newest):
                return (
                    "data loss",
                    f"exit {ran.code}; checkpoint {hr.STEPS} kept: {os.path.isdir(newest)}",
                )
            return "OK", "does not read checkpoints; the damaged one left as it was"
        named = re.search(rf"(step|checkpoint) {hr.STEPS}\b|/{hr.STEPS}\b", ran.out)
        if ran.code == 0 and not named:
            return "silent wrong", f"exit 0 without naming the damaged step {hr.STEPS}"
        if ran.code == 0 and name == "train" and (differs := same_run(workdir, reference)):
            return "silent wrong", differs
        if ran.code == 0:
            return "OK", f"used an older checkpoint, said so: {hr.error_lines(ran.out)[:1]}"
        return hr.refused(ran)

    return trial


def damaged_data(name: str) -> Trial:
    """The prepared training split damaged: train refuses it in one line (or rebuilds it,
    saying so), prepare rebuilds it as it was; the others do not read it."""

    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        trained = name not in ("train", "prepare")
        workdir = hr.prepared_copy(reference, os.path.join(tmp, "run"), trained=trained)
        (split,) = glob.glob(os.path.join(workdir, "data_cache", "train-*"))
        path = flip_a_bit(split)
        ran = hr.run(command(name, workdir, tmp), f"{workdir}.log", timeout)
        if crash := hr.crashed(ran):
            return crash
        if ran.code != 0:
            return hr.refused(ran)
        said = any("damaged" in line for line in hr.error_lines(ran.out) + ran.out.splitlines())
        if name in ("train", "prepare") and not said:
            return "silent wrong", f"exit 0 without a word about {os.path.basename(path)}"
        original = os.path.join(reference, os.path.relpath(path, workdir))
        if name in ("train", "prepare") and not filecmp.cmp(path, original, shallow=False):
            return "silent wrong", f"exit 0, {os.path.basename(path)} still differs"
        return "OK", "rebuilt it, said so" if said else "does not read the prepared data"

    return trial


def read_only(name: str) -> Trial:
    """A trained run on a read-only disk (a tmpfs remounted ro; else a folder without write
    permission, or a path the kernel refuses to root): train refuses in one line, translate
    reads it."""

    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        disk = os.path.join(tmp, "disk")
        how = "tmpfs mounted ro"
        if hr.mount_tmpfs(disk, 64 * 1024):
            workdir = hr.prepared_copy(reference, os.path.join(disk, "run"), trained=True)
            hr.mount_tmpfs(disk, 64 * 1024, read_only=True)
        elif os.geteuid() != 0:
            workdir = hr.prepared_copy(reference, os.path.join(disk, "run"), trained=True)
            for folder, _, _ in os.walk(workdir):
                os.chmod(folder, 0o555)
            how = "folders mode 555"
        else:
            workdir, how = "/sys/hostile_trials_run", "a path under /sys"
        try:
            ran = hr.run(command(name, workdir, tmp), f"{tmp}/{name}.log", timeout)
        finally:
            hr.unmount(disk)
            for folder, _, _ in os.walk(tmp):
                os.chmod(folder, 0o755)
        if name == "train":
            outcome, detail = hr.refused(ran)
            return outcome, f"{how}: {detail}"
        outcome = hr.crashed(ran) or (
            ("OK", f"{how}: exit 0") if ran.code == 0 else hr.refused(ran)
        )
        return outcome[0], outcome[1] if outcome[0] != "OK" else f"{how}: read it, exit 0"

    return trial


def full_disk(same_run: Callable[[str, str], str | None]) -> Trial:
    """The disk fills during a checkpoint save: one line with the OS reason; once there is
    room again a rerun resumes from the last complete checkpoint to the reference."""

    def trial(reference: str, tmp: str, timeout: float) -> tuple[str, str]:
        disk = os.path.join(tmp, "disk")
        if hr.mount_tmpfs(disk, 64 * 1024):
            workdir = hr.prepared_copy(reference, os.path.join(disk, "run"))
            used = sum(
                os.path.getsize(os.path.join(b, n)) for b, _, ns in os.walk(workdir) for n in ns
            )
            hr.mount_tmpfs(disk, used // 1024 + 700)  # room for about one checkpoint
            how, limit = "tmpfs", 0
        else:
            workdir, how, limit = (
                hr.prepared_copy(reference, os.path.join(tmp, "run")),
                "ulimit -f",
                64,
            )
        try:
            ran = hr.run(
                hr.train_command(workdir), f"{tmp}/full.log", timeout, file_limit_kib=limit
            )
            outcome = hr.refused(ran)
            if outcome[0] != "one-line error":
                return outcome[0], f"{how}: {outcome[1]}"
            if not re.search(r"too large|no space left", ran.out, re.IGNORECASE):
                return "silent wrong", f"{how}: the OS reason is not shown: {outcome[1]}"
            if how == "tmpfs":
                hr.mount_tmpfs(disk, 64 * 1024)
            again = hr.run(hr.train_command(workdir), f"{tmp}/again.log", timeout)
            if again.code != 0:
                return "data loss", f"{how}: the rerun: {hr.last_line(again.out)}"
            if differs := same_run(workdir, reference):
                return "silent wrong", f"{how}: after the rerun {differs}"
            return outcome[0], f"{how}: {outcome[1]}; rerun with room: equal"
        finally:
            shutil.rmtree(os.path.join(disk, "run"), ignore_errors=True)
            hr.unmount(disk)

    return trial


def disk_trials(same_run: Callable[[str, str], str | None]) -> dict[str, tuple[str, Trial]]:
    """The trials by name, each with its group (``damaged``, ``disk``)."""
    found: dict[str, tuple[str, Trial]] = {}
    for name in COMMANDS:
        found[f"damaged checkpoint, {name}"] = ("damaged", damaged_checkpoint(name, same_run))
    for name in COMMANDS:
        found[f"damaged prepared data, {name}"] = ("damaged", damaged_data(name))
    found["read-only workdir, train"] = ("disk", read_only("train"))
    found["read-only workdir, translate"] = ("disk", read_only("translate"))
    found["full disk during a save"] = ("disk", full_disk(same_run))
    return found
