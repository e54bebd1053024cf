"""Every packaged config (``transformer_jax/configs``) passes train.py's validation; base and
big are the paper's; the clone's ``configs/`` files are the packaged ones."""

import importlib
import importlib.util
import os

import pytest
from conftest import ROOT

from transformer_jax.configs import NAMES
from transformer_jax.kernels import cpuinfo
from transformer_jax.model.config import TransformerConfig
from transformer_jax.training.schema import RunConfig
from transformer_jax.training.validation import validate_config


def load(name, *args):
    return importlib.import_module(f"transformer_jax.configs.{name}").get_config(*args)


def test_the_clones_config_files_re_export_the_packaged_ones():
    """``--config configs/NAME.py`` and ``--config NAME``: one body per config, in the package."""
    files = sorted(f[:-3] for f in os.listdir(ROOT / "configs") if f.endswith(".py"))
    assert files == sorted(NAMES)
    for name in NAMES:
        spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert (
            module.get_config
            is importlib.import_module(f"transformer_jax.configs.{name}").get_config
        )


@pytest.mark.parametrize("name", NAMES)
def test_config_file_is_valid(name, tmp_path):
    config = load(name)
    if config.data.source == "text":  # the data directory is not part of the project
        config.data.text_dir = str(tmp_path)
    model = validate_config(RunConfig.from_config(config))
    assert model.vocab_size == config.model.vocab_size


@pytest.mark.parametrize("name", NAMES)
def test_config_data_paths_stay_inside_the_clone(name):
    data = load(name).data
    for path in (data.text_dir, data.tfds_data_dir):
        assert not os.path.isabs(path) and ".." not in path.split("/"), path


def test_multi30k_without_its_data_names_the_download_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a clone without data/multi30k
    command = "python -m transformer_jax.download multi30k --dest data/multi30k"
    with pytest.raises(ValueError, match=f"^data.text_dir='data/multi30k' .*{command}"):
        validate_config(RunConfig.from_config(load("multi30k")))


def test_base_and_big_are_the_papers_table_3_models():
    base, big = (
        validate_config(RunConfig.from_config(load("base"))),
        validate_config(RunConfig.from_config(load("big"))),
    )
    assert base == TransformerConfig()  # d_model 512, h 8, d_ff 2048, N 6, P_drop 0.1
    assert (big.d_model, big.num_heads, big.d_ff, big.dropout_rate) == (1024, 16, 4096, 0.3)
    assert big.num_encoder_layers == big.num_decoder_layers == 6


def test_multi30k_takes_the_budget_it_was_tuned_for(tmp_path):
    """``--config multi30k:60``: smaller, deeper, own dropout, schedule, alpha; the rest as 30."""
    short, thirty, long = load("multi30k"), load("multi30k", "30"), load("multi30k", "60")
    assert short.to_dict() == thirty.to_dict()
    long.data.text_dir = short.data.text_dir = str(tmp_path)  # not part of the project
    small = validate_config(RunConfig.from_config(long))
    assert (small.d_model, small.num_heads, small.d_ff) == (128, 4, 256)
    assert (small.num_encoder_layers, small.num_decoder_layers, small.dropout_rate) == (4, 4, 0.2)
    assert (short.train.learning_rate_scale, long.train.learning_rate_scale) == (0.6, 2.5)
    assert (short.train.warmup_steps, long.train.warmup_steps) == (200, 2000)
    assert (short.decode.alpha, long.decode.alpha) == (0.6, 1.5)
    sized = ("d_model", "num_heads", "d_ff", "num_encoder_layers", "num_decoder_layers")
    for field in (*sized, "dropout_rate"):
        setattr(long.model, field, getattr(short.model, field))
    for field in ("learning_rate_scale", "warmup_steps"):
        setattr(long.train, field, getattr(short.train, field))
    long.decode.alpha = short.decode.alpha
    assert long.to_dict() == short.to_dict()
    with pytest.raises(ValueError, match="BUDGET takes one of"):
        load("multi30k", "45")


def test_multi30k_ensemble_members_take_60s_model_with_their_own_schedule():
    """``:60x2`` (each of two models on one core for 60 minutes): ``:60`` with warmup 1,000 at
    scale 1.77, the same peak rate reached sooner, and weight decay 0.1."""
    single, member = load("multi30k", "60"), load("multi30k", "60x2")
    assert (member.train.warmup_steps, member.train.learning_rate_scale) == (1000, 1.77)
    assert (member.train.weight_decay, single.train.weight_decay) == (0.1, 0.0)
    peak = lambda c: c.train.learning_rate_scale * c.train.warmup_steps**-0.5  # noqa: E731
    assert peak(member) == pytest.approx(peak(single), rel=2e-3)
    member.train.warmup_steps, member.train.learning_rate_scale = 2000, 2.5
    member.train.weight_decay = 0.0
    assert member.to_dict() == single.to_dict()


def test_loading_a_config_reads_nothing_of_the_host(monkeypatch):
    """The configs name host-dependent choices 'auto' (multi30k: the products' arithmetic);
    loading one never reads the CPU's flags."""

    def refuse(path=cpuinfo.CPUINFO):
        raise AssertionError("a config read /proc/cpuinfo while loading")

    monkeypatch.setattr(cpuinfo, "cpu_flags", refuse)
    for name in NAMES:
        load(name)
    for budget in ("30", "60", "60x2"):
        assert load("multi30k", budget).model.matmul_precision == "auto"


@pytest.mark.parametrize(
    "flags,expected", [("avx2 avx512f avx512_bf16", "bfloat16"), ("avx2", "float32")]
)
def test_multi30k_multiplies_in_the_cpus_fastest_arithmetic(monkeypatch, tmp_path, flags, expected):
    """Validation at run start resolves 'auto': bfloat16 products on CPUs with bfloat16
    instructions, float32 on others."""
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(cpuinfo, "cpu_flags", lambda path=cpuinfo.CPUINFO: frozenset(flags.split()))
    config = load("multi30k")
    config.data.text_dir = str(tmp_path)
    assert validate_config(RunConfig.from_config(config)).matmul_precision == expected
    assert config.model.matmul_precision == "auto"  # config.json keeps the choice
