"""`nmt import-fairseq` against the real fairseq: same ids, log-probabilities, beams and text.

The fairseq side runs in its own virtual environment (scripts/setup_fairseq_env.sh;
override with NMT_FAIRSEQ_PYTHON): tests/fairseq_reference.py trains a tiny fairseq
Transformer per variant (Moses + subword-nmt BPE + fairseq-preprocess + fairseq-train,
on Multi30k De-En when the shared data is present, else on a generated corpus) and
reports what fairseq computes with it. Without that environment these tests skip;
the tests of the safe loader and the error messages need no fairseq.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from nmt_cli.checkpoints.format import load_checkpoint, model_from_checkpoint
from nmt_cli.cli import main
from nmt_cli.config import DecodeConfig, ModelConfig
from nmt_cli.data.dictionary import EOS_ID, PAD_ID, Dictionary
from nmt_cli.decode.search import generate
from nmt_cli.errors import NmtError
from nmt_cli.interop.fairseq.checkpoint import load_fairseq_checkpoint, malformed_checkpoint_as_error, model_config_from_args
from nmt_cli.interop.fairseq.importer import read_fairseq_dictionary
from nmt_cli.models.registry import build_model
from nmt_cli.text.pipeline import TextPipeline
from nmt_cli.text.subword_nmt import SubwordNmtBpe

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TOLERANCE = 1e-4
TRAIN_LINES, TEST_LINES, SCORE_PAIRS = 2000, 120, 16
BEAM, LENPEN, MAX_LEN_A, MAX_LEN_B = 4, 0.6, 0, 60
TINY = ["--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128", "--encoder-layers", "2",
        "--encoder-attention-heads", "4", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "128",
        "--decoder-layers", "2", "--decoder-attention-heads", "4", "--dropout", "0.1"]
VARIANTS = {
    # The paper's post-norm layout, one joined dictionary, sinusoidal positions.
    "postnorm_shared": ("transformer_wmt_en_de", TINY + ["--share-all-embeddings"]),
    # Pre-norm (t2t preset), separate dictionaries, tied decoder output, learned positions.
    "prenorm_learned": ("transformer_wmt_en_de_big_t2t", TINY + [
        "--share-decoder-input-output-embed", "--encoder-learned-pos", "--decoder-learned-pos",
        "--max-source-positions", "256", "--max-target-positions", "256"]),
}
# Lines of a dict.txt with fairseq's padding symbols and the overwrite flag.
DICT_PROBE = ["the 10", "a b 7", "Haus 3 #fairseq:overwrite", "madeupword0000 0", "madeupword0001 0"]
# Headerless (version 0.1) codes: `</w>` is a symbol of its own; duplicates keep their first rank.
BPE_V01_CODES = "a a\nr a\ne </w>\nS t\nst r\naa a\na a\nß e</w>\n"
BPE_PROBE = ["a", "aaaaaa", "Straße Strasse raaa e", "  leading and trailing  ", "der  Hund , der &apos;s", "Übermäßig straße x y z",
             "ein Mann mit einem orangefarbenen Hut , der etwas anstarrt ."]



def corpus() -> dict[str, dict[str, list[str]]]:
    """Multi30k De-En lines when present; otherwise a generated word-mapping task."""
    root = SHARED_DATA / "multi30k"
    if (root / "train.de").is_file():
        def read(name: str) -> list[str]:
            return (root / name).read_text(encoding="utf-8").splitlines()

        test_src, test_tgt = read("test.de"), read("test.en")
        # The first lines, plus some with quotes and ampersands (Moses escapes them).
        chosen = list(range(TEST_LINES)) + [i for i, line in enumerate(test_src) if i >= TEST_LINES and any(c in line for c in "&'\"")][:10]
        return {
            "train": {"src": read("train.de")[:TRAIN_LINES], "tgt": read("train.en")[:TRAIN_LINES]},
            "valid": {"src": read("valid.de")[:50], "tgt": read("valid.en")[:50]},
            "test": {"src": [test_src[i] for i in chosen], "tgt": [test_tgt[i] for i in chosen]},
        }
    rng = random.Random(0)
    vocab = [f"wort{i}" for i in range(150)] + ["der", "die", "das", "ein", "und", ",", ".", '"', "&", "Bob's", "x-y"]
    translation = {w: w.replace("wort", "word") + ("s" if i % 3 == 0 else "") for i, w in enumerate(vocab)}

    def pairs(count: int) -> dict[str, list[str]]:
        src = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 14))) for _ in range(count)]
        return {"src": src, "tgt": [" ".join(translation[w] for w in line.split()) for line in src]}

    return {"train": pairs(TRAIN_LINES), "valid": pairs(50), "test": pairs(TEST_LINES)}


@pytest.fixture(scope="module")
def fairseq_outputs(tmp_path_factory, fairseq_python) -> dict:
    """Train the fairseq model of every variant and collect fairseq's outputs (once per module)."""
    work = tmp_path_factory.mktemp("fairseq")
    spec = {
        "workdir": str(work), "src_lang": "de", "tgt_lang": "en", **corpus(), "bpe_merges": 2000,
        "variants": [{"name": name, "arch": arch, "train_flags": flags} for name, (arch, flags) in VARIANTS.items()],
        "max_update": 120, "beam": BEAM, "lenpen": LENPEN, "max_len_a": MAX_LEN_A, "max_len_b": MAX_LEN_B,
        "score_pairs": SCORE_PAIRS, "dict_probe": DICT_PROBE, "bpe_probe": BPE_PROBE, "bpe_v01_codes": BPE_V01_CODES,
    }
    (work / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [str(fairseq_python), str(REPO / "tests" / "fairseq_reference.py"), str(work / "spec.json"), str(work / "out.json")],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    outputs = json.loads((work / "out.json").read_text(encoding="utf-8"))
    outputs["workdir"], outputs["test"] = work, spec["test"]
    return outputs


@pytest.fixture(params=sorted(VARIANTS))
def reference(request, fairseq_outputs) -> dict:
    """fairseq's outputs for one variant, with the shared ones (BPE codes, probes, test text)."""
    shared = {k: v for k, v in fairseq_outputs.items() if k != "variants"}
    return {**shared, **fairseq_outputs["variants"][request.param], "variant": request.param}




def import_run(ref: dict, checkpoint_key: str = "checkpoint", extra: tuple[str, ...] = ()) -> Path:
    """`nmt import-fairseq` of the variant's checkpoint (languages inferred from the data-bin unless given)."""
    out = ref["workdir"] / ref["variant"] / f"run_{checkpoint_key}"
    result = CliRunner().invoke(main, [
        "import-fairseq", ref[checkpoint_key], "--dict-dir", ref["data_bin"], "--out", str(out),
        "--bpe-codes", ref["bpe_codes"], *extra,
    ])
    assert result.exit_code == 0, result.output
    return out


def teacher_forced_lprobs(run: Path, src_ids: list[list[int]], tgt_ids: list[list[int]]) -> torch.Tensor:
    """Our log-probs (B, T, V) with right padding (fairseq's reference used left-padded sources)."""
    model = model_from_checkpoint(load_checkpoint(run / "checkpoint.pt")).eval()
    src = pad_right(src_ids)
    prev = pad_right([[EOS_ID] + t[:-1] for t in tgt_ids])
    with torch.no_grad():
        return torch.log_softmax(model(src, prev).float(), dim=-1)


def pad_right(rows: list[list[int]]) -> torch.Tensor:
    batch = torch.full((len(rows), max(len(r) for r in rows)), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = torch.tensor(row)
    return batch


def assert_lprobs_match(run: Path, expected: dict) -> None:
    lprobs = teacher_forced_lprobs(run, expected["src_ids"], expected["tgt_ids"])
    for i, (tgt, ref_lprobs) in enumerate(zip(expected["tgt_ids"], expected["token_lprobs"])):
        ours = lprobs[i, : len(tgt)].gather(1, torch.tensor(tgt).unsqueeze(1)).squeeze(1)
        assert torch.allclose(ours, torch.tensor(ref_lprobs), atol=TOLERANCE, rtol=0), f"pair {i}"
    first = torch.tensor(expected["first_distribution"])
    assert (lprobs[0, 0] - first).abs().max().item() < TOLERANCE


def test_dictionaries_get_fairseq_ids(reference):
    data_bin = Path(reference["data_bin"])
    assert read_fairseq_dictionary(data_bin / "dict.de.txt") == reference["src_dict"]
    assert read_fairseq_dictionary(data_bin / "dict.en.txt") == reference["tgt_dict"]
    assert Dictionary.load(data_bin / "dict.en.txt").symbols == reference["tgt_dict"]
    probe = reference["workdir"] / "dict.probe.txt"  # written by the reference script
    assert read_fairseq_dictionary(probe) == reference["dict_probe"]
    assert Dictionary.load(probe).symbols == reference["dict_probe"]


def test_teacher_forced_log_probs_match_fairseq(reference):
    assert_lprobs_match(import_run(reference), reference["teacher_forced"])


def test_legacy_checkpoint_layout_imports_the_same(reference):
    """args as a Namespace, fused in_proj, layer_norms.N, embed_out, pre-1.6 torch format."""
    run = import_run(reference, "legacy_checkpoint", ("--source-lang", "de", "--target-lang", "en"))
    assert_lprobs_match(run, reference["legacy_teacher_forced"])


def test_dictconfig_checkpoint_imports_the_same(reference):
    """cfg pickled as an omegaconf DictConfig with hydra-style encoder/decoder groups (no fairseq classes)."""
    assert_lprobs_match(import_run(reference, "dictconfig_checkpoint"), reference["teacher_forced"])


def test_beam_search_matches_fairseq_sequence_generator(reference, one_thread):
    run = import_run(reference)
    model = model_from_checkpoint(load_checkpoint(run / "checkpoint.pt")).eval()
    cfg = DecodeConfig(beam=BEAM, nbest=BEAM, lenpen=LENPEN, max_len_a=MAX_LEN_A, max_len_b=MAX_LEN_B)
    entries = reference["beam"]
    assert len(entries) >= 100
    ours = []
    for start in range(0, len(entries), 64):
        batch = pad_right([e["src_ids"] for e in entries[start : start + 64]])
        ours += generate(model, batch, cfg, model.cfg.max_target_positions)
    finished_early = 0
    for i, (entry, hyps) in enumerate(zip(entries, ours)):
        expected = entry["hypos"]
        assert [h.tokens for h in hyps] == [h["tokens"] for h in expected], f"sentence {i}"
        for mine, theirs in zip(hyps, expected):
            assert abs(mine.score - theirs["score"]) < TOLERANCE, f"sentence {i}"
            assert torch.allclose(torch.tensor(mine.positional_scores), torch.tensor(theirs["positional_scores"]),
                                  atol=TOLERANCE, rtol=0), f"sentence {i}"
        finished_early += len(expected[0]["tokens"]) <= MAX_LEN_B
    assert finished_early >= 10  # the model ends sentences by itself, not only at the length limit


def test_translate_raw_text_matches_fairseq_hub(reference, tmp_path, one_thread):
    run = import_run(reference)
    source = tmp_path / "test.de"
    source.write_text("".join(line + "\n" for line in reference["test"]["src"]), encoding="utf-8")
    result = CliRunner().invoke(main, [
        "translate", "--path", str(run / "checkpoint.pt"), "--input", str(source), "--beam", str(BEAM),
        "--lenpen", str(LENPEN), "--max-len-a", str(MAX_LEN_A), "--max-len-b", str(MAX_LEN_B), "--threads", "1",
    ])
    assert result.exit_code == 0, result.output
    expected = [entry["hypos"][0]["text"] for entry in reference["beam"]]
    assert result.stdout.splitlines() == expected


def test_subword_nmt_segmentation_matches_the_package(reference):
    bpe = SubwordNmtBpe.load(reference["bpe_codes"])
    for line, expected in reference["bpe_probe"].items():
        assert " ".join(bpe.encode(line)) == expected.strip(), line
    for entry in reference["beam"]:
        pieces = entry["src_bpe"].split()
        assert bpe.encode(bpe.decode(pieces)) == pieces
    old_bpe = SubwordNmtBpe.load(reference["bpe_v01_codes"])
    assert old_bpe.version == (0, 1)
    for line, expected in reference["bpe_v01_probe"].items():
        assert " ".join(old_bpe.encode(line)) == expected.strip(), line


def test_source_text_pipeline_matches_fairseq_moses_and_bpe(reference):
    """Raw line -> pieces as fairseq's `--tokenizer moses --bpe subword_nmt` makes them."""
    pipeline = TextPipeline.from_data_bin(import_run(reference), "de")
    for line, entry in zip(reference["test"]["src"], reference["beam"]):
        assert pipeline.encode(line) == entry["src_bpe"].split(), line


# ---------------------------------------------------------------------------
# Without fairseq: the safe loader and the error messages.


def test_loader_refuses_code_in_the_pickle(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"args": argparse.Namespace(arch="transformer"), "model": {}, "payload": os.system}, path)
    with pytest.raises(NmtError, match=r"evil\.pt.*refusing to load (posix|nt)\.system"):
        load_fairseq_checkpoint(path)


def test_loader_reads_namespace_args_without_fairseq(tmp_path):
    path = tmp_path / "old.pt"
    args = argparse.Namespace(arch="transformer", encoder_layers=1, source_lang="de", target_lang="en")
    torch.save({"args": args, "model": {"encoder.version": torch.tensor([3.0])}}, path,
               _use_new_zipfile_serialization=False)
    loaded = load_fairseq_checkpoint(path)
    assert loaded.args["encoder_layers"] == 1 and loaded.args["source_lang"] == "de"
    assert list(loaded.weights) == ["encoder.version"]


@pytest.mark.parametrize("option, message", [
    ({"layernorm_embedding": True}, "--layernorm-embedding"),
    ({"adaptive_softmax_cutoff": "5000,20000"}, "--adaptive-softmax-cutoff"),
    ({"activation_fn": "gelu_accurate"}, "--activation-fn gelu_accurate"),
    ({"encoder_normalize_before": True}, "--encoder-normalize-before differing"),
    ({"arch": "lstm"}, "architecture 'lstm' is not supported"),
])
def test_unsupported_options_are_named(option, message):
    args = {"arch": "transformer", **option}
    with pytest.raises(NmtError, match=message):
        model_config_from_args(args, {"encoder.version": torch.tensor([3.0]), "decoder.version": torch.tensor([3.0])},
                               Path("model.pt"))


@pytest.mark.parametrize("activation", ["relu", "gelu", "swish"])
def test_activations_nmt_has_are_taken_by_their_fairseq_names(activation):
    versions = {"encoder.version": torch.tensor([3.0]), "decoder.version": torch.tensor([3.0])}
    cfg = model_config_from_args({"arch": "transformer", "activation_fn": activation}, versions, Path("model.pt"))
    assert cfg.activation_fn == activation


def test_dictionary_overwriting_a_symbol_is_refused(tmp_path):
    path = tmp_path / "dict.de.txt"
    path.write_text("Haus 3\n</s> 1 #fairseq:overwrite\n", encoding="utf-8")
    with pytest.raises(NmtError, match=r"dict\.de\.txt:2"):
        read_fairseq_dictionary(path)


def test_both_dictionary_readers_split_lines_as_fairseq_does(tmp_path):
    """One line splitter serves Dictionary.load and read_fairseq_dictionary: trailing white
    space (fairseq strips it), a space inside a symbol and the overwrite flag."""
    path = tmp_path / "dict.de.txt"
    path.write_text("the 10 \na b 7\t\nHaus 3 #fairseq:overwrite\n", encoding="utf-8")
    expected = ["<s>", "<pad>", "</s>", "<unk>", "the", "a b", "Haus"]
    assert read_fairseq_dictionary(path) == Dictionary.load(path).symbols == expected


def test_a_dictionary_of_symbols_holding_unicode_line_separators_round_trips(tmp_path):
    """fairseq's readlines ends lines at \\n, \\r\\n and \\r only: \\u2028, \\x0c, \\x1c and
    \\x85 are inside symbols, not line ends."""
    symbols = ["a\u2028b", "c\x0cd", "e\x1cf", "g\x85h", "i\u2029j", "k\x0bl"]
    Dictionary(symbols, [6, 5, 4, 3, 2, 1]).save(tmp_path / "dict.de.txt")
    loaded = Dictionary.load(tmp_path / "dict.de.txt")
    assert loaded.symbols[loaded.nspecial:] == symbols and loaded.counts[loaded.nspecial:] == [6, 5, 4, 3, 2, 1]
    assert read_fairseq_dictionary(tmp_path / "dict.de.txt")[4:] == symbols


def test_dictionary_lines_end_at_crlf_and_a_lone_cr_as_in_fairseq(tmp_path):
    path = tmp_path / "dict.de.txt"
    path.write_bytes(b"the 3\r\nHaus 2\rBaum 1")
    assert Dictionary.load(path).symbols[4:] == read_fairseq_dictionary(path)[4:] == ["the", "Haus", "Baum"]


@pytest.mark.parametrize("line", ["w1", "w1 5x", "w1 --5", "w1 \u00b2"])
def test_a_dictionary_line_without_a_count_is_one_error_naming_it(tmp_path, line):
    path = tmp_path / "dict.de.txt"
    path.write_text(f"w0 1\n{line}\n", encoding="utf-8")
    for read in (read_fairseq_dictionary, Dictionary.load):
        with pytest.raises(NmtError, match=r"bad dictionary line .*dict\.de\.txt:2$"):
            read(path)


# ---------------------------------------------------------------------------
# Without fairseq: a fake fairseq checkpoint made from a tiny nmt model.

FAKE_SYMBOLS = ["the", "a", "house", "tree", "red", "green", "big", "small"]  # + 4 specials = 12 ids
FAKE_CONFIG = ModelConfig(encoder_embed_dim=8, encoder_ffn_embed_dim=16, encoder_layers=1, encoder_attention_heads=2,
                          decoder_embed_dim=8, decoder_ffn_embed_dim=16, decoder_layers=1, decoder_attention_heads=2,
                          normalize_before=True, scale_embedding=True)


def fairseq_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Our weights under fairseq 0.12's names (split q/k/v), with its module versions."""
    state: dict[str, torch.Tensor] = {"encoder.version": torch.tensor([3.0]), "decoder.version": torch.tensor([3.0])}
    for key, value in model.state_dict().items():
        prefix, leaf = key.rsplit(".", 1)
        if prefix.endswith("self_attn.in_proj"):
            for proj, chunk in zip("qkv", value.chunk(3)):
                state[f"{prefix.removesuffix('in_proj')}{proj}_proj.{leaf}"] = chunk.clone()
        elif prefix.endswith("encoder_attn.kv_proj"):
            for proj, chunk in zip("kv", value.chunk(2)):
                state[f"{prefix.removesuffix('kv_proj')}{proj}_proj.{leaf}"] = chunk.clone()
        else:
            state[key] = value.clone()
    return state


def write_fake_fairseq(root: Path, name: str = "ok.pt", edit=None) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """fs/NAME (a pre-norm `transformer`) and db/dict.{de,en}.txt under `root`; `edit(checkpoint)` may
    damage the checkpoint dict first. Returns (checkpoint, dict dir, our weights)."""
    torch.manual_seed(0)
    model = build_model(FAKE_CONFIG, 4 + len(FAKE_SYMBOLS), 4 + len(FAKE_SYMBOLS))
    args = argparse.Namespace(
        arch="transformer", source_lang="de", target_lang="en", encoder_embed_dim=8, encoder_ffn_embed_dim=16,
        encoder_layers=1, encoder_attention_heads=2, decoder_embed_dim=8, decoder_ffn_embed_dim=16,
        decoder_layers=1, decoder_attention_heads=2, encoder_normalize_before=True, decoder_normalize_before=True,
        dropout=0.1, max_source_positions=1024, max_target_positions=1024,
    )
    checkpoint = {"args": args, "model": fairseq_state_dict(model), "optimizer_history": [{"num_updates": 7}]}
    if edit is not None:
        edit(checkpoint)
    (root / "fs").mkdir(exist_ok=True)
    (root / "db").mkdir(exist_ok=True)
    torch.save(checkpoint, root / "fs" / name)
    for lang in ("de", "en"):
        (root / "db" / f"dict.{lang}.txt").write_text("".join(f"{s} 1\n" for s in FAKE_SYMBOLS), encoding="utf-8")
    return root / "fs" / name, root / "db", model.state_dict()


def invoke_import(checkpoint: Path, dict_dir: Path, out: Path, *extra: str):
    return CliRunner().invoke(main, ["import-fairseq", str(checkpoint), "--dict-dir", str(dict_dir), "--out", str(out), *extra])


def assert_one_error_line(result, *fragments: str) -> str:
    """Exit status 1 and a single `error:` line (no traceback) holding every fragment."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_fake_fairseq_checkpoint_imports_our_weights(tmp_path):
    checkpoint, dict_dir, weights = write_fake_fairseq(tmp_path)
    result = invoke_import(checkpoint, dict_dir, tmp_path / "run")
    assert result.exit_code == 0, result.output
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert state["num_updates"] == 7 and (state["source_lang"], state["target_lang"]) == ("de", "en")
    imported = model_from_checkpoint(state).state_dict()
    assert imported.keys() == weights.keys()
    assert all(torch.equal(imported[k], weights[k]) for k in weights)
    assert sorted(files_of(tmp_path / "run")) == ["checkpoint.pt", "dict.de.txt", "dict.en.txt", "meta.json"]


def test_bpe_codes_are_checked_and_copied_at_import(tmp_path):
    checkpoint, dict_dir, _ = write_fake_fairseq(tmp_path)
    codes = tmp_path / "bpe.codes"
    codes.write_text("#version: 0.2\nt h\nth e</w>\n", encoding="utf-8")
    result = invoke_import(checkpoint, dict_dir, tmp_path / "run", "--bpe-codes", str(codes))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "bpe.codes").read_bytes() == codes.read_bytes()
    pipeline = TextPipeline.from_data_bin(tmp_path / "run", "de")
    assert pipeline.bpe.encode("the") == ["the"]


@pytest.mark.parametrize("content, message", [
    (b"#version: 0.2\nt h\n\xff e\n", "BPE codes are not valid UTF-8: {codes} (byte 18)"),
    (b"#version: 0.2\nt h\na b c d\n", "bad BPE codes line (expected 'left right'): {codes}:3"),
    (b"t h\n\nh e\n", "bad BPE codes line (expected 'left right'): {codes}:2"),
    (b"#version: 7.1\nt h\n", "unsupported subword-nmt codes version (7, 1): {codes}:1"),
    (None, "BPE codes not found: {codes}"),
], ids=["not UTF-8", "three symbols", "empty line", "unknown version", "missing"])
def test_broken_bpe_codes_are_refused_at_import(tmp_path, content, message):
    # Imported, such codes made `nmt translate` fail later; the parser translate uses refuses them now.
    checkpoint, dict_dir, _ = write_fake_fairseq(tmp_path)
    codes = tmp_path / "bpe.codes"
    if content is not None:
        codes.write_bytes(content)
    result = invoke_import(checkpoint, dict_dir, tmp_path / "run", "--bpe-codes", str(codes))
    assert_one_error_line(result, f"error: {message.format(codes=codes)}")
    assert {p.name for p in tmp_path.iterdir()} == {"db", "fs"} | ({"bpe.codes"} if content is not None else set())  # no run


def _set_arg(name: str, value):
    return lambda checkpoint: setattr(checkpoint["args"], name, value)


def _set_weight(key: str, value: torch.Tensor):
    return lambda checkpoint: checkpoint["model"].__setitem__(key, value)


def _set_num_updates(value):
    return lambda checkpoint: checkpoint["optimizer_history"][-1].__setitem__("num_updates", value)


@pytest.mark.parametrize("edit, message", [
    (_set_arg("arch", ["transformer"]), "args.arch must be a string naming the architecture, not ['transformer']"),
    (_set_arg("encoder_layers", "1"), "args.encoder_layers must be a positive integer, not '1'"),
    (_set_arg("decoder_attention_heads", "2"), "args.decoder_attention_heads must be a positive integer, not '2'"),
    (_set_arg("encoder_layers", 1.0), "args.encoder_layers must be a positive integer, not 1.0"),
    (_set_arg("encoder_layers", 0), "args.encoder_layers must be a positive integer, not 0"),
    (_set_arg("encoder_embed_dim", True), "args.encoder_embed_dim must be a positive integer, not True"),
    (_set_arg("dropout", "0.1"), "args.dropout must be a number in [0, 1), not '0.1'"),
    (_set_arg("attention_dropout", 1.5), "args.attention_dropout must be a number in [0, 1), not 1.5"),
    (_set_arg("max_source_positions", "1024"), "args.max_source_positions must be a positive integer, not '1024'"),
    (_set_arg("share_all_embeddings", "False"), "args.share_all_embeddings must be true or false, not 'False'"),
    (_set_arg("source_lang", ["de"]), "args.source_lang must be a language code (a string), not ['de']"),
    (_set_arg("encoder_attention_heads", 3), "--encoder-embed-dim 8 is not divisible by --encoder-attention-heads 3"),
    (lambda c: c.__setitem__("optimizer_history", 5), "optimizer_history must be a list, not 5"),
    (lambda c: c.__setitem__("optimizer_history", ["x"]), "optimizer_history[-1] must be a dict, not 'x'"),
    (_set_num_updates("abc"), "optimizer_history[-1].num_updates must be a non-negative integer, not 'abc'"),
    (_set_num_updates(-3), "optimizer_history[-1].num_updates must be a non-negative integer, not -3"),
    (_set_weight("foo", torch.zeros(2)), "model weight 'foo' is not named encoder.* or decoder.*"),
    (_set_weight("encoder.layers.0.layer_norms.7.weight", torch.zeros(8)),
     "model weight encoder.layers.0.layer_norms.7.weight: a fairseq encoder layer has layer_norms.0 to layer_norms.1 only"),
    (_set_weight("decoder.layers.0.layer_norms.x.bias", torch.zeros(8)), "layer_norms.0 to layer_norms.2 only"),
    (_set_weight("encoder.version", torch.tensor([])), "model weight encoder.version is empty"),
    (_set_weight("encoder.layers.0.self_attn.in_proj_weight", torch.tensor(1.0)),
     "model weight encoder.layers.0.self_attn.in_proj_weight has shape (): a fused q/k/v projection"),
    (_set_weight("encoder.layers.0.self_attn.k_proj.weight", torch.zeros(8, 4)),
     "fairseq weights of different shapes where our model joins them: encoder.layers.0.self_attn.q_proj.weight (8, 8)"),
    (_set_weight("encoder.embed_tokens.weight", torch.zeros(12)), "model weight encoder.embed_tokens.weight has shape (12,)"),
], ids=lambda value: None if callable(value) else value.split(" must")[0].split(":")[0][:40])
def test_malformed_fairseq_checkpoint_gives_one_error_line(tmp_path, edit, message):
    checkpoint, dict_dir, _ = write_fake_fairseq(tmp_path, "x.pt", edit)
    assert_one_error_line(invoke_import(checkpoint, dict_dir, tmp_path / "run"), f"error: {checkpoint}: ", message)
    assert not (tmp_path / "run").exists()


def test_hydra_cfg_fields_are_named_where_they_are_stored(tmp_path):
    cfg = {"model": {"_name": "transformer", "encoder": {"layers": 2.0}}, "task": {"source_lang": "de", "target_lang": "en"}}
    checkpoint, dict_dir, _ = write_fake_fairseq(tmp_path, "x.pt", lambda c: c.update(args=None, cfg=cfg))
    assert_one_error_line(invoke_import(checkpoint, dict_dir, tmp_path / "run"),
                          f"{checkpoint}: cfg.model.encoder.layers must be a positive integer, not 2.0")


def test_unforeseen_malformation_still_gives_one_line_naming_the_checkpoint():
    """Behind the explicit checks, a field of a type nobody foresaw still becomes one NmtError."""
    with pytest.raises(NmtError, match=r"^fs/x\.pt: malformed fairseq checkpoint \(TypeError: unhashable type: 'list'\)$"):
        with malformed_checkpoint_as_error(Path("fs/x.pt")):
            {}.get(["a list as a key"])


def test_out_dir_holding_an_nmt_run_is_refused_without_force(tmp_path):
    checkpoint, dict_dir, _ = write_fake_fairseq(tmp_path)
    run = tmp_path / "run3"  # stands in for a training run: its meta.json, dictionaries, checkpoints and log
    run.mkdir()
    for name, text in [("meta.json", '{"source_lang": "de", "target_lang": "en"}\n'), ("dict.de.txt", "Haus 5\n"),
                       ("dict.en.txt", "house 5\n"), ("checkpoint_last.pt", "weights"), ("train_log.jsonl", "{}\n")]:
        (run / name).write_text(text, encoding="utf-8")
    before = files_of(run)
    assert_one_error_line(invoke_import(checkpoint, dict_dir, run), f"--out {run} already holds", "--force")
    assert files_of(run) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db", "fs", "run3"]  # no staging directory left

    result = invoke_import(checkpoint, dict_dir, run, "--force")
    assert result.exit_code == 0, result.output
    assert sorted(files_of(run)) == ["checkpoint.pt", "dict.de.txt", "dict.en.txt", "meta.json"]
    assert load_checkpoint(run / "checkpoint.pt")["num_updates"] == 7


def test_rerunning_the_same_import_is_harmless_and_another_is_refused(tmp_path):
    checkpoint, dict_dir, _ = write_fake_fairseq(tmp_path)
    out = tmp_path / "run"
    assert invoke_import(checkpoint, dict_dir, out).exit_code == 0
    before = files_of(out)
    again = invoke_import(checkpoint, dict_dir, out)
    assert again.exit_code == 0 and "already holds this import" in again.output, again.output
    assert files_of(out) == before

    other, _, _ = write_fake_fairseq(tmp_path, "other.pt", _set_num_updates(9))
    assert_one_error_line(invoke_import(other, dict_dir, out), f"--out {out} already holds")
    assert files_of(out) == before
    (out / "notes.txt").write_text("mine\n", encoding="utf-8")  # the same import, plus a file of the user's
    assert_one_error_line(invoke_import(checkpoint, dict_dir, out), "--force")
    assert (out / "notes.txt").is_file()


def test_out_dir_holding_the_inputs_is_refused_even_with_force(tmp_path):
    checkpoint, dict_dir, _ = write_fake_fairseq(tmp_path)
    assert_one_error_line(invoke_import(checkpoint, dict_dir, tmp_path / "fs", "--force"),
                          f"input file {checkpoint} is inside --out {tmp_path / 'fs'}")
    assert checkpoint.is_file()


def test_out_path_that_is_a_file_is_refused(tmp_path):
    checkpoint, dict_dir, _ = write_fake_fairseq(tmp_path)
    (tmp_path / "run").write_text("x", encoding="utf-8")
    assert_one_error_line(invoke_import(checkpoint, dict_dir, tmp_path / "run", "--force"), "is not a directory")
