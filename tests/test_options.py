"""The command-line options come from the configs' fields: one option per field, the same defaults."""

from __future__ import annotations

import dataclasses

import click
import pytest
from cli_utils import config_of
from click.testing import CliRunner

from nmt_cli.cli import main
from nmt_cli.config import (
    ApplyBpeConfig,
    AverageConfig,
    BinarizeConfig,
    DecodeConfig,
    GenerateConfig,
    ExportConfig,
    FairseqImportConfig,
    InfoConfig,
    LearnBpeConfig,
    MarianImportConfig,
    ModelConfig,
    PlotConfig,
    PreprocessConfig,
    ScoreConfig,
    ServeConfig,
    TrainConfig,
    TranslateConfig,
    TranslateStreams,
)
from nmt_cli.errors import NmtError
from nmt_cli.options import SAME, aliases_of, flag_fields

# command -> (configs its options come from, ModelConfig overrides or not, the required
# arguments of a minimal command line, parameters of the command's own that no config holds)
COMMANDS = {
    "train": ((TrainConfig,), True, ["data-bin"], set()),
    "translate": ((TranslateConfig, TranslateStreams), False, ["--path", "a.pt"], set()),
    "generate": ((GenerateConfig,), False, ["data-bin", "--path", "a.pt"], set()),
    "preprocess": ((PreprocessConfig,), False, ["-s", "en", "-t", "de", "--trainpref", "raw/train"], set()),
    "learn-bpe": ((LearnBpeConfig,), False, ["--input", "a.txt", "--vocab-size", "100", "--model-prefix", "bpe"], set()),
    "apply-bpe": ((ApplyBpeConfig,), False, ["--model", "bpe.model"], set()),
    "binarize": ((BinarizeConfig,), False, ["--dict", "dict.en.txt", "--input", "a.txt", "--output-prefix", "a"], set()),
    "score": ((ScoreConfig,), False, ["--ref", "ref.txt"], set()),
    "average": ((AverageConfig,), False, ["--inputs", "a.pt", "--output", "avg.pt"], {"more_inputs"}),
    "import-fairseq": ((FairseqImportConfig,), False, ["model.pt", "--dict-dir", "data-bin", "--out", "run"], set()),
    "import-marian": ((MarianImportConfig,), False, ["opus-mt-en-de", "--out", "run"], set()),
    "plot": ((PlotConfig,), False, ["run", "-o", "curves.png"], set()),
    "info": ((InfoConfig,), True, [], set()),
    "export": ((ExportConfig,), False, ["run", "out", "--format", "fairseq"], set()),
    "serve": ((ServeConfig,), False, ["--path", "run"], set()),
}


def command(name: str) -> click.Command:
    return main.get_command(click.Context(main), name)


def parsed(name: str, args: list[str]) -> dict:
    return command(name).make_context(name, list(args)).params


@pytest.mark.parametrize("name", COMMANDS)
def test_every_field_has_exactly_one_option_and_every_option_a_field(name: str) -> None:
    configs, with_model, _, own = COMMANDS[name]
    fields = [field.name for config in configs + ((ModelConfig,) if with_model else ()) for field, _ in flag_fields(config)]
    params = [param.name for param in command(name).params]
    # Other programs' flags (fairseq's) that stand for fields: options, but no fields of their own.
    aliases = {alias.param_name for config in configs + ((ModelConfig,) if with_model else ()) for alias in aliases_of(config)}
    assert len(fields) == len(set(fields)), "a field name is used twice"
    assert len(params) == len(set(params))
    assert set(params) == set(fields) | own | aliases
    for config in configs + ((ModelConfig,) if with_model else ()):
        for field in dataclasses.fields(config):  # none is left without a flag
            assert field.metadata or dataclasses.is_dataclass(field.default), (config.__name__, field.name)


@pytest.mark.parametrize("name", [name for name, (configs, *_) in COMMANDS.items() if configs])
def test_an_absent_flag_gives_the_field_default_and_help_shows_it(name: str) -> None:
    configs, _, required, _ = COMMANDS[name]
    params = parsed(name, required)
    help_text = " ".join(CliRunner().invoke(main, [name, "--help"], terminal_width=1000).output.split())
    options = {param.name: param for param in command(name).params}
    checked = 0
    for config in configs:
        for field, flag in flag_fields(config):
            if flag.required or flag.argument:
                continue
            if flag.cli_default is None and flag.to_value is None:
                # Resolved by the command (the machine, a terminal): the help says how.
                assert params[field.name] is None and "[default:" in flag.help, field.name
                continue
            value = flag.to_value(params[field.name]) if flag.to_value is not None else params[field.name]
            assert value == field.default and type(value) is type(field.default), (field.name, value)
            shown = options[field.name].show_default
            if shown is None:
                shown = bool(command(name).context_settings.get("show_default"))
            if shown and field.default is not None and not isinstance(field.default, bool):
                text = flag.cli_default if flag.cli_default is not SAME else field.default
                assert f"[default: {text}]" in help_text, field.name
            checked += 1
    assert checked >= 1


@pytest.mark.parametrize("name", ["train", "info"])
def test_model_options_default_to_the_preset(name: str) -> None:
    params = parsed(name, COMMANDS[name][2])
    for field, _ in flag_fields(ModelConfig):
        assert params[field.name] is None, field.name


def test_train_flags_reach_the_config() -> None:
    cfg = config_of("train", ["data-bin", "--save-dir", "run", "--max-sentences", "64", "--wd", "0.01",
                              "--adam-betas", "0.9 0.997", "--max-time", "1h30m", "--compile", "-a", "transformer_tiny"],
                    TrainConfig)
    assert (cfg.data, cfg.save_dir, cfg.arch) == ("data-bin", "run", "transformer_tiny")
    assert (cfg.batch_size, cfg.weight_decay, cfg.adam_betas) == (64, 0.01, (0.9, 0.997))
    assert cfg.max_time == 5400.0 and cfg.compile is True
    assert cfg == dataclasses.replace(TrainConfig(data="data-bin", save_dir="run"), arch="transformer_tiny",
                                      batch_size=64, weight_decay=0.01, adam_betas=(0.9, 0.997), max_time=5400.0,
                                      compile=True)


def test_translate_flags_reach_the_nested_decode_config() -> None:
    cfg = config_of("translate", ["--path", "a.pt:b.pt", "--beam", "4", "--lenpen", "0.6", "--lenpen-style", "gnmt",
                                  "--no-cuda-graphs", "-q"], TranslateConfig, buffer_size=7, device="cpu")
    assert cfg.checkpoints == ("a.pt", "b.pt") and cfg.buffer_size == 7 and cfg.quiet and cfg.cuda_graphs is False
    assert cfg.decode == DecodeConfig(beam=4, lenpen=0.6, lenpen_style="gnmt")


@pytest.mark.parametrize("name, args, field", [
    ("translate", ["--path", "a.pt"], "cuda_graphs"),
    ("preprocess", ["-s", "en", "-t", "de", "--trainpref", "raw/train"], "normalize_punctuation"),
])
def test_an_auto_switch_is_none_unless_given_and_its_help_says_what_none_picks(name: str, args: list[str],
                                                                               field: str) -> None:
    flag = "--" + field.replace("_", "-")
    assert parsed(name, args)[field] is None
    assert parsed(name, args + [flag])[field] is True
    assert parsed(name, args + ["--no-" + flag[2:]])[field] is False
    help_text = CliRunner().invoke(main, [name, "--help"], terminal_width=200).output
    assert f"{flag} / --no-{flag[2:]}" in help_text and "[default: on" in help_text


@pytest.mark.parametrize("settings, message", [
    ({"precision": "int8", "device": "cuda:0"}, "--precision int8 needs --device cpu"),
    ({"precision": "fp16", "device": "cpu"}, "--precision fp16 needs --device cuda"),
    ({"cuda_graphs": True, "device": "cpu"}, "--cuda-graphs needs --device cuda"),
])
def test_translate_config_checks_the_device(settings: dict, message: str) -> None:
    with pytest.raises(NmtError, match=message):
        TranslateConfig(checkpoints=("a.pt",), **settings)


def test_translate_config_refuses_cuda_without_a_device() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(NmtError, match="--device cuda: no CUDA device is available"):
        TranslateConfig(checkpoints=("a.pt",), device="cuda")


def test_every_command_is_checked_here() -> None:
    from nmt_cli.cli import COMMANDS as ALL_COMMANDS

    assert set(ALL_COMMANDS) == set(COMMANDS)


def test_a_path_holding_a_nul_byte_is_one_usage_error() -> None:
    result = CliRunner().invoke(main, ["translate", "--path", "a.pt", "--prefix-file", "a\x00b"])
    assert result.exit_code == 2 and "holds a NUL byte" in result.output and result.exception is not None
    assert not isinstance(result.exception, ValueError)
