"""A workdir written by an earlier version of the code resumes: ``tests/fixtures/
workdir-7a0f9a5.tar.gz`` is a 6-step run of a small synthetic model (config.json,
tokenizer.model, run_info.json, metrics.jsonl, checkpoints/6; its prepared data left out)
trained by commit 7a0f9a5 with the flags below; today's ``train.py`` resumes it to step 8."""

import json
import subprocess
import sys
import tarfile

from conftest import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "workdir-7a0f9a5.tar.gz"
FLAGS = [
    "--config.model.vocab_size=300",
    "--config.model.d_model=16",
    "--config.model.num_heads=2",
    "--config.model.d_ff=32",
    "--config.model.num_encoder_layers=1",
    "--config.model.num_decoder_layers=1",
    "--config.train.checkpoint_every=3",
    "--config.train.warmup_steps=3",
    "--config.data.tokenizer_train_sentences=2000",
    "--config.train.eval_sentences=8",
    "--config.data.tokens_per_batch=512",
]


def test_a_workdir_of_commit_7a0f9a5_resumes(tmp_path):
    workdir = tmp_path / "run"
    with tarfile.open(FIXTURE) as archive:
        archive.extractall(workdir, filter="data")
    saved = (workdir / "config.json").read_text()
    command = [sys.executable, "train.py", "--workdir", str(workdir), *FLAGS]
    result = subprocess.run(
        [*command, "--config.train.num_steps=8"], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == [6, 8], steps  # the old step 6, then the resumed run's log at step 8
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [
        "6",
        "8",
    ]
    saved_fields = json.loads(saved)
    assert json.loads((workdir / "config.json").read_text())["model"] == saved_fields["model"]
