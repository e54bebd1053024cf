"""translate / evaluate / average commands on a tiny workdir built here (tokenizer, random
parameters of a tiny model saved as checkpoints, config.json): output order and format,
BLEU, checkpoint averaging, and clear errors without tracebacks."""

import io
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, flip_a_bit

from transformer_jax import Transformer
from transformer_jax.cli.average import main as average_main
from transformer_jax.cli.evaluate import main as evaluate_main
from transformer_jax.cli.translate import main as translate_main
from transformer_jax.data.tokenizer import load_tokenizer, train_tokenizer
from transformer_jax.inference.bleu import bleu, tokenized_bleu
from transformer_jax.inference.translation import translate_lines
from transformer_jax.training.averaging import average_params
from transformer_jax.training.checkpoints import CHECKPOINT_DIR, load_run, save_params
from transformer_jax.training.schema import RunConfig, default_config

SENTENCES = [
    "The cat sits on the mat.",
    "Die Katze sitzt auf der Matte.",
    "A small house by the river.",
    "Ein kleines Haus am Fluss.",
    "We read the rich-text document today.",
    "Wir lesen heute das Rich-Text-Dokument.",
] * 4
STEPS = (100, 200, 300)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A run directory as train.py leaves it, with three checkpoints of random weights."""
    path = str(tmp_path_factory.mktemp("run"))
    tokenizer = train_tokenizer(SENTENCES, os.path.join(path, "tokenizer.model"), 300)
    config = default_config()
    config.model.update(
        vocab_size=tokenizer.vocab_size,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        max_len=24,
    )
    config.data.max_len = 24
    config.decode.max_extra_len = 6
    config = RunConfig.from_config(config)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(config.to_json())
    model = Transformer(config.model)
    src = jnp.ones((1, 4), jnp.int32)
    init = jax.jit(model.init)
    for seed, step in enumerate(STEPS):
        params = jax.device_get(init(jax.random.key(seed), src, src)["params"])
        save_params(os.path.join(path, CHECKPOINT_DIR), params, step)
    return path


def write(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return str(path)


def test_translate_keeps_order_empty_lines_and_truncates(
    workdir, tmp_path, capsys, caplog, monkeypatch
):
    # U+2028 is no line break for the command: the output stays aligned with the input.
    lines = ["The cat sits.", "", "Ein Haus\u2028am Fluss.", "   ", " ".join(["river"] * 40)]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(lines).encode())))
    assert translate_main(["--workdir", workdir, "--beam_size", "1"]) == 0
    captured = capsys.readouterr()
    out = captured.out.split("\n")
    assert len(out) == len(lines) + 1 and out[-1] == ""
    assert out[1] == "" and out[3] == "" and out[0] and out[2]
    assert "were truncated" in captured.err + caplog.text  # pytest captures the log

    # --input gives the same; each line alone translates as inside the batch
    assert translate_main(["--workdir", workdir, "--beam_size", "1", "--input",
                           write(tmp_path / "in.txt", lines)]) == 0  # fmt: skip
    assert capsys.readouterr().out.split("\n") == out
    run, params, _ = load_run(workdir)
    cfg, tok = run.model, load_tokenizer(os.path.join(workdir, "tokenizer.model"))
    kept = [lines[0], lines[2]]
    together = translate_lines(cfg, params, tok, kept, beam_size=1, max_extra_len=6)
    alone = [translate_lines(cfg, params, tok, [x], beam_size=1, max_extra_len=6)[0] for x in kept]
    assert together == alone == [out[0], out[2]]


def test_repeated_workdirs_translate_as_an_ensemble(workdir, tmp_path, capsys):
    """``--workdir A --workdir B``: the runs' mean probabilities, with one tokenizer."""
    earlier = tmp_path / "earlier"  # the same run without its newest checkpoint
    shutil.copytree(workdir, earlier)
    shutil.rmtree(earlier / CHECKPOINT_DIR / str(STEPS[-1]))
    lines = ["The cat sits on the mat.", "A small house by the river."]
    source = write(tmp_path / "in.txt", lines)
    argv = ["--workdir", workdir, "--workdir", str(earlier), "--input", source, "--alpha", "0.6"]
    assert translate_main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    run, params, _ = load_run(workdir)
    cfg, tok = run.model, load_tokenizer(os.path.join(workdir, "tokenizer.model"))
    both = [params, load_run(workdir, STEPS[-2])[1]]
    assert out == translate_lines(cfg, both, tok, lines, max_extra_len=6)
    assert out != translate_lines(cfg, params, tok, lines, max_extra_len=6)

    reference = write(tmp_path / "ref.txt", lines)
    argv = ["--workdir", workdir, "--workdir", str(earlier), "--src", source, "--ref", reference]
    assert evaluate_main(argv) == 0
    with open(f"{source}.hyp.bleu", encoding="utf-8") as f:
        assert "ensemble of 2 runs" in f.readline()

    other = tmp_path / "other_tokenizer"
    shutil.copytree(workdir, other)
    train_tokenizer(SENTENCES[::-1] + ["Another line."], str(other / "tokenizer.model"), 300)
    assert translate_main(["--workdir", workdir, "--workdir", str(other), "--input", source]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "must share one tokenizer" in err


def test_average_is_the_mean_of_the_last_checkpoints(workdir, capsys):
    assert average_main(["--workdir", workdir, "--last", "2"]) == 0
    assert "[200, 300]" in capsys.readouterr().out
    _, averaged, step = load_run(workdir, "averaged")
    assert step == 300
    expected = jax.tree.map(
        lambda a, b: (np.asarray(a) + np.asarray(b)) / 2,
        load_run(workdir, 200)[1],
        load_run(workdir, 300)[1],
    )
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), averaged, expected)
    mean = average_params([{"w": np.float32([1, 2])}, {"w": np.float32([2, 4])}])
    assert mean["w"].dtype == np.float32 and mean["w"].tolist() == [1.5, 3.0]


def test_evaluate_writes_hypotheses_and_both_bleus(workdir, tmp_path, capsys):
    average_main(["--workdir", workdir, "--last", "3"])
    src = write(tmp_path / "test.en", ["The cat sits on the mat.", "A small house."])
    ref = write(tmp_path / "test.de", ["Die Katze sitzt auf der Matte.", "Ein kleines Haus."])
    argv = ["--workdir", workdir, "--src", src, "--ref", ref, "--checkpoint", "averaged"]
    assert evaluate_main(argv) == 0
    out = capsys.readouterr().out
    assert "sacreBLEU (detokenized, comparable)" in out and "nrefs:1|case:mixed" in out
    assert "tokenized BLEU (paper style: Moses-tokenized, compounds split" in out
    with open(f"{src}.hyp", encoding="utf-8") as f:
        assert len(f.read().splitlines()) == 2
    assert os.path.isfile(f"{src}.hyp.bleu")


def test_bleu_scores():
    result = bleu(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert result.score == pytest.approx(100.0) and "tok:13a" in result.signature
    with pytest.raises(ValueError, match="references"):
        bleu(["a"], ["a", "b"])
    # Compound splitting: "rich ##AT##-##AT## text" shares 2 of 3 unigrams with "rich-Text".
    hyp, ref = ["rich-text"], ["rich-Text"]
    assert tokenized_bleu(hyp, ref, "de").precisions[0] == pytest.approx(200 / 3)
    assert tokenized_bleu(hyp, ref, "en").precisions[0] == 0.0


@pytest.fixture
def damaged(workdir, tmp_path):
    """The workdir with one bit flipped in its newest checkpoint's parameters."""
    path = tmp_path / "damaged"
    shutil.copytree(workdir, path)
    shutil.rmtree(path / "averaged", ignore_errors=True)  # written by other tests
    flip_a_bit(path / CHECKPOINT_DIR / str(STEPS[-1]) / "params")
    return str(path)


def test_a_damaged_newest_checkpoint_is_skipped_with_one_line(workdir, damaged, tmp_path, capsys):
    source = write(tmp_path / "in.txt", ["The cat sits on the mat."])
    assert translate_main(["--workdir", damaged, "--input", source, "--beam_size", "1"]) == 0
    captured = capsys.readouterr()
    (warning,) = captured.err.splitlines()
    assert warning.startswith(f"warning: checkpoint {STEPS[-1]} in ") and "checksum" in warning
    argv = ["--workdir", workdir, "--checkpoint", str(STEPS[-2]), "--input", source]
    assert translate_main([*argv, "--beam_size", "1"]) == 0
    assert captured.out == capsys.readouterr().out  # the previous checkpoint's translation
    _, _, step = load_run(damaged)
    assert step == STEPS[-2]


@pytest.mark.parametrize("command", ["translate", "evaluate", "average"])
def test_a_damaged_checkpoint_named_or_averaged_is_refused(damaged, tmp_path, capsys, command):
    src = write(tmp_path / "src.txt", ["The cat sits on the mat."])
    named = ["--checkpoint", str(STEPS[-1])]
    argv = {
        "translate": ["--workdir", damaged, "--input", src, *named],
        "evaluate": ["--workdir", damaged, "--src", src, "--ref", src, *named],
        "average": ["--workdir", damaged, "--last", "2"],
    }[command]
    main = {"translate": translate_main, "evaluate": evaluate_main, "average": average_main}
    assert main[command](argv) != 0
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith(f"error: checkpoint {STEPS[-1]} in ") and "damaged" in line
    assert "checksum mismatch in params" in line and captured.out == ""
    assert not os.path.exists(os.path.join(damaged, "averaged"))


def test_a_damaged_average_is_refused_and_other_shapes_named(workdir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(workdir, run)
    assert average_main(["--workdir", str(run), "--last", "2"]) == 0
    flip_a_bit(run / "averaged")
    src = write(tmp_path / "src.txt", ["The cat sits on the mat."])
    assert translate_main(["--workdir", str(run), "--input", src, "--checkpoint", "averaged"])
    assert "checksum mismatch" in capsys.readouterr().err
    saved = (run / "config.json").read_text()
    assert '"d_ff": 32' in saved
    (run / "config.json").write_text(saved.replace('"d_ff": 32', '"d_ff": 64'))
    assert translate_main(["--workdir", str(run), "--input", src]) == 1
    err = capsys.readouterr().err
    assert "holds other params arrays than config.json describes" in err and "shape" in err


@pytest.fixture
def broken(workdir, tmp_path):
    """Workdirs missing one piece each."""
    only_config = tmp_path / "only_config"
    only_config.mkdir()
    shutil.copy(os.path.join(workdir, "config.json"), only_config)
    no_checkpoint = tmp_path / "no_checkpoint"
    no_checkpoint.mkdir()
    for name in ("config.json", "tokenizer.model"):
        shutil.copy(os.path.join(workdir, name), no_checkpoint)
    truncated = tmp_path / "truncated_tokenizer"
    shutil.copytree(workdir, truncated)
    model = truncated / "tokenizer.model"
    model.write_bytes(model.read_bytes()[:300])
    return {
        "tokenizer": str(only_config),
        "checkpoint": str(no_checkpoint),
        "truncated": str(truncated),
    }


@pytest.mark.parametrize(
    "command, case, message",
    [
        ("translate", "workdir", "does not exist"),
        ("translate", "tokenizer", "no tokenizer"),
        ("translate", "checkpoint", "checkpoint"),
        ("translate", "input", "input file"),
        ("translate", "utf16", "UTF-16"),
        ("translate", "truncated", "not a sentencepiece model"),
        ("evaluate", "empty", "is empty"),
        ("evaluate", "workdir", "does not exist"),
        ("evaluate", "input", "does not exist"),
        ("average", "workdir", "does not exist"),
        ("average", "checkpoint", "no checkpoints"),
        ("average", "last", "needs 9 checkpoints"),
    ],
)
def test_errors_are_clear(workdir, broken, tmp_path, capsys, command, case, message):
    run = {"workdir": str(tmp_path / "missing"), **broken}.get(case, workdir)
    src = write(tmp_path / "src.txt", ["hello"])
    missing = str(tmp_path / "missing.txt")
    if case == "empty":
        src = write(tmp_path / "empty.txt", [])
    if case == "utf16":
        src = str(tmp_path / "utf16.txt")
        with open(src, "wb") as f:
            f.write("hello\n".encode("utf-16"))
    argv = {
        "translate": ["--workdir", run, "--input", missing if case == "input" else src],
        "evaluate": ["--workdir", run, "--src", missing if case == "input" else src, "--ref", src],
        "average": ["--workdir", run, "--last", "9" if case == "last" else "1"],
    }[command]
    main = {"translate": translate_main, "evaluate": evaluate_main, "average": average_main}
    assert main[command](argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_command_line_error_exits_nonzero_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "transformer_jax.translate", "--workdir", str(tmp_path / "none")],
        input="hello\n",
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        timeout=120,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert "error: workdir" in result.stderr and "Traceback" not in result.stderr
