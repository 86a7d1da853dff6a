"""fairseq's documented commands run with `fairseq-X` replaced by `nmt X`.

The commands are those of fairseq's examples/translation/README.md (IWSLT14 De-En,
WMT14 En-De / En-Fr) and examples/scaling_nmt/README.md, changed only by the
executable's name, small generated data (already segmented with subword-nmt's `@@ `,
as those recipes' text is) and, for training, a tiny model and a couple of updates.
Every flag there is taken with fairseq's meaning or refused by name in one line.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
from pathlib import Path

import pytest
from cli_utils import config_of
from click.testing import CliRunner
from fairseq_commands import run_fairseq_commands

from nmt_cli.cli import main
from nmt_cli.config import GenerateConfig, TrainConfig, TranslateConfig
from nmt_cli.errors import NmtError
from nmt_cli.options import config_from_params
from nmt_cli.preprocess.segmented import SENTENCEPIECE, SUBWORD_NMT, find_segmentation
from nmt_cli.train import trainer as trainer_module

# fairseq's commands, as its READMEs write them ($TEXT: the segmented text's directory).
IWSLT14_PREPROCESS = ("fairseq-preprocess --source-lang de --target-lang en --trainpref $TEXT/train "
                      "--validpref $TEXT/valid --testpref $TEXT/test --destdir data-bin/iwslt14.tokenized.de-en "
                      "--workers 20")
IWSLT14_TRAIN = ("fairseq-train data-bin/iwslt14.tokenized.de-en --arch transformer_iwslt_de_en "
                 "--share-decoder-input-output-embed --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 "
                 "--lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --dropout 0.3 --weight-decay 0.0001 "
                 "--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 --eval-bleu "
                 "--eval-bleu-args '{\"beam\": 5, \"max_len_a\": 1.2, \"max_len_b\": 10}' --eval-bleu-detok moses "
                 "--eval-bleu-remove-bpe --eval-bleu-print-samples --best-checkpoint-metric bleu "
                 "--maximize-best-checkpoint-metric")
INTERACTIVE = ("fairseq-interactive --path $MODEL_DIR/model.pt $MODEL_DIR --beam 5 --source-lang en --target-lang fr "
               "--tokenizer moses --bpe subword_nmt --bpe-codes $MODEL_DIR/bpecodes")
WMT14_PREPROCESS = ("fairseq-preprocess --source-lang en --target-lang de --trainpref $TEXT/train.tok.clean.bpe.32000 "
                    "--validpref $TEXT/newstest2013.tok.bpe.32000 --testpref $TEXT/newstest2014.tok.bpe.32000 "
                    "--destdir data-bin/wmt16_en_de_bpe32k --nwordssrc 32768 --nwordstgt 32768 --joined-dictionary "
                    "--workers 20")
WMT14_TRAIN = ("fairseq-train data-bin/wmt16_en_de_bpe32k --arch transformer_vaswani_wmt_en_de_big "
               "--share-all-embeddings --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr 0.0005 "
               "--lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-07 --dropout 0.3 "
               "--weight-decay 0.0 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 3584 "
               "--fp16 --update-freq 16")
WMT14_AVERAGE = ("scripts/average_checkpoints.py --inputs /path/to/checkpoints --num-epoch-checkpoints 10 "
                 "--output checkpoint.avg10.pt")
# examples/translation's WMT14 En-Fr training and the general training flags of its commands.
WMT14_EN_FR_TRAIN = ("fairseq-train data-bin/wmt14_en_fr --arch transformer_wmt_en_de --max-tokens 4096 "
                     "--stop-time-hours 1 --save-interval-updates 1 --keep-interval-updates 2 --ddp-backend c10d "
                     "--log-format json --log-interval 1 --restore-file checkpoint_last.pt "
                     "--encoder-normalize-before --decoder-normalize-before --no-epoch-checkpoints --max-epoch 5 "
                     "--patience 3 --seed 2 --cpu --num-workers 4 --no-progress-bar")
# examples/translation's convolutional models: refused by name, at the first flag nmt cannot honour.
FCONV_WMT14_EN_FR_TRAIN = ("fairseq-train data-bin/wmt14_en_fr --arch fconv_wmt_en_fr --dropout 0.1 "
                           "--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --optimizer nag "
                           "--clip-norm 0.1 --lr 0.5 --lr-scheduler fixed --force-anneal 50 --max-tokens 3000 "
                           "--save-dir checkpoints/fconv_wmt_en_fr")
# The validation-BLEU flags belong to nmt's validation-BLEU feature; left out where it is absent.
VALIDATION_BLEU_FLAGS = ("--eval-bleu", "--eval-bleu-args", "--eval-bleu-detok", "--eval-bleu-remove-bpe",
                         "--eval-bleu-print-samples", "--best-checkpoint-metric", "--maximize-best-checkpoint-metric")
TINY_MODEL = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
              "--decoder-ffn-embed-dim", "32", "--encoder-layers", "1", "--decoder-layers", "1",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--max-update", "2"]

# An untrained model writes the longest output allowed: keep it short.
SHORT_OUTPUT = ["--max-len-b", "4"]
STEMS = ["qu", "ick", "bro", "wn", "fox", "ju", "mps", "ov", "er", "la", "zy", "do", "g", "hau", "s", "ka", "tze"]


def nmt_args(command: str, **paths: str) -> list[str]:
    """fairseq's command as nmt's arguments: `fairseq-X` -> `X`, $NAME -> paths[NAME]."""
    for name, value in paths.items():
        command = command.replace(f"${name}", value)
    words = shlex.split(command)
    executable = words[0]
    if executable.endswith("average_checkpoints.py"):
        return ["average", *words[1:]]
    if executable == "fairseq-interactive":
        return ["translate", *words[1:]]
    return [executable.removeprefix("fairseq-"), *words[1:]]


def nmt(args: list[str]):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def segmented_line(rng: random.Random) -> str:
    words = []
    for _ in range(rng.randint(3, 9)):
        parts = [rng.choice(STEMS) for _ in range(rng.randint(1, 3))]
        words.append(" ".join([p + "@@" for p in parts[:-1]] + [parts[-1]]))
    return " ".join(words + [rng.choice([".", ",", "&quot;", "!"])])


def write_segmented(directory: Path, names: dict[str, int], langs: tuple[str, str], seed: int = 0) -> None:
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name, count in names.items():
        for lang in langs:
            lines = [segmented_line(rng) for _ in range(count)]
            (directory / f"{name}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def without_validation_bleu(args: list[str]) -> list[str]:
    """`args` less the validation-BLEU flags (and their values) when `nmt train` lacks them."""
    if "--eval-bleu" in nmt(["train", "--help"]).output:
        return args
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in VALIDATION_BLEU_FLAGS:
            skip = arg in ("--eval-bleu-args", "--eval-bleu-detok", "--best-checkpoint-metric")
            continue
        kept.append(arg)
    return kept


@pytest.fixture(scope="module")
def iwslt(tmp_path_factory) -> Path:
    """IWSLT14's preprocess and train commands run in a work directory; returns it."""
    work = tmp_path_factory.mktemp("iwslt")
    write_segmented(work / "text", {"train": 60, "valid": 8, "test": 8}, ("de", "en"))
    cwd = os.getcwd()
    os.chdir(work)
    try:
        result = nmt(nmt_args(IWSLT14_PREPROCESS, TEXT="text"))
        assert result.exit_code == 0, result.output
        assert "input already segmented ('@@' pieces): taken as it is" in result.stdout
        train = without_validation_bleu(nmt_args(IWSLT14_TRAIN)) + TINY_MODEL  # fairseq's --save-dir: checkpoints
        result = nmt(train)
        assert result.exit_code == 0, result.output
    finally:
        os.chdir(cwd)
    return work


def test_iwslt14_preprocess_takes_segmented_text_as_it_is(iwslt: Path) -> None:
    data = iwslt / "data-bin" / "iwslt14.tokenized.de-en"
    meta = json.loads((data / "meta.json").read_text())
    assert meta["bpe"] is None and meta["tokenizer"]["name"] == "none" and meta["segmented_input"] == SUBWORD_NMT
    symbols = [line.split()[0] for line in (data / "dict.de.txt").read_text().splitlines()
               if not line.startswith("madeupword")]  # fairseq's padding of the size to a multiple of 8
    train_words = {w for line in (iwslt / "text" / "train.de").read_text().splitlines() for w in line.split()}
    assert set(symbols) == train_words  # every piece kept whole: no `qu @ @`, nothing else
    assert meta["counts"]["test"]["sentences"] == 8


def test_iwslt14_train_ran_with_fairseqs_flags(iwslt: Path) -> None:
    run = iwslt / "checkpoints"
    assert (run / "checkpoint_best.pt").is_file() and (run / "checkpoint_last.pt").is_file()
    config = json.loads((run / "config.json").read_text())
    assert config["arch"] == "transformer_iwslt_de_en" and config["model"]["share_decoder_input_output_embed"]
    assert config["train"]["weight_decay"] == 0.0001 and config["train"]["label_smoothing"] == 0.1


def test_interactive_style_translate_with_a_positional_data_directory(iwslt: Path) -> None:
    data, run = iwslt / "data-bin" / "iwslt14.tokenized.de-en", iwslt / "checkpoints"
    source = iwslt / "input.de"
    source.write_text("qu@@ ick fox\nla@@ zy do@@ g .\n", encoding="utf-8")
    args = nmt_args(INTERACTIVE, MODEL_DIR=str(run)) + ["-i", source]
    args[args.index(f"{run}/model.pt")] = run / "checkpoint_best.pt"
    args[args.index("en")], args[args.index("fr")] = "de", "en"
    for flag in ("--tokenizer", "--bpe", "--bpe-codes"):  # this run's pipeline: pre-segmented, no BPE model
        del args[args.index(flag):args.index(flag) + 2]
    plain = nmt(["translate", "--path", run / "checkpoint_best.pt", "--data-bin", data, "-i", source, "--beam", "5",
                 *SHORT_OUTPUT])
    styled = nmt(args + ["--cpu", "--remove-bpe", "--max-sentences", "1", "--buffer-size", "1", *SHORT_OUTPUT])
    assert plain.exit_code == 0 and styled.exit_code == 0, styled.output
    assert styled.stdout == plain.stdout and len(plain.stdout.splitlines()) == 2
    assert "@@" not in plain.stdout  # pieces joined back into words


def test_interactive_command_as_written_for_a_run_with_moses_and_subword_nmt(iwslt: Path, tmp_path: Path) -> None:
    """fairseq-interactive's README command, on a run directory whose meta.json says Moses and
    subword-nmt codes (as `nmt import-fairseq` writes for fairseq's models): accepted as written."""
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(iwslt / "checkpoints", model_dir, ignore=shutil.ignore_patterns("checkpoint_last.pt"))
    (model_dir / "checkpoint_best.pt").rename(model_dir / "model.pt")
    codes = "#version: 0.2\nq u\nqu i\n"
    (model_dir / "bpe.codes").write_text(codes, encoding="utf-8")
    (model_dir / "bpecodes").write_text(codes, encoding="utf-8")  # the file fairseq's command names
    meta = json.loads((model_dir / "meta.json").read_text())
    meta.pop("segmented_input")
    meta |= {"tokenizer": {"name": "moses", "normalize_punctuation": False, "aggressive_dash_splits": True,
                           "escape": True},
             "bpe": {"type": "subword_nmt", "codes": "bpe.codes", "separator": "@@"}}
    (model_dir / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    source = tmp_path / "input.de"
    source.write_text("quick fox.\n", encoding="utf-8")
    args = nmt_args(INTERACTIVE.replace("en --target-lang fr", "de --target-lang en"), MODEL_DIR=str(model_dir))
    result = nmt(args + ["-i", source, *SHORT_OUTPUT])
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
    (model_dir / "bpecodes").write_text(codes + "f o\n", encoding="utf-8")
    result = nmt(args + ["-i", source, *SHORT_OUTPUT])
    assert result.exit_code == 1 and result.stderr.startswith(f"error: --bpe-codes {model_dir}/bpecodes: not the BPE codes")


def test_interactive_bpe_codes_segment_raw_input_for_a_data_bin_of_segmented_text(iwslt: Path) -> None:
    """The data was segmented before preprocessing: fairseq-interactive's --tokenizer moses
    --bpe subword_nmt --bpe-codes say how, and raw text is segmented that way."""
    run = iwslt / "checkpoints"
    codes = iwslt / "bpecodes"
    # Hand-applied: "quick" -> q u i c k</w> -> qu i c k</w> -> qu ic k</w> -> qu ick</w>: "qu@@ ick".
    codes.write_text("#version: 0.2\nq u\ni c\nic k</w>\n", encoding="utf-8")
    raw, segmented = iwslt / "raw.de", iwslt / "segmented.de"
    raw.write_text("quick.\n", encoding="utf-8")
    segmented.write_text("qu@@ ick .\n", encoding="utf-8")
    base = ["translate", "--path", run / "checkpoint_best.pt", run, "--output-format", "bpe", *SHORT_OUTPUT]
    interactive = nmt(base + ["-i", raw, "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", codes])
    pieces = nmt(base + ["-i", segmented, "--input-format", "bpe"])
    assert interactive.exit_code == 0 and pieces.exit_code == 0, interactive.stderr
    assert interactive.stdout == pieces.stdout and interactive.stdout.strip()
    missing = nmt(base + ["-i", raw, "--bpe", "subword_nmt"])
    assert missing.exit_code == 1 and missing.stderr.startswith("error: --bpe subword_nmt needs --bpe-codes FILE")


def test_interactive_flags_that_disagree_with_the_model_are_refused(iwslt: Path) -> None:
    run = iwslt / "checkpoints"
    source = iwslt / "one.de"
    source.write_text("fox\n", encoding="utf-8")
    base = ["translate", "--path", run / "checkpoint_best.pt", "-i", source, *SHORT_OUTPUT]
    for extra, message in ((["--source-lang", "fr"], "error: --source-lang fr: the model translates de-en"),
                           (["--tokenizer", "moses"], "error: --tokenizer moses: "),
                           (["--bpe", "sentencepiece"], "error: --bpe sentencepiece: "),
                           (["--remove-bpe", "--output-format", "bpe"], "error: --remove-bpe removes the pieces")):
        result = nmt(base + extra)
        assert result.exit_code == 1 and result.stderr.startswith(message), result.stderr
        assert len(result.stderr.splitlines()) == 1
    accepted = nmt(base + ["--tokenizer", "space", "--bpe", "none", "-s", "de", "-t", "en"])
    assert accepted.exit_code == 0, accepted.stderr


def test_nbest_text_output_prints_n_lines_per_input_line(iwslt: Path) -> None:
    run = iwslt / "checkpoints"
    source = iwslt / "nbest.de"
    source.write_text("qu@@ ick fox\n\nla@@ zy do@@ g .\n", encoding="utf-8")
    base = ["translate", "--path", run / "checkpoint_best.pt", "-i", source, "--beam", "4", *SHORT_OUTPUT]
    text = nmt(base + ["--nbest", "3"]).stdout.split("\n")
    records = [json.loads(line) for line in nmt(base + ["--nbest", "3", "--output-format", "jsonl"]).stdout.splitlines()]
    best = nmt(base).stdout.split("\n")
    assert len(text) == 3 * 3 + 1 and text[-1] == ""  # 3 lines per input line, each ending in a newline
    assert text[3:6] == ["", "", ""]  # the empty input line: 3 empty lines
    for i, record in ((0, records[0]), (2, records[2])):
        assert text[3 * i:3 * i + 3] == [entry["hyp"] for entry in record["nbest"]]
        assert text[3 * i] == best[i]  # the best first, as without --nbest


def test_wmt14_preprocess_and_big_training_commands_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    # The command's --fp16, which `nmt train` refuses on a CPU for its speed alone.
    monkeypatch.setattr(trainer_module, "check_precision_fits_device", lambda precision, device: None)
    write_segmented(tmp_path / "text", {"train.tok.clean.bpe.32000": 40, "newstest2013.tok.bpe.32000": 5,
                                        "newstest2014.tok.bpe.32000": 5}, ("en", "de"), seed=3)
    assert nmt(nmt_args(WMT14_PREPROCESS, TEXT="text")).exit_code == 0
    data = tmp_path / "data-bin" / "wmt16_en_de_bpe32k"
    assert (data / "dict.en.txt").read_text() == (data / "dict.de.txt").read_text()  # joined
    small = {"--update-freq 16": "--update-freq 2", "--lr 0.0005": "--lr 0.001", "--max-tokens 3584": "--max-tokens 64"}
    command = WMT14_TRAIN
    for fairseqs, ours in small.items():
        command = command.replace(fairseqs, ours)
    args = nmt_args(command)
    result = nmt(args + TINY_MODEL)
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "checkpoints" / "config.json").read_text())
    assert config["arch"] == "transformer_vaswani_wmt_en_de_big" and config["model"]["share_all_embeddings"]
    assert config["train"]["precision"] == "fp16" and config["train"]["warmup_init_lr"] == 1e-07
    assert config["train"]["update_freq"] == 2 and config["train"]["lr"] == 0.001 and config["model"]["dropout"] == 0.3


def test_wmt14_en_fr_training_flags_reach_nmts_settings() -> None:
    from nmt_cli.commands.model_options import overrides_from

    args = nmt_args(WMT14_EN_FR_TRAIN) + ["--save-dir", "run"]
    with main.get_command(None, "train").make_context("train", args[1:]) as ctx:  # overrides_from needs it too
        cfg = config_from_params(TrainConfig, ctx.params)
        assert overrides_from(ctx.params) == {"normalize_before": True}
    assert cfg.arch == "transformer_wmt_en_de" and cfg.max_time == 3600.0 and cfg.device == "cpu"
    assert cfg.no_epoch_checkpoints and cfg.save_interval_updates == 1 and cfg.keep_interval_updates == 2
    assert (cfg.max_epoch, cfg.patience, cfg.seed, cfg.log_interval) == (5, 3, 2, 1)


def test_wmt14_en_fr_training_runs_without_epoch_checkpoints(iwslt: Path, tmp_path: Path) -> None:
    data = iwslt / "data-bin" / "iwslt14.tokenized.de-en"
    args = nmt_args(WMT14_EN_FR_TRAIN.replace("data-bin/wmt14_en_fr", str(data)))
    result = nmt(args + ["--save-dir", tmp_path / "run", *TINY_MODEL])
    assert result.exit_code == 0, result.output
    names = {p.name for p in (tmp_path / "run").glob("checkpoint*.pt")}
    assert {"checkpoint_best.pt", "checkpoint_last.pt"} <= names
    assert not [name for name in names if re.fullmatch(r"checkpoint\d+\.pt", name)]  # no epoch checkpoints
    assert [name for name in names if re.fullmatch(r"checkpoint_\d+_\d+\.pt", name)]  # --save-interval-updates 1
    lines = (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()
    assert lines and all(isinstance(json.loads(line), dict) for line in lines)


def test_a_fairseq_checkpoint_given_to_train_names_the_conversion_that_works(iwslt: Path, tmp_path: Path) -> None:
    data = iwslt / "data-bin" / "iwslt14.tokenized.de-en"
    fairseq_model = tmp_path / "fairseq"
    assert nmt(["export", "--format", "fairseq", iwslt / "checkpoints" / "checkpoint_last.pt", fairseq_model]).exit_code == 0
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    checkpoint = resumed / "checkpoint_last.pt"
    (fairseq_model / "checkpoint.pt").rename(checkpoint)  # a fairseq run's --save-dir
    for flags in (["--save-dir", resumed], ["--save-dir", tmp_path / "tuned", "--finetune-from-model", checkpoint]):
        result = nmt(["train", data, *flags, *TINY_MODEL])
        assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1, result.stderr
        advice = re.search(r"`nmt (import-fairseq .*)`", result.stderr)
        assert advice and f"import-fairseq {checkpoint} " in result.stderr, result.stderr
    # The command it gives converts the checkpoint into one that nmt trains from.
    command = advice.group(1).replace("DIR", str(fairseq_model)).replace("RUN", str(tmp_path / "converted"))
    assert nmt(shlex.split(command)).exit_code == 0
    result = nmt(["train", data, "--save-dir", tmp_path / "tuned", *TINY_MODEL, "--arch", "transformer_iwslt_de_en",
                  "--share-decoder-input-output-embed", "--finetune-from-model", tmp_path / "converted" / "checkpoint.pt"])
    assert result.exit_code == 0 and "fine-tuning from the weights of" in result.stderr, result.output


def test_average_takes_fairseqs_average_checkpoints_flags() -> None:
    params = main.get_command(None, "average").make_context("average", nmt_args(WMT14_AVERAGE)[1:]).params
    assert params["inputs"] == ("/path/to/checkpoints",) and params["num_epoch_checkpoints"] == 10
    assert params["output"] == "checkpoint.avg10.pt"


# What translate works out itself when its flags are absent (the terminal, the machine).
DECODING_RESOLVED = {"generate": {}, "translate": {"buffer_size": 1, "device": "cpu"}}


def train_config(*flags: str) -> TrainConfig:
    return config_of("train", ["data", "--save-dir", "run", *flags], TrainConfig)


@pytest.mark.parametrize("flags, settings", [
    (["--fp16"], {"precision": "fp16"}),
    (["--memory-efficient-fp16"], {"precision": "fp16"}),
    (["--bf16"], {"precision": "pure-bf16"}),
    (["--stop-time-hours", "1.5"], {"max_time": 5400.0}),
    (["--finetune-from-model", "base.pt"], {"finetune_from": "base.pt"}),
    (["--criterion", "cross_entropy"], {"label_smoothing": 0.0}),
    (["--criterion", "label_smoothed_cross_entropy"], {"label_smoothing": 0.1}),
    (["--optimizer", "adam", "--ddp-backend", "legacy_ddp", "--log-format", "tqdm"], {}),
    (["--fp16", "--precision", "fp16"], {"precision": "fp16"}),  # saying the same twice is fine
    (["--criterion", "cross_entropy", "--label-smoothing", "0"], {"label_smoothing": 0.0}),
    # fairseq's defaults, its "off": patience <= 0 never stops; a negative --warmup-init-lr starts warm-up at 0.
    (["--patience", "-1"], {"patience": 0}),
    (["--patience", "-5"], {"patience": 0}),
    (["--warmup-init-lr", "-1"], {"warmup_init_lr": 0.0}),
    # fairseq's lists (one value per epoch) of one value.
    (["--lr", "[0.001]"], {"lr": 0.001}),
    (["--lr", " [ 7e-4 ] "], {"lr": 7e-4}),
    (["--update-freq", "[2]"], {"update_freq": 2}),
])
def test_fairseq_flags_set_nmts_settings(flags: list[str], settings: dict) -> None:
    cfg = train_config(*flags)
    for name, value in settings.items():
        assert getattr(cfg, name) == value, name
    unchanged = {name for name in TrainConfig.__dataclass_fields__} - set(settings)
    default = TrainConfig(data="data", save_dir="run")
    assert {n for n in unchanged if getattr(cfg, n) != getattr(default, n)} == set()


@pytest.mark.parametrize("flags, message", [
    (["--fp16", "--precision", "bf16"], "--fp16 means --precision fp16, but --precision bf16 is given too"),
    (["--fp16", "--bf16"], "--bf16 and --fp16 ask for different --precision"),
    (["--criterion", "cross_entropy", "--label-smoothing", "0.2"], "--criterion means --label-smoothing 0.0"),
    # A flag given is given, also with nmt's default value.
    (["--criterion", "cross_entropy", "--label-smoothing", "0.1"],
     "--criterion means --label-smoothing 0.0, but --label-smoothing 0.1 is given too"),
    (["--fp16", "--precision", "fp32"], "--fp16 means --precision fp16, but --precision fp32 is given too"),
    (["--stop-time-hours", "1", "--max-time", "0"], "--stop-time-hours means --max-time 3600.0, but --max-time 0"),
])
def test_a_fairseq_flag_contradicting_another_is_an_error(flags: list[str], message: str) -> None:
    with pytest.raises(NmtError, match=message):
        train_config(*flags)


def test_a_flag_given_by_its_default_value_still_contradicts_a_fairseq_flag(tmp_path: Path) -> None:
    result = nmt(["train", tmp_path, "--save-dir", tmp_path / "run", "--fp16", "--precision", "fp32"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: --fp16 means --precision fp16, but --precision fp32 is given too"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, line", [
    (["--optimizer", "sgd"], "error: --optimizer sgd: nmt trains with Adam only"),
    (["--criterion", "ctc"], "error: --criterion ctc: nmt's loss is (label-smoothed) cross-entropy"),
    (["--arch", "fconv_wmt_en_fr"], "error: --arch fconv_wmt_en_fr: fairseq's convolutional model"),
    (["--arch", "lstm"], "error: --arch lstm: an LSTM; nmt builds encoder-decoder Transformers only"),
    (["--restore-file", "other.pt"], "error: --restore-file other.pt: nmt resumes only from SAVE_DIR/checkpoint_last.pt"),
    (["--ddp-backend", "fully_sharded"], "error: --ddp-backend fully_sharded: nmt's multi-GPU training is PyTorch DDP"),
    (["--user-dir", "plugins"], "error: --user-dir plugins: nmt has no plugins"),
    (["--task", "language_modeling"], "error: --task language_modeling: nmt does translation only"),
    (["--no-save"], "error: --no-save: nmt always writes checkpoint_last.pt"),
    # fairseq's resets, to fine-tune from another run's checkpoint: nmt's way to do it instead.
    (["--reset-lr-scheduler"], "error: --reset-lr-scheduler: nmt's schedule keeps no state"),
    (["--reset-dataloader"], "error: --reset-dataloader: resuming from checkpoint_last.pt continues at the batch"),
    (["--reset-meters"], "error: --reset-meters: resuming from checkpoint_last.pt continues its log window"),
    (["--lr", "[0.001, 0.0005]"], "error: --lr [0.001, 0.0005]: nmt takes one value for the whole run, not fairseq's"),
    (["--update-freq", "2,4"], "error: --update-freq 2,4: nmt takes one value for the whole run"),
])
def test_refused_flags_and_values_name_themselves_in_one_line(args: list[str], line: str, tmp_path: Path) -> None:
    result = nmt(["train", tmp_path, "--save-dir", tmp_path / "run", *args])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith(line), result.stderr
    assert "--reset-run" not in result.stderr  # which deletes the run: never the advice
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command, args, line", [
    ("generate", ["--sacrebleu"], "error: --sacrebleu: nmt's (and fairseq-generate's) way to score with sacreBLEU is "
                                  "--scoring sacrebleu"),
    ("generate", ["--user-dir", "plugins"], "error: --user-dir plugins: nmt has no plugins"),
    ("generate", ["--task", "translation_multi_simple_epoch"], "error: --task translation_multi_simple_epoch: nmt does"),
    ("translate", ["--user-dir", "plugins"], "error: --user-dir plugins: nmt has no plugins"),
    ("translate", ["--task", "speech_to_text"], "error: --task speech_to_text: nmt does translation only"),
])
def test_refused_decoding_flags_name_themselves_in_one_line(command: str, args: list[str], line: str,
                                                            tmp_path: Path) -> None:
    data = [tmp_path] if command == "generate" else []
    result = nmt([command, *data, "--path", tmp_path / "model.pt", *args])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith(line), result.stderr


def test_fairseqs_task_and_sentencepiece_model_flags_are_taken() -> None:
    assert train_config("--task", "translation") == train_config()
    for command, config_class in (("generate", GenerateConfig), ("translate", TranslateConfig)):
        args = (["data-bin"] if command == "generate" else []) + ["--path", "a.pt"]
        assert config_of(command, args + ["--task", "translation"], config_class, **DECODING_RESOLVED[command]) == \
            config_of(command, args, config_class, **DECODING_RESOLVED[command])
    cfg = config_of("translate", ["--path", "a.pt", "--bpe", "sentencepiece", "--sentencepiece-model", "spm.model"],
                    TranslateConfig, **DECODING_RESOLVED["translate"])
    assert cfg.bpe == "sentencepiece" and cfg.bpe_codes == "spm.model"


def test_the_convolutional_recipe_is_refused_by_name(tmp_path: Path) -> None:
    args = nmt_args(FCONV_WMT14_EN_FR_TRAIN.replace("data-bin/wmt14_en_fr", str(tmp_path)))
    # Each refused flag is named when it is the first one left on the command line.
    for dropped, message in (((), "error: --arch fconv_wmt_en_fr: fairseq's convolutional model"),
                             (("--arch",), "error: --optimizer nag: nmt trains with Adam only"),
                             (("--arch", "--optimizer"), "error: --force-anneal 50: nmt's schedulers")):
        kept = list(args)
        for flag in dropped:
            del kept[kept.index(flag):kept.index(flag) + 2]
        result = nmt(kept)
        assert result.exit_code == 2 and result.stderr.startswith(message), result.stderr
        assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "checkpoints").exists()


def test_one_of_fairseqs_two_normalize_before_flags_alone_is_an_error(tmp_path: Path) -> None:
    result = nmt(["train", tmp_path, "--save-dir", tmp_path / "run", "--encoder-normalize-before"])
    assert result.exit_code == 1
    assert result.stderr.strip() == ("error: --encoder-normalize-before needs --decoder-normalize-before too: "
                                     "nmt has one setting for both (--normalize-before)")


def test_translate_aliases_reach_the_config() -> None:
    args = ["--path", "a.pt", "data-bin", "--cpu", "--max-sentences", "8", "--remove-bpe", "--beam", "5"]
    cfg = config_of("translate", args, TranslateConfig, buffer_size=1, device="cuda")
    assert (cfg.data_bin, cfg.device, cfg.batch_size, cfg.remove_bpe, cfg.decode.beam) == ("data-bin", "cpu", 8, "@@ ", 5)
    params = main.get_command(None, "translate").make_context("translate", ["--path", "a.pt", "--remove-bpe",
                                                                            "sentencepiece", "--fp16"]).params
    assert params["remove_bpe"] == "sentencepiece" and params["alias_fp16"] is True


def test_a_device_given_contradicts_cpu_in_translate_as_in_train() -> None:
    # translate resolves the device (cuda when there is one) when --device is absent; a
    # --device given is the user's, and --cpu beside it is a contradiction, not a default.
    args = ["--path", "a.pt", "--device", "cuda:1", "--cpu"]
    with pytest.raises(NmtError, match="--cpu means --device cpu, but --device cuda:1 is given too"):
        config_of("translate", args, TranslateConfig, buffer_size=1, device="cuda:1")


def test_segmentation_is_found_and_plain_text_is_not(tmp_path: Path) -> None:
    cases = {"subword": ("qu@@ ick bro@@ wn fox .\n" * 5, SUBWORD_NMT),
             "pieces": ("▁the ▁qu ick ▁fox\n" * 5, SENTENCEPIECE),
             "plain": ("mail me @ home or at a@b.c , @@ end\nThe quick brown fox .\n", None)}
    for name, (text, marker) in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        found = find_segmentation(tmp_path / name)
        assert (found.marker if found else None) == marker, name
    assert find_segmentation(tmp_path / "subword").line == 1


@pytest.mark.parametrize("flags, message", [
    (["--tokenizer", "moses"], "Moses would split its markers (qu@@ -> qu @ @); use --tokenizer none --bpe none"),
    (["--bpe", "sentencepiece"], "--bpe sentencepiece would segment the pieces again; use --bpe none"),
])
def test_explicit_settings_that_would_corrupt_segmented_text_are_refused(flags, message, tmp_path: Path) -> None:
    write_segmented(tmp_path / "text", {"train": 10}, ("de", "en"))
    result = nmt(["preprocess", "-s", "de", "-t", "en", "--trainpref", tmp_path / "text" / "train",
                  "--destdir", tmp_path / "bin", *flags])
    assert result.exit_code == 1 and message in result.stderr and len(result.stderr.splitlines()) == 1
    assert "is already segmented (subword-nmt '@@ ' pieces, e.g. line 1)" in result.stderr
    assert not (tmp_path / "bin").exists()


def test_raw_text_is_still_tokenized_with_moses_by_default(tmp_path: Path) -> None:
    for lang in ("de", "en"):
        (tmp_path / f"train.{lang}").write_text("Hello, world!\nThe fox's tail.\n" * 20, encoding="utf-8")
    result = nmt(["preprocess", "-s", "de", "-t", "en", "--trainpref", tmp_path / "train", "--destdir",
                  tmp_path / "bin", "--bpe", "none"])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "bin" / "meta.json").read_text())
    assert meta["tokenizer"]["name"] == "moses" and meta["tokenizer"]["normalize_punctuation"] is True
    assert "segmented_input" not in meta
    assert "," in (tmp_path / "bin" / "dict.de.txt").read_text().split()  # `Hello,` split by Moses


DICTIONARY_FLAGS = [(), ("--joined-dictionary", "--nwordssrc", "30"), ("--thresholdsrc", "10", "--thresholdtgt", "20"),
                    ("--nwordssrc", "20", "--nwordstgt", "25")]


def preprocess_flags(text: Path, extra: tuple[str, ...]) -> list[str]:
    return ["--source-lang", "de", "--target-lang", "en", "--trainpref", str(text / "train"),
            "--validpref", str(text / "valid"), "--workers", "2", *extra]


@pytest.fixture(scope="module")
def fairseq_dictionaries(fairseq_python, tmp_path_factory) -> tuple[Path, list[Path]]:
    """(the segmented text, fairseq-preprocess's destdir for each of DICTIONARY_FLAGS), in one reference process."""
    root = tmp_path_factory.mktemp("fairseq_dictionaries")
    write_segmented(root / "text", {"train": 80, "valid": 10}, ("de", "en"), seed=5)
    destdirs = [root / f"fairseq{i}" for i in range(len(DICTIONARY_FLAGS))]
    commands = [["preprocess", *preprocess_flags(root / "text", extra), "--destdir", destdir]
                for extra, destdir in zip(DICTIONARY_FLAGS, destdirs)]
    run_fairseq_commands(fairseq_python, commands, root)
    return root / "text", destdirs


@pytest.mark.parametrize("index", range(len(DICTIONARY_FLAGS)))
def test_dictionaries_equal_fairseq_preprocess(fairseq_dictionaries, index: int, tmp_path: Path) -> None:
    text, destdirs = fairseq_dictionaries
    result = nmt(["preprocess", *preprocess_flags(text, DICTIONARY_FLAGS[index]), "--destdir", tmp_path / "nmt"])
    assert result.exit_code == 0, result.output
    for lang in ("de", "en"):
        ours = (tmp_path / "nmt" / f"dict.{lang}.txt").read_text(encoding="utf-8")
        assert ours == (destdirs[index] / f"dict.{lang}.txt").read_text(encoding="utf-8"), lang
