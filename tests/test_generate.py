"""`nmt generate` and fairseq data-bins: the lines fairseq-generate prints, checked by hand and
against the real fairseq (reference environment, NMT_FAIRSEQ_PYTHON; skipped without).

The hand checks use a randomly initialised tiny model: its H- tokens are checked against
greedy decoding's definition (each token the argmax of the model's teacher-forced
distribution), its scores against teacher forcing, its order against fairseq's batching
rules worked out for chosen lengths, and BLEU against counts done by hand.
"""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fault_utils import assert_one_error, nmt, tiny_run_dir
from databin_utils import WORDS, reversal_pairs, write_data_bin
from fairseq_commands import run_fairseq_commands
from nmt_cli.checkpoints.format import load_checkpoint, model_from_checkpoint
from nmt_cli.data.dictionary import EOS_ID, Dictionary
from nmt_cli.data.indexed import IndexedDataset
from nmt_cli.decode.generate import fairseq_batches, hard_alignment_text
from nmt_cli.scoring.fairseq_bleu import FairseqBleu

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py

SHORT = ["--max-len-b", "12"]
TEST_PAIRS = 48  # of the fairseq comparison  # a random model rarely stops by itself
TIMING = re.compile(r"^Translated (\d[\d,]*) sentences \((\d[\d,]*) tokens\) in "
                    r"[\d.]+s \([\d.na]+ sentences/s, [\d.na]+ tokens/s\)$")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> tuple[Path, Path]:
    """A data-bin whose test split has sources of lengths 5, 3, 7, 4 (with </s>) and a random model."""
    root = tmp_path_factory.mktemp("generate")
    test = [(src, src[::-1]) for src in (["w1", "w2", "w3", "w4"], ["w5", "w6"], ["w7"] * 6, ["w8", "w9", "w1"])]
    data_bin = write_data_bin(root / "bin", {"train": reversal_pairs(20, 0), "test": test})
    return data_bin, tiny_run_dir(data_bin, root / "run") / "checkpoint_best.pt"


def generate(data_bin: Path, checkpoint: Path, *args: str, short: bool = True):
    result = nmt(["generate", data_bin, "--path", checkpoint, "--cpu", *(SHORT if short else ()), *args])
    assert result.exit_code == 0, result.output
    return result


def sentences(stdout: str) -> dict[int, dict[str, list[str]]]:
    """Per sentence id, its lines by kind (S, T, H, D, P), the fields after the id."""
    out: dict[int, dict[str, list[str]]] = {}
    for line in stdout.splitlines():
        match = re.match(r"^([STHDPA])-(\d+)\t(.*)$", line)
        if match:
            out.setdefault(int(match[2]), {}).setdefault(match[1], []).append(match[3])
    return out


def test_each_line_has_fairseqs_format_and_values(workspace):
    data_bin, checkpoint = workspace
    result = generate(data_bin, checkpoint, "--beam", "1")
    stdout = result.stdout
    model = model_from_checkpoint(load_checkpoint(checkpoint)).eval()
    dictionary = Dictionary.load(data_bin / "dict.tgt.txt")
    test = IndexedDataset(data_bin / "test.src-tgt.src")
    target = IndexedDataset(data_bin / "test.src-tgt.tgt")
    found = sentences(stdout)
    assert sorted(found) == [0, 1, 2, 3]
    for i, lines in found.items():
        src = test[i].tolist()
        assert lines["S"] == [" ".join(dictionary[t] for t in src[:-1])]
        assert lines["T"] == [" ".join(dictionary[t] for t in target[i].tolist()[:-1])]
        score, text = lines["H"][0].split("\t")
        assert lines["D"] == lines["H"]
        # Greedy decoding: each token is the argmax given the ones before (teacher forcing).
        tokens = [dictionary.index[p] for p in text.split()] + [EOS_ID]
        with torch.no_grad():
            logits = model(torch.tensor([src]), torch.tensor([[EOS_ID] + tokens[:-1]]))
        lprobs = torch.log_softmax(logits.float(), dim=-1)[0]
        if len(tokens) <= 12:  # not cut by --max-len-b: </s> was the model's choice too
            assert lprobs.argmax(-1).tolist() == tokens
        picked = lprobs[torch.arange(len(tokens)), tokens]
        positional = [float(p) for p in lines["P"][0].split()]
        assert all(re.fullmatch(r"-?\d+\.\d{4}", p) for p in lines["P"][0].split())
        assert positional == pytest.approx((picked / math.log(2)).tolist(), abs=2e-4)
        # fairseq's score: summed log-prob / length (lenpen 1), in base 2.
        assert float(score) == pytest.approx(float(picked.sum()) / len(tokens) / math.log(2), abs=1e-4)
    assert stdout.splitlines()[-1].startswith("Generate test with beam=1: BLEU4 = ")
    # fairseq logs this line (stderr); the 4 sentences are one batch under the size multiple of 8, which
    # fairseq 0.12 would drop: nmt decodes it.
    assert TIMING.match(result.stderr.splitlines()[-1])[1] == "4"


def test_score_reference_scores_the_targets_by_teacher_forcing(workspace):
    data_bin, checkpoint = workspace
    found = sentences(generate(data_bin, checkpoint, "--score-reference", "--batch-size", "3").stdout)
    model = model_from_checkpoint(load_checkpoint(checkpoint)).eval()
    src, tgt = IndexedDataset(data_bin / "test.src-tgt.src"), IndexedDataset(data_bin / "test.src-tgt.tgt")
    for i, lines in found.items():
        target = tgt[i].tolist()
        picked = step_by_step_log_probs(model, src[i].tolist(), target)
        score, text = lines["H"][0].split("\t")
        assert text == lines["T"][0]
        assert [float(p) for p in lines["P"][0].split()] == pytest.approx((picked / math.log(2)).tolist(), abs=2e-4)
        assert float(score) == pytest.approx(float(picked.mean()) / math.log(2), abs=1e-4)


def step_by_step_log_probs(model, source: list[int], target: list[int]) -> torch.Tensor:
    """Each target token's log-probability from the search's incremental steps, one sentence
    alone: another path than the batched teacher forcing that scores references."""
    with torch.no_grad():
        encoder_out, cache = model.encode(torch.tensor([source])), model.new_cache()
        return torch.stack([model.decode_step(torch.tensor([[EOS_ID] + target[:j]]), encoder_out, cache)[0, token]
                            for j, token in enumerate(target)]).float()


def test_alignment_lines_follow_each_p_line_and_come_from_attention(workspace):
    """Hard pairs: each target token but </s> with a source token (never its </s>); soft: each
    token's attention over the source, which sums to one, and whose largest entry (</s> left
    out) is the hard pair's source."""
    data_bin, checkpoint = workspace
    src = IndexedDataset(data_bin / "test.src-tgt.src")
    hard = generate(data_bin, checkpoint, "--beam", "3", "--nbest", "2", "--print-alignment").stdout
    soft = generate(data_bin, checkpoint, "--beam", "3", "--nbest", "2", "--print-alignment", "soft").stdout
    kinds = [line[0] for line in hard.splitlines() if re.match(r"^[HDPA]-", line)]
    assert kinds == list("HDPA") * 8
    assert [line for line in soft.splitlines() if line[0] != "A"] == [line for line in hard.splitlines() if line[0] != "A"]
    for i, lines in sentences(hard).items():
        source_length = len(src[i])
        for h, pairs, attention in zip(lines["H"], lines["A"], sentences(soft)[i]["A"]):
            tokens = len(h.split("\t")[1].split())
            rows = [[float(p) for p in row.split(",")] for row in attention.split()]
            assert len(rows) == tokens + 1 and all(len(row) == source_length for row in rows)  # </s> on both sides
            assert all(sum(row) == pytest.approx(1, abs=1e-5) for row in rows)
            expected = [f"{max(range(source_length - 1), key=row.__getitem__)}-{t}" for t, row in enumerate(rows[:-1])]
            assert pairs.split() == expected
    quiet = generate(data_bin, checkpoint, "--print-alignment", "--quiet").stdout
    assert len(quiet.splitlines()) == 1


def test_hard_alignment_text_is_fairseqs():
    """`src-tgt` per target token; fairseq's `extract_hard_alignment` gives no pairs for a source
    of `</s>` alone, nor for a hypothesis of `</s>` alone."""
    assert hard_alignment_text([2, 0, 1], source_length=4) == "2-0 0-1 1-2"
    assert hard_alignment_text([0, 0], source_length=1) == ""
    assert hard_alignment_text([], source_length=5) == ""


def test_sentences_come_in_fairseqs_batch_order(workspace):
    """Sources of 5, 3, 7, 4 tokens, two a batch: sorted 1 (3), 3 (4), 0 (5), 2 (7); longest first in each."""
    data_bin, checkpoint = workspace
    stdout = generate(data_bin, checkpoint, "--batch-size", "2", "--beam", "2").stdout
    ids = [int(line[2:].split("\t")[0]) for line in stdout.splitlines() if line.startswith("S-")]
    assert ids == [3, 1, 2, 0]
    whole = generate(data_bin, checkpoint, "--beam", "2").stdout  # one batch
    assert [int(line[2:].split("\t")[0]) for line in whole.splitlines() if line.startswith("S-")] == [2, 0, 3, 1]


def test_nbest_prints_each_hypothesis_best_first(workspace):
    data_bin, checkpoint = workspace
    found = sentences(generate(data_bin, checkpoint, "--beam", "3", "--nbest", "3").stdout)
    for lines in found.values():
        assert len(lines["H"]) == len(lines["D"]) == len(lines["P"]) == 3
        scores = [float(h.split("\t")[0]) for h in lines["H"]]
        assert scores == sorted(scores, reverse=True)


def test_quiet_prints_only_the_summary_and_results_path_writes_the_file(workspace, tmp_path):
    data_bin, checkpoint = workspace
    quiet = generate(data_bin, checkpoint, "--quiet")
    assert len(quiet.stdout.splitlines()) == 1 and quiet.stdout.startswith("Generate test with beam=5: BLEU4 = ")
    assert TIMING.match(quiet.stderr.splitlines()[-1])
    full = generate(data_bin, checkpoint).stdout
    to_file = generate(data_bin, checkpoint, "--results-path", tmp_path / "out")
    assert to_file.stdout == ""
    assert (tmp_path / "out" / "generate-test.txt").read_text(encoding="utf-8") == full
    assert full.count("\nH-") == 4


def test_remove_bpe_joins_pieces_in_every_text_line(tmp_path):
    pieces = ["ab@@", "cd", "e@@", "f@@", "g"]
    test = [(pieces, pieces[::-1])]
    data_bin = write_data_bin(tmp_path / "bin", {})  # meta.json; the dictionaries and splits follow
    write_pieces_data_bin(data_bin, Dictionary(pieces), {"train": test, "test": test})
    checkpoint = tiny_run_dir(data_bin, tmp_path / "run") / "checkpoint_best.pt"
    lines = sentences(generate(data_bin, checkpoint, "--remove-bpe").stdout)[0]
    assert lines["S"] == ["abcd efg"]
    assert lines["T"] == ["g fecd ab"]  # fairseq's rule: (text + " ").replace("@@ ", ""), so "ab@@" at the end loses "@@"
    assert "@@ " not in lines["H"][0]


def write_pieces_data_bin(destdir: Path, dictionary: Dictionary, splits: dict) -> None:
    from nmt_cli.data.indexed import IndexedDatasetBuilder

    for lang in ("src", "tgt"):
        dictionary.save(destdir / f"dict.{lang}.txt")
    for split, pairs in splits.items():
        for side, lang in enumerate(("src", "tgt")):
            builder = IndexedDatasetBuilder(destdir / f"{split}.src-tgt.{lang}", len(dictionary))
            for pair in pairs:
                builder.add(dictionary.encode(pair[side]))
            builder.finalize()


# --- fairseq's BLEU and batching, by hand ----------------------------------------------------


def test_fairseq_bleu_by_hand():
    bleu = FairseqBleu()
    bleu.add("a b c d".split(), "a b c e".split())
    # 3/4 unigrams, 2/3 bigrams, 1/2 trigrams, 0/1 4-grams: a zero precision gives 0.
    assert bleu.result_string() == "BLEU4 = 0.00, 75.0/66.7/50.0/0.0 (BP=1.000, ratio=1.000, syslen=4, reflen=4)"
    bleu.add("x y z w v".split(), "x y z w".split())
    # Now 7/8, 5/6, 3/4, 1/2; BP = exp(1 - 9/8).
    expected = math.exp(1 - 9 / 8) * math.exp((math.log(7 / 8) + math.log(5 / 6) + math.log(3 / 4) + math.log(1 / 2)) / 4)
    assert bleu.score == pytest.approx(100 * expected)
    assert bleu.result_string().endswith("(BP=0.882, ratio=0.889, syslen=8, reflen=9)")
    # A reference <unk> never matches; an empty hypothesis counts one token (its </s>).
    unk = FairseqBleu()
    unk.add(["<unk>", "b"], ["<unk>", "b"], unk="<unk>")
    assert unk.matches[0] == 1 and unk.totals[0] == 2
    empty = FairseqBleu()
    empty.add(["a"], [])
    assert (empty.hyp_len, empty.ref_len, empty.matches[0]) == (1, 1, 0)


def test_fairseq_batches_follow_the_size_multiple_and_the_budget():
    order = np.arange(20)
    sizes = np.full(20, 10)
    # 12 sentences of 10 tokens fit 120, but batches are cut at multiples of 8: 8, 8, then the 4 left.
    assert [len(b) for b in fairseq_batches(order, sizes, 120, None, 8)] == [8, 8, 4]
    assert [len(b) for b in fairseq_batches(order, sizes, None, 6, 1)] == [6, 6, 6, 2]
    growing = np.array([1, 1, 1, 9, 9])  # padded size counts the longest sentence
    assert [b.tolist() for b in fairseq_batches(np.arange(5), growing, 18, None, 1)] == [[0, 1, 2], [3, 4]]


# --- fairseq data-bins ------------------------------------------------------------------------


def write_fairseq_split(prefix: Path, rows: list[list[int]]) -> None:
    """A `.bin`/`.idx` pair in fairseq's MMapIndexedDataset layout, written from its description."""
    ids = np.array([i for row in rows for i in row], dtype="<u2")
    prefix.with_name(prefix.name + ".bin").write_bytes(ids.tobytes())
    sizes = np.array([len(r) for r in rows], dtype="<i4")
    pointers = (np.concatenate([[0], np.cumsum(sizes)[:-1]]) * 2).astype("<i8")
    header = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<Q", len(rows))
    prefix.with_name(prefix.name + ".idx").write_bytes(header + sizes.tobytes() + pointers.tobytes())


def fairseq_data_bin(root: Path, src: str = "de", tgt: str = "en") -> Path:
    """A data-bin as fairseq-preprocess lays it out: dictionaries and split files, no meta.json."""
    root.mkdir(parents=True, exist_ok=True)
    dictionary = Dictionary(WORDS)
    for lang in (src, tgt):
        dictionary.save(root / f"dict.{lang}.txt")
    for split, count in (("train", 40), ("valid", 6), ("test", 6)):
        pairs = reversal_pairs(count, len(split))
        for side, lang in enumerate((src, tgt)):
            write_fairseq_split(root / f"{split}.{src}-{tgt}.{lang}", [dictionary.encode(p[side]) for p in pairs])
    return root


def test_a_fairseq_index_reads_as_the_same_sentences(tmp_path):
    rows = [[4, 5, 2], [2], [6, 7, 8, 9, 2]]
    write_fairseq_split(tmp_path / "x", rows)
    dataset = IndexedDataset(tmp_path / "x")
    assert [dataset[i].tolist() for i in range(len(dataset))] == rows
    assert dataset.sizes.tolist() == [3, 1, 5]


def test_a_fairseq_data_bin_trains_generates_and_its_run_translates_bpe(tmp_path):
    data_bin = fairseq_data_bin(tmp_path / "bin")
    run = tmp_path / "run"
    result = nmt(["train", data_bin, "--save-dir", run, "--arch", "transformer_tiny", "--max-tokens", "256",
                  "--required-batch-size-multiple", "1", "--max-update", "2", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert not (run / "meta.json").exists() and (run / "dict.de.txt").is_file()
    stdout = generate(data_bin, run / "checkpoint_last.pt").stdout
    assert sorted(sentences(stdout)) == list(range(6))
    translated = nmt(["translate", "--path", run / "checkpoint_last.pt", "--input-format", "bpe",
                      "--output-format", "bpe", "--device", "cpu", *SHORT], input="w1 w2 w3\nw4\n")
    assert translated.exit_code == 0 and len(translated.stdout.splitlines()) == 2
    raw = nmt(["translate", "--path", run / "checkpoint_last.pt", "--device", "cpu"], input="w1 w2\n")
    assert_one_error(raw.exit_code, raw.stderr, "no meta.json", "--input-format bpe")


def test_a_full_disk_is_one_error_line_naming_the_output(workspace, tmp_path):
    resource = pytest.importorskip("resource")
    _, checkpoint = workspace
    # Output beyond the text stream's buffer: it fails in a write, not at the file's close.
    data_bin = write_data_bin(tmp_path / "bin", {"train": reversal_pairs(20, 0), "test": reversal_pairs(300, 1)})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, hard))  # `ulimit -f`: less than the output
    try:
        result = nmt(["generate", data_bin, "--path", checkpoint, "--cpu", *SHORT, "--results-path", tmp_path / "out"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    output = tmp_path / "out" / "generate-test.txt"
    assert_one_error(result.exit_code, result.stderr, f"cannot write {output}: File too large")
    assert list((tmp_path / "out").iterdir()) == []  # nothing half-written under the output's name


def test_bad_input_is_one_error_line(workspace, tmp_path):
    data_bin, checkpoint = workspace
    cases = [
        (["--gen-subset", "test7"], ("no 'test7' split",)),
        (["-s", "xx", "-t", "tgt"], ("no language 'xx'",)),
        (["--remove-bpe", "bogus"], ("--remove-bpe must be one of",)),
        (["--print-alignment", "soft", "--score-reference"], ("--print-alignment soft with --score-reference",)),
        (["--score-reference", "--temperature", "2"], ("own probabilities: drop --temperature",)),
        (["--fp16"], ("--fp16 needs a GPU",)),
    ]
    for args, fragments in cases:
        result = nmt(["generate", data_bin, "--path", checkpoint, "--cpu", *args])
        assert_one_error(result.exit_code, result.stderr, *fragments)
    fairseq_bin = fairseq_data_bin(tmp_path / "fs")
    (fairseq_bin / "dict.en.txt").unlink()
    result = nmt(["generate", fairseq_bin, "--path", checkpoint, "--cpu"])
    assert_one_error(result.exit_code, result.stderr, "dict.en.txt not found")
    both = fairseq_data_bin(tmp_path / "two")  # de-en and en-de: which one is meant?
    fairseq_data_bin(both, "en", "de")
    result = nmt(["generate", both, "--path", checkpoint, "--cpu"])
    assert_one_error(result.exit_code, result.stderr, "several language pairs", "de-en, en-de", "--source-lang")
    result = nmt(["generate", data_bin, "--path", checkpoint.parent / "missing.pt", "--cpu"])
    assert_one_error(result.exit_code, result.stderr, "missing.pt")
    other = write_data_bin(tmp_path / "other", {"test": reversal_pairs(3, 0)})
    Dictionary(WORDS[::-1]).save(other / "dict.tgt.txt")
    result = nmt(["generate", other, "--path", checkpoint, "--cpu"])
    assert_one_error(result.exit_code, result.stderr, "target dictionary", "does not match checkpoint")


# --- against the real fairseq ----------------------------------------------------------------


def bpe_corpus(count: int, seed: int) -> list[tuple[str, str]]:
    """Pre-segmented text: words split into `@@ ` pieces, the target the source reversed word by word."""
    import random

    rng = random.Random(seed)
    words = ["ab@@ cd", "ef", "gh@@ ij@@ kl", "mn", "op@@ q", "rs", "tu", "vw@@ xy", "z", "the", "a@@ b", "c"]
    out = []
    for _ in range(count):
        chosen = [rng.choice(words) for _ in range(rng.randint(2, 9))]
        out.append((" ".join(chosen), " ".join(chosen[::-1])))
    return out


@pytest.fixture(scope="module")
def fairseq_run(fairseq_python, tmp_path_factory) -> dict:
    """fairseq-preprocess and a few updates of fairseq-train on pre-segmented text; nmt's import of the model."""
    root = tmp_path_factory.mktemp("fairseq_generate")
    for split, count, seed in (("train", 300, 0), ("valid", 20, 1), ("test", TEST_PAIRS, 2)):
        pairs = bpe_corpus(count, seed)
        # A word the dictionaries will not hold: <unk> in S- and T- lines and in BLEU.
        if split == "test":
            pairs[3] = ("unseen@@ word ef", "ef unseen@@ word")
        (root / f"{split}.de").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (root / f"{split}.en").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    data_bin, save_dir = root / "data-bin", root / "checkpoints"
    run_fairseq_commands(fairseq_python, [
        ["preprocess", "--source-lang", "de", "--target-lang", "en", "--trainpref", root / "train",
         "--validpref", root / "valid", "--testpref", root / "test", "--destdir", data_bin, "--workers", "1"],
        ["train", data_bin, "--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "2",
         "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
         "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
         "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "2000", "--max-update", "30", "--seed", "1",
         "--save-dir", save_dir, "--no-epoch-checkpoints", "--disable-validation", "--cpu", "--num-workers", "0",
         "--log-format", "none"],
    ], root)
    run = root / "run"
    result = nmt(["import-fairseq", save_dir / "checkpoint_last.pt", "--dict-dir", data_bin, "--out", run])
    assert result.exit_code == 0, result.output
    return {"data_bin": data_bin, "checkpoint": save_dir / "checkpoint_last.pt", "run": run, "python": fairseq_python}


def fairseq_lines(text: str) -> list[str]:
    """The lines both print the same: S-, T-, H-, D-, P-, A- and the BLEU line (fairseq's output also holds its logs)."""
    return [line for line in text.splitlines() if re.match(r"^[STHDPA]-\d+\t|^Generate ", line)]


def assert_same_output(ours: list[str], theirs: list[str]) -> None:
    """Same lines in the same order; scores equal to float32 rounding, everything else exactly."""
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs):
        kind = mine.split("-", 1)[0]
        if kind in ("H", "D"):
            id_a, score_a, text_a = mine.split("\t")
            id_b, score_b, text_b = reference.split("\t")
            assert (id_a, text_a) == (id_b, text_b)
            assert float(score_a) == pytest.approx(float(score_b), abs=1e-4)
        elif kind == "P":
            a, b = mine.split("\t"), reference.split("\t")
            assert a[0] == b[0]
            assert [float(x) for x in a[1].split()] == pytest.approx([float(x) for x in b[1].split()], abs=2e-4)
        elif kind == "A" and "," in reference:  # soft: probabilities with 6 decimals
            a, b = mine.split("\t"), reference.split("\t")
            assert a[0] == b[0] and [len(row.split(",")) for row in a[1].split()] == [len(row.split(",")) for row in b[1].split()]
            assert [float(x) for x in re.split("[ ,]", a[1])] == pytest.approx([float(x) for x in re.split("[ ,]", b[1])], abs=2e-6)
        else:
            assert mine == reference


# fairseq 0.12 drops a last batch whose size is not a multiple of --required-batch-size-multiple (its
# issue #5036) and nmt does not: the flags keep every batch whole for fairseq too (48 = 3 x 16; any size under 1).
GENERATE_FLAGS = {
    "ids-bleu": ("--beam", "4", "--batch-size", "16"),
    "nbest-remove-bpe": ("--beam", "3", "--nbest", "2", "--max-tokens", "120", "--required-batch-size-multiple", "1",
                         "--lenpen", "0.6", "--unkpen", "0.5", "--remove-bpe"),
    "quiet-short": ("--beam", "5", "--max-len-b", "7", "--remove-bpe", "--quiet"),
    "sacrebleu": ("--beam", "2", "--scoring", "sacrebleu", "--remove-bpe", "--max-sentences", "24"),
    "score-reference": ("--score-reference", "--batch-size", "16"),
    "alignment-nbest": ("--beam", "4", "--nbest", "2", "--batch-size", "16", "--print-alignment"),
    "alignment-soft": ("--beam", "3", "--batch-size", "16", "--print-alignment", "soft", "--remove-bpe"),
    "score-reference-alignment": ("--score-reference", "--batch-size", "16", "--print-alignment", "hard"),
}
ENSEMBLE_FLAGS = {
    "search": ("--beam", "3", "--batch-size", "16", "--print-alignment"),
    "score-reference": ("--score-reference", "--batch-size", "16", "--print-alignment"),
}


@pytest.fixture(scope="module")
def second_model(fairseq_run, tmp_path_factory) -> dict:
    """Another model for the same data-bin, trained by nmt, and its export as a fairseq checkpoint."""
    root = tmp_path_factory.mktemp("second_model")
    result = nmt(["train", fairseq_run["data_bin"], "--save-dir", root / "run", "--arch", "transformer_tiny",
                  "--max-tokens", "512", "--max-update", "3", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    result = nmt(["export", root / "run" / "checkpoint_last.pt", root / "fairseq", "--format", "fairseq"])
    assert result.exit_code == 0, result.output
    return {"nmt": root / "run" / "checkpoint_last.pt", "fairseq": root / "fairseq" / "checkpoint.pt"}


@pytest.fixture(scope="module")
def fairseq_generated(fairseq_run, second_model, tmp_path_factory) -> dict[tuple[str, str], str]:
    """What fairseq-generate prints with each of GENERATE_FLAGS (fairseq's model) and of
    ENSEMBLE_FLAGS (fairseq's model and the second one), keyed ("single" or "ensemble", name)."""
    def command(paths: str, flags: tuple[str, ...]) -> list:
        # --num-workers 0: batches loaded in the process (the same batches), not in a worker
        # process whose shutdown takes seconds when the next command starts.
        return ["generate", fairseq_run["data_bin"], "--path", paths, "--gen-subset", "test", "--cpu",
                "--num-workers", "0", *flags]

    commands = {("single", name): command(str(fairseq_run["checkpoint"]), flags) for name, flags in GENERATE_FLAGS.items()}
    ensemble = f"{fairseq_run['checkpoint']}:{second_model['fairseq']}"
    commands.update({("ensemble", name): command(ensemble, flags) for name, flags in ENSEMBLE_FLAGS.items()})
    outputs = run_fairseq_commands(fairseq_run["python"], list(commands.values()), tmp_path_factory.mktemp("generated"))
    return dict(zip(commands, outputs))


@pytest.mark.parametrize("name", GENERATE_FLAGS)
def test_generate_prints_what_fairseq_generate_prints(fairseq_run, fairseq_generated, name):
    flags = GENERATE_FLAGS[name]
    ours = generate(fairseq_run["data_bin"], fairseq_run["run"] / "checkpoint.pt", "--gen-subset", "test", *flags,
                    short=False).stdout
    assert_same_output(fairseq_lines(ours), fairseq_lines(fairseq_generated["single", name]))
    assert fairseq_lines(ours)[-1].startswith("Generate test with beam=")
    if "--quiet" not in flags:
        assert len(fairseq_lines(ours)) > TEST_PAIRS * 5
        assert any("<unk>" in line for line in fairseq_lines(ours) if line.startswith("S-"))
    if "--print-alignment" in flags:
        nbest = int(flags[flags.index("--nbest") + 1]) if "--nbest" in flags else 1
        assert len([line for line in fairseq_lines(ours) if line.startswith("A-")]) == TEST_PAIRS * nbest


@pytest.mark.parametrize("name", ENSEMBLE_FLAGS)
def test_an_ensemble_prints_what_fairseq_generate_prints(fairseq_run, second_model, fairseq_generated, name):
    """fairseq's model and one nmt trained: probabilities averaged, the alignment from their averaged attention."""
    ours = generate(fairseq_run["data_bin"], f"{fairseq_run['run'] / 'checkpoint.pt'}:{second_model['nmt']}",
                    "--gen-subset", "test", *ENSEMBLE_FLAGS[name], short=False).stdout
    assert_same_output(fairseq_lines(ours), fairseq_lines(fairseq_generated["ensemble", name]))
    assert len([line for line in fairseq_lines(ours) if line.startswith("A-")]) == TEST_PAIRS


def test_a_data_bin_of_fairseq_preprocess_trains_and_generates(fairseq_run, tmp_path):
    run = tmp_path / "run"
    result = nmt(["train", fairseq_run["data_bin"], "--save-dir", run, "--arch", "transformer_tiny", "--max-tokens",
                  "512", "--max-update", "2", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    result = generate(fairseq_run["data_bin"], run / "checkpoint_last.pt", "--quiet")
    assert TIMING.match(result.stderr.splitlines()[-1])[1] == str(TEST_PAIRS)
