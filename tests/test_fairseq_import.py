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

from nmt_cli.checkpoint import load_checkpoint, model_from_checkpoint
from nmt_cli.cli import main
from nmt_cli.config import DecodeConfig
from nmt_cli.data.dictionary import EOS_ID, PAD_ID, Dictionary
from nmt_cli.decode.search import generate
from nmt_cli.errors import NmtError
from nmt_cli.fairseq_import import load_fairseq_checkpoint, model_config_from_args, read_fairseq_dictionary
from nmt_cli.text.pipeline import TextPipeline
from nmt_cli.text.subword_nmt import SubwordNmtBpe

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FAIRSEQ_PYTHON = Path(os.environ.get("NMT_FAIRSEQ_PYTHON", REPO / ".venv-fairseq" / "bin" / "python"))
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



@pytest.fixture(scope="session")
def fairseq_python() -> Path:
    """The fairseq environment's interpreter; skips the test when it cannot import fairseq."""
    if not FAIRSEQ_PYTHON.exists():
        pytest.skip(f"no fairseq environment at {FAIRSEQ_PYTHON} (run scripts/setup_fairseq_env.sh or set NMT_FAIRSEQ_PYTHON)")
    check = subprocess.run([str(FAIRSEQ_PYTHON), "-c", "import fairseq, sacremoses, subword_nmt"], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"{FAIRSEQ_PYTHON} cannot import fairseq, sacremoses and subword_nmt: {check.stderr.strip().splitlines()[-1:]}")
    return FAIRSEQ_PYTHON


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
    ({"activation_fn": "gelu"}, "--activation-fn gelu"),
    ({"encoder_normalize_before": True}, "--encoder-normalize-before differing"),
    ({"arch": "lstm"}, "architecture 'lstm' is not supported"),
])
def test_unsupported_options_are_named(option, message):
    args = {"arch": "transformer", **option}
    with pytest.raises(NmtError, match=message):
        model_config_from_args(args, {"encoder.version": torch.tensor([3.0]), "decoder.version": torch.tensor([3.0])},
                               Path("model.pt"))


def test_dictionary_overwriting_a_symbol_is_refused(tmp_path):
    path = tmp_path / "dict.de.txt"
    path.write_text("Haus 3\n</s> 1 #fairseq:overwrite\n", encoding="utf-8")
    with pytest.raises(NmtError, match=r"dict\.de\.txt:2"):
        read_fairseq_dictionary(path)
