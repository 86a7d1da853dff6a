"""--eval-bleu and checkpoint selection by any metric.

The logged BLEU is checked against `nmt translate` + `nmt score` on the same checkpoint;
selection against validations whose BLEU is scripted to disagree with their loss;
--keep-best-checkpoints against a naive top-N; resume against an uninterrupted run.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from fault_utils import ForkServer, assert_one_error, model_equal, nmt

from nmt_cli.checkpoints.format import load_checkpoint, model_from_checkpoint
from nmt_cli.checkpoints.names import SCORED_BEST_NAME, scored_best_checkpoint
from nmt_cli.config import TrainConfig
from nmt_cli.data.pairs import load_data_bin
from nmt_cli.train.best import ScoredCheckpoint, keep_best
from nmt_cli.train.eval_bleu import BleuScores, ValidBleu, target_segmentation

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py

TINY = ["--arch", "transformer_tiny", "--max-tokens", "512", "--required-batch-size-multiple", "1",
        "--lr", "5e-3", "--warmup-updates", "10", "--device", "cpu", "--dropout", "0.0", "--log-interval", "10"]
SEARCH = ["--beam", "2", "--lenpen", "1.0", "--max-len-a", "0", "--max-len-b", "200"]
EVAL_SEARCH = ["--eval-bleu-beam", "2", "--eval-bleu-lenpen", "1.0", "--eval-bleu-max-len-a", "0",
               "--eval-bleu-max-len-b", "200"]


def write_copy_corpus(root: Path) -> Path:
    """A copy task in raw text (cased words, punctuation): learned fast enough for a BLEU above 0."""
    rng = random.Random(5)
    words = ["".join(rng.choice("aeioubdgklmnprst") for _ in range(rng.randint(2, 5))) for _ in range(30)]
    root.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 300), ("valid", 24)):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 7))).capitalize() + "." for _ in range(count)]
        if split == "valid":
            lines[3] = ""  # a blank line: translated as an empty line, as translate does
        (root / f"{split}.en").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        (root / f"{split}.de").write_text("".join((line or "Leer.") + "\n" for line in lines), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """(raw text directory, data-bin made from it by nmt preprocess)."""
    root = tmp_path_factory.mktemp("evalbleu")
    raw = write_copy_corpus(root / "raw")
    data_bin = root / "bin"
    result = nmt(["preprocess", "-s", "en", "-t", "de", "--trainpref", raw / "train", "--validpref", raw / "valid",
                  "--destdir", data_bin, "--joined-dictionary", "--bpe-size", "100"])
    assert result.exit_code == 0, result.output
    return raw, data_bin


def read_log(run: Path, kind: str = "valid") -> list[dict]:
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    return [r for r in records if r["type"] == kind]


def test_preprocess_keeps_the_raw_references(corpus):
    raw, data_bin = corpus
    meta = json.loads((data_bin / "meta.json").read_text())
    assert meta["references"] == {"valid": "valid.en-de.de.txt"}
    assert (data_bin / "valid.en-de.de.txt").read_text(encoding="utf-8") == (raw / "valid.de").read_text(encoding="utf-8")


def test_logged_bleu_is_what_translate_and_score_give(tmp_path, corpus):
    raw, data_bin = corpus
    run = tmp_path / "run"
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "100", "--validate-interval-updates",
                  "100", "--validate-interval", "0", "--eval-bleu", *EVAL_SEARCH, "--eval-bleu-chrf"])
    assert result.exit_code == 0, result.output
    logged = read_log(run)[-1]
    assert logged["update"] == load_checkpoint(run / "checkpoint_last.pt")["num_updates"] == 100
    assert logged["bleu"] > 0 and logged["eval_bleu_sentences"] == 24
    hyp = tmp_path / "hyp.de"
    result = nmt(["translate", "--path", run / "checkpoint_last.pt", "--input", raw / "valid.en", "--output", hyp,
                  *SEARCH])
    assert result.exit_code == 0, result.output
    scored = nmt(["score", "--ref", raw / "valid.de", "--hyp", hyp, "--metrics", "bleu,chrf", "--width", "2"]).output
    printed = dict(re.findall(r"^\s*(\S+) = ([\d.]+)", scored, flags=re.M))
    assert printed == {f"BLEU|{logged['bleu_signature']}": f"{logged['bleu']:.2f}",
                       f"chrF2|{logged['chrf_signature']}": f"{logged['chrf']:.2f}"}, (scored, logged)

    # Line by line (stronger than a score): the hypotheses of --eval-bleu are translate's output.
    state = load_checkpoint(run / "checkpoint_last.pt")
    model = model_from_checkpoint(state, run / "checkpoint_last.pt").eval()
    data = load_data_bin(data_bin)
    cfg = TrainConfig(data=str(data_bin), save_dir=str(run), eval_bleu=True, eval_bleu_beam=2)
    valid_bleu = ValidBleu(cfg, data, data.split("valid"), model.cfg.max_source_positions, model.cfg.max_target_positions)
    ours = valid_bleu.translate(model, torch.device("cpu"), nullcontext)
    assert ours == hyp.read_text(encoding="utf-8").splitlines()
    assert ours[3] == ""  # the blank source line


def scripted_bleu(monkeypatch, values: list[float]) -> list[float]:
    """Make each --eval-bleu score the next of `values` (the translation itself still runs)."""
    calls = []
    real = ValidBleu.score

    def score(self, *args, **kwargs):
        actual = real(self, *args, **kwargs)
        calls.append(actual)
        return BleuScores(values[len(calls) - 1], actual.bleu_signature, None, None, actual.sentences, actual.seconds)

    monkeypatch.setattr(ValidBleu, "score", score)
    return values


def test_best_by_bleu_picks_the_highest_bleu_where_loss_would_pick_another(tmp_path, corpus, monkeypatch):
    _, data_bin = corpus
    bleus = scripted_bleu(monkeypatch, [10.0, 30.0, 20.0, 25.0])
    run = tmp_path / "run"
    args = [*TINY, "--max-update", "40", "--validate-interval-updates", "10", "--validate-interval", "0"]
    result = nmt(["train", data_bin, "--save-dir", run, *args, "--eval-bleu", *EVAL_SEARCH,
                  "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric", "--keep-best-checkpoints", "2"])
    assert result.exit_code == 0, result.output
    valid = read_log(run)
    assert [r["bleu"] for r in valid] == bleus
    losses = [r["loss"] for r in valid]
    assert losses.index(min(losses)) != bleus.index(max(bleus))  # the two metrics disagree
    assert load_checkpoint(run / "checkpoint_best.pt")["num_updates"] == valid[1]["update"] == 20
    assert [r["best"] for r in valid] == [10.0, 30.0, 30.0, 30.0]
    kept = sorted(p.name for p in run.glob("checkpoint.best_*.pt"))
    assert kept == ["checkpoint.best_bleu_25.00.pt", "checkpoint.best_bleu_30.00.pt"]
    assert load_checkpoint(run / "checkpoint.best_bleu_25.00.pt")["num_updates"] == 40
    assert model_equal(load_checkpoint(run / "checkpoint.best_bleu_30.00.pt")["model"],
                       load_checkpoint(run / "checkpoint_best.pt")["model"])

    # The same run selecting by loss keeps the lowest-loss validation instead.
    by_loss = tmp_path / "by_loss"
    assert nmt(["train", data_bin, "--save-dir", by_loss, *args, "--keep-best-checkpoints", "1"]).exit_code == 0
    loss_valid = read_log(by_loss)
    assert [r["loss"] for r in loss_valid] == losses  # the same training
    lowest = loss_valid[losses.index(min(losses))]
    assert load_checkpoint(by_loss / "checkpoint_best.pt")["num_updates"] == lowest["update"]
    assert [p.name for p in by_loss.glob("checkpoint.best_*.pt")] == [scored_best_checkpoint("loss", lowest["loss"])]


def test_patience_follows_a_maximized_metric(tmp_path, corpus, monkeypatch):
    _, data_bin = corpus
    scripted_bleu(monkeypatch, [10.0, 30.0, 20.0, 25.0, 40.0])
    run = tmp_path / "run"
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "50", "--validate-interval-updates", "10",
                  "--validate-interval", "0", "--eval-bleu", *EVAL_SEARCH, "--best-checkpoint-metric", "bleu",
                  "--patience", "2"])
    assert result.exit_code == 0, result.output
    assert [r["bleu"] for r in read_log(run)] == [10.0, 30.0, 20.0, 25.0]  # two without improvement, then stop
    assert "no improvement in 2 validations" in result.output


def test_keep_best_keeps_exactly_the_n_best():
    """Against a naive top-N over every validation so far (ties: the earlier stays ahead)."""
    rng = random.Random(7)
    for metric in ("bleu", "loss"):
        for count in (1, 2, 3, 5):
            kept: list[ScoredCheckpoint] = []
            seen: list[tuple[float, int]] = []
            on_disk: set[str] = set()
            for step in range(40):
                value = round(rng.uniform(0, 50), rng.choice([1, 2, 4]))
                change = keep_best(kept, value, metric, count)
                if change.write is not None:
                    on_disk.add(change.write)
                on_disk -= set(change.remove)
                kept = change.kept
                seen.append((value, step))
                sign = -1 if metric == "bleu" else 1
                naive: list[float] = []
                for v, _ in sorted(seen, key=lambda vs: (sign * vs[0], vs[1])):
                    if v not in naive and len(naive) < count:
                        naive.append(v)
                assert [e.value for e in kept] == naive, (metric, count, step)
                assert on_disk == {e.name for e in kept} and len(on_disk) == len(kept)
                for entry in kept:  # fairseq's two decimals, or more where those clash
                    score = SCORED_BEST_NAME.fullmatch(entry.name).group(2)
                    assert len(score.split(".")[1]) >= 2 and float(score) == round(entry.value, len(score.split(".")[1]))


def test_two_best_values_that_round_alike_are_both_kept():
    """fairseq's names (two decimals) made 0.114 overwrite 0.112's file, keeping 0.009 instead."""
    kept: list[ScoredCheckpoint] = []
    for value in (0.009, 0.112, 0.114):
        kept = keep_best(kept, value, "bleu", 2).kept
    assert [(e.name, e.value) for e in kept] == [("checkpoint.best_bleu_0.114.pt", 0.114),
                                                 ("checkpoint.best_bleu_0.11.pt", 0.112)]


def test_fairseq_eval_bleu_flags_train(tmp_path, corpus):
    """fairseq's IWSLT14 spelling of the flags, as written there (with the BPE removal of this
    data-bin's sentencepiece pieces)."""
    _, data_bin = corpus
    run = tmp_path / "run"
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "10", "--eval-bleu",
                  "--eval-bleu-args", '{"beam": 2, "max_len_a": 1.2, "max_len_b": 10}', "--eval-bleu-detok", "moses",
                  "--eval-bleu-remove-bpe", "sentencepiece", "--eval-bleu-detok-args", '{"target_lang": "de"}',
                  "--eval-bleu-print-samples", "--best-checkpoint-metric", "bleu",
                  "--maximize-best-checkpoint-metric", "--eval-bleu-subset-lines", "5"])
    assert result.exit_code == 0, result.output
    assert read_log(run)[-1]["eval_bleu_sentences"] == 5
    assert "eval-bleu example hypothesis:" in result.output


def fairseq_post_process(line: str, symbol: str) -> str:
    """fairseq's `post_process` (data/data_utils.py) for the sentencepiece and subword-nmt symbols."""
    if symbol == "sentencepiece":
        return line.replace(" ", "").replace("\u2581", " ").strip()
    return (line + " ").replace("@@ ", "").rstrip()


def test_the_segmentation_of_each_kind_of_data_bin_is_named_as_fairseq_names_it():
    assert target_segmentation({"bpe": {"type": "sentencepiece", "model": "bpe.model"}}) == "sentencepiece"
    assert target_segmentation({"bpe": {"type": "subword_nmt", "codes": "bpe.codes"}}) == "subword_nmt"
    assert target_segmentation({"bpe": None, "segmented_input": "@@ "}) == "subword_nmt"
    assert target_segmentation({"bpe": None, "segmented_input": "\u2581"}) == "sentencepiece"
    assert target_segmentation({"bpe": None}) == "none"


def test_tokenized_bleu_scores_the_tokenized_text_as_fairseq(tmp_path, corpus):
    """fairseq's --eval-tokenized-bleu, done by hand: the hypotheses' pieces with their BPE removed
    and the references Moses-tokenized as the data-bin's target side (which are the binarized
    references' pieces with their BPE removed, where those hold no <unk>), scored by sacreBLEU
    with tokenize 'none'."""
    import sacrebleu
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    from nmt_cli.data.dictionary import Dictionary
    from nmt_cli.data.indexed import IndexedDataset

    raw, data_bin = corpus
    run = tmp_path / "run"
    result = nmt(["train", data_bin, "--save-dir", run, *TINY, "--max-update", "100", "--validate-interval-updates",
                  "100", "--validate-interval", "0", "--eval-bleu", *EVAL_SEARCH, "--eval-tokenized-bleu",
                  "--eval-bleu-remove-bpe", "sentencepiece", "--eval-bleu-detok-args",
                  '{"source_lang": "en", "target_lang": "de"}'])
    assert result.exit_code == 0, result.output
    logged = read_log(run)[-1]
    assert "tok:none" in logged["bleu_signature"]

    tokenizer = json.loads((data_bin / "meta.json").read_text())["tokenizer"]
    assert tokenizer == {"name": "moses", "normalize_punctuation": True, "aggressive_dash_splits": False,
                         "escape": False}
    normalizer, moses = MosesPunctNormalizer(lang="de"), MosesTokenizer(lang="de")
    refs = [moses.tokenize(normalizer.normalize(line.rstrip("\n")), escape=False, return_str=True)
            for line in (raw / "valid.de").read_text(encoding="utf-8").splitlines()]
    assert refs[0].endswith(" .")  # tokenized, unlike the raw reference
    dictionary = Dictionary.load(data_bin / "dict.de.txt")
    targets = IndexedDataset(data_bin / "valid.en-de.de")
    binarized = [" ".join(dictionary[i] for i in targets[n].tolist()[:-1]) for n in range(len(targets))]
    for ref, pieces in zip(refs, binarized):
        if "<unk>" not in pieces:
            assert fairseq_post_process(pieces, "sentencepiece") == ref
    pieces = nmt(["translate", "--path", run / "checkpoint_last.pt", "--input", raw / "valid.en", "--output-format",
                  "bpe", *SEARCH]).stdout.splitlines()
    hyps = [fairseq_post_process(line, "sentencepiece") for line in pieces]
    expected = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score
    assert expected > 0 and logged["bleu"] == pytest.approx(expected, abs=1e-9)
    # Line by line: what was scored is that tokenized text (the score alone cannot tell here,
    # where 13a would split the words as Moses did).
    model = model_from_checkpoint(load_checkpoint(run / "checkpoint_last.pt")).eval()
    data = load_data_bin(data_bin)
    cfg = TrainConfig(data=str(data_bin), save_dir=str(run), eval_bleu=True, eval_bleu_beam=2, eval_tokenized_bleu=True)
    valid_bleu = ValidBleu(cfg, data, data.split("valid"), model.cfg.max_source_positions, model.cfg.max_target_positions)
    assert valid_bleu.references == refs
    assert valid_bleu.translate(model, torch.device("cpu"), nullcontext) == hyps


@pytest.mark.parametrize("flags, fragment", [
    (["--eval-bleu-detok", "space"], "was tokenized with moses"),
    (["--eval-bleu-remove-bpe"], "--eval-bleu-remove-bpe alone ('@@ '): the target side"),
    (["--eval-bleu-remove-bpe", "none"], "give --eval-bleu-remove-bpe sentencepiece or drop the flag"),
    (["--eval-bleu-remove-bpe", "wordpiece"], "--eval-bleu-remove-bpe must be one of"),
    (["--eval-bleu-detok-args", '{"moses_no_escape": true}'], "moses_no_escape not supported"),
    (["--eval-bleu-detok-args", '{"target_lang": "fr"}'], "target_lang 'fr' is not the target language"),
    (["--eval-bleu-detok-args", "target_lang=de"], "is not JSON"),
    (["--eval-bleu-detok", "sacremoses"], "--eval-bleu-detok sacremoses is not supported"),
    (["--eval-bleu-args", '{"sampling": true}'], "sampling not supported"),
    (["--eval-bleu-args", "{beam: 5}"], "is not JSON"),
    (["--eval-bleu-beam", "3", "--eval-bleu-args", '{"beam": 4}'], "give one of them"),
    (["--eval-bleu-beam", "5", "--eval-bleu-args", '{"beam": 4}'], "--eval-bleu-beam is 5"),  # its default, given
    (["--best-checkpoint-metric", "loss", "--maximize-best-checkpoint-metric"], "contradicts"),
])
def test_bad_eval_bleu_flags_are_one_error_line(tmp_path, corpus, flags, fragment):
    _, data_bin = corpus
    result = nmt(["train", data_bin, "--save-dir", tmp_path / "run", *TINY, "--max-update", "1", "--eval-bleu", *flags])
    assert_one_error(result.exit_code, result.output, fragment)


def test_eval_bleu_without_references_says_so(tmp_path, corpus):
    _, data_bin = corpus
    old = tmp_path / "old-bin"
    shutil.copytree(data_bin, old)
    meta = json.loads((old / "meta.json").read_text())
    del meta["references"]
    (old / "meta.json").write_text(json.dumps(meta))
    result = nmt(["train", old, "--save-dir", tmp_path / "run", *TINY, "--max-update", "1", "--eval-bleu"])
    assert_one_error(result.exit_code, result.output, "does not keep", "nmt preprocess")
    result = nmt(["train", old, "--save-dir", tmp_path / "run2", *TINY, "--max-update", "1",
                  "--best-checkpoint-metric", "bleu"])
    assert_one_error(result.exit_code, result.output, "needs --eval-bleu")


def comparable_log(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("wall", "tokens_per_s", "eval_bleu_seconds")} for r in records]


def test_killed_and_resumed_with_eval_bleu_ends_like_an_uninterrupted_run(tmp_path, corpus):
    _, data_bin = corpus
    # chrF (it varies where a tiny model's BLEU stays flat) selects and keeps the best two.
    args = [*TINY, "--max-update", "24", "--save-interval-updates", "2", "--validate-interval-updates", "3",
            "--dropout", "0.1", "--eval-bleu", *EVAL_SEARCH, "--eval-bleu-max-len-b", "20",
            "--best-checkpoint-metric", "chrf", "--keep-best-checkpoints", "2", "--patience", "5"]
    server = ForkServer()
    try:
        straight, killed = tmp_path / "straight", tmp_path / "killed"
        full = server.run(["train", data_bin, "--save-dir", straight, *args], tmp_path / "straight.log")
        assert full.status == 0, (tmp_path / "straight.log").read_text()[-3000:]
        rng = random.Random(11)
        kills = 0
        for attempt in range(12):
            result = server.run(["train", data_bin, "--save-dir", killed, *args], tmp_path / f"a{attempt}.log",
                                kill_after=rng.uniform(0.3, max(0.6, full.seconds / 3)))
            if not result.killed:
                assert result.status == 0, (tmp_path / f"a{attempt}.log").read_text()[-3000:]
                break
            kills += 1
        else:
            assert server.run(["train", data_bin, "--save-dir", killed, *args], tmp_path / "final.log").status == 0
    finally:
        server.close()
    assert kills >= 2
    assert comparable_log(killed) == comparable_log(straight)
    names = sorted(p.name for p in straight.iterdir())
    assert sorted(p.name for p in killed.iterdir()) == names
    assert len([n for n in names if n.startswith("checkpoint.best_chrf_")]) == 2
    for name in [n for n in names if n.endswith(".pt")]:
        assert model_equal(load_checkpoint(killed / name)["model"], load_checkpoint(straight / name)["model"]), name
    last = load_checkpoint(killed / "checkpoint_last.pt")
    assert last["best_checkpoints"] == load_checkpoint(straight / "checkpoint_last.pt")["best_checkpoints"]
