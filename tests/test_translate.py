"""`nmt translate` end to end, and search with the real model.

A module fixture builds a tiny run directory: a joint sentencepiece model and
dictionary learned from generated text (Latin and non-Latin words), a meta.json
with Moses tokenization, and a `transformer_tiny` checkpoint trained for a few
dozen Adam steps on a copy task.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from nmt_cli.checkpoints.format import save_checkpoint
from nmt_cli.cli import main
from nmt_cli.config import DecodeConfig
from nmt_cli.data.dictionary import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Dictionary
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.lines import InputLine, chunks, read_lines
from nmt_cli.decode.search import generate
from nmt_cli.decode.translator import make_batches, pad_batch
from nmt_cli.models.fast import packed
from nmt_cli.models.registry import ARCHITECTURES, build_model
from nmt_cli.text.bpe import learn_bpe
from nmt_cli.text.pipeline import TextPipeline
from nmt_cli.text.reader import ArrivingInput
from coprocess import answers_line_by_line
from model_utils import torch_threads

WORDS = ["the", "dog", "runs", "a", "red", "ball", "over", "green", "grass", "Straße", "schön",
         "привет", "мир", "世界", "日本語", "καλημέρα"]
MAX_SOURCE_POSITIONS = 24


def generated_sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) + rng.choice([".", "!", ""]) for _ in range(count)]


def train_copy_task(model: torch.nn.Module, batches: list[list[list[int]]], steps: int) -> None:
    """A few Adam steps of teacher-forced copying, enough to move off random weights."""
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        rows = batches[step % len(batches)]
        src = pad_batch(rows, torch.device("cpu"))
        prev = pad_batch([[EOS_ID] + r[:-1] for r in rows], torch.device("cpu"))
        logits = model(src, prev)
        loss = F.cross_entropy(logits.transpose(1, 2), src, ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, one_thread) -> Path:
    root = tmp_path_factory.mktemp("translate")
    sentences = generated_sentences(400, seed=1)
    pipeline_dir = root / "run"
    pipeline_dir.mkdir()
    meta = {
        "format_version": 1, "source_lang": "en", "target_lang": "de", "joined_dictionary": True,
        "tokenizer": {"name": "moses", "normalize_punctuation": True},
        "bpe": {"type": "sentencepiece", "model": "bpe.model"}, "counts": {},
    }
    (pipeline_dir / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    from nmt_cli.text.tokenizer import Tokenizer, TokenizerSettings

    tokenizer = Tokenizer(TokenizerSettings(name="moses", lang="en"))
    learn_bpe((tokenizer.tokenize(s) for s in sentences), pipeline_dir / "bpe.model", vocab_size=120, sample_size=0, seed=1)
    pipeline = TextPipeline.from_data_bin(pipeline_dir, "en")
    encoded = [pipeline.encode(s) for s in sentences]
    dictionary = Dictionary.build(Counter(p for pieces in encoded for p in pieces))
    for lang in ("en", "de"):
        dictionary.save(pipeline_dir / f"dict.{lang}.txt")
    torch.manual_seed(0)
    cfg = ARCHITECTURES["transformer_tiny"]
    cfg = type(cfg)(**{**cfg.to_dict(), "dropout": 0.0, "max_source_positions": MAX_SOURCE_POSITIONS,
                       "max_target_positions": 64, "share_all_embeddings": True})
    model = build_model(cfg, len(dictionary), len(dictionary))
    ids = [dictionary.encode(pieces) for pieces in encoded]
    train_copy_task(model, [ids[i : i + 32] for i in range(0, len(ids), 32)], steps=40)
    state = {
        "format_version": 1, "model_config": cfg.to_dict(), "model": model.state_dict(),
        "source_lang": "en", "target_lang": "de", "src_dict": dictionary.symbols, "tgt_dict": dictionary.symbols,
        "num_updates": 40, "epoch": 1, "best_metric": None,
    }
    save_checkpoint(state, pipeline_dir / "checkpoint_best.pt")
    return pipeline_dir


def nmt(*args: str, input: bytes | str = b""):
    runner = CliRunner()
    return runner.invoke(main, ["translate", *args], input=input, catch_exceptions=False)


def load(run_dir: Path):
    from nmt_cli.checkpoints.format import load_checkpoint, model_from_checkpoint

    return model_from_checkpoint(load_checkpoint(run_dir / "checkpoint_best.pt")).eval()


FAST = ("--max-len-a", "1", "--max-len-b", "5", "--device", "cpu", "--threads", "1", "--quiet")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread (several only contend on a shared CPU)."""
    with torch_threads(1):
        yield


# --- batching ---------------------------------------------------------------------------


def test_make_batches_respects_budgets_and_covers_everything():
    rng = random.Random(0)
    lengths = [rng.randint(1, 40) for _ in range(300)]
    for max_tokens, batch_size in ((100, None), (None, 7), (64, 5), (10, None)):
        batches = make_batches(lengths, max_tokens, batch_size)
        assert sorted(i for b in batches for i in b) == list(range(300))
        for b in batches:
            longest = max(lengths[i] for i in b)
            assert batch_size is None or len(b) <= batch_size
            assert max_tokens is None or len(b) * longest <= max_tokens or len(b) == 1
        flat = [lengths[i] for b in batches for i in b]
        assert flat == sorted(flat, reverse=True)


# --- the real model under search ------------------------------------------------------------


class Uncached:
    """The model recomputing every step from the full prefix (a fresh cache each call)."""

    sentence_drop_fraction = 0.0

    def __init__(self, model) -> None:
        self.model = model

    def encode(self, src_tokens):
        return self.model.encode(src_tokens)

    def new_cache(self):
        return None

    def decode_step(self, prev_tokens, encoder_out, cache):
        return self.model.decode_step(prev_tokens, encoder_out, self.model.new_cache())

    def reorder_cache(self, cache, index, sentence_index=None):
        pass

    def reorder_encoder_out(self, encoder_out, index):
        return self.model.reorder_encoder_out(encoder_out, index)


def source_batch(run_dir: Path, count: int = 6):
    pipeline = TextPipeline.from_data_bin(run_dir, "en")
    dictionary = Dictionary.load(run_dir / "dict.en.txt")
    rows = [dictionary.encode(pipeline.encode(s)) for s in generated_sentences(count, seed=5)]
    return pad_batch(rows, torch.device("cpu"))


def test_cached_equals_uncached_and_batched_equals_single(run_dir):
    model = load(run_dir)
    src = source_batch(run_dir)
    cfg = DecodeConfig(beam=4, nbest=4, max_len_a=1, max_len_b=5)
    cached = generate(model, src, cfg, 64)
    uncached = generate(Uncached(model), src, cfg, 64)
    for i, (x, y) in enumerate(zip(cached, uncached)):
        assert [h.tokens for h in x] == [h.tokens for h in y]
        assert [h.score for h in x] == pytest.approx([h.score for h in y], abs=1e-4)
        (alone,) = generate(model, src[i : i + 1, : int(src[i].ne(PAD_ID).sum())], cfg, 64)
        assert [h.tokens for h in alone] == [h.tokens for h in x]


def test_beam_one_equals_teacher_forced_greedy(run_dir):
    model = load(run_dir)
    src = source_batch(run_dir, count=4)
    got = generate(model, src, DecodeConfig(beam=1, max_len_a=1, max_len_b=5), 64)
    for i in range(src.size(0)):
        row = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
        prefix, max_len = [EOS_ID], row.size(1) + 5
        while True:
            with torch.no_grad():
                lprobs = torch.log_softmax(model(row, torch.tensor([prefix]))[0, -1].float(), dim=-1)
            lprobs[PAD_ID] = -float("inf")
            if len(prefix) - 1 < 1:
                lprobs[EOS_ID] = -float("inf")
            token = EOS_ID if len(prefix) - 1 >= max_len else int(lprobs.argmax())
            prefix.append(token)
            if token == EOS_ID:
                break
        assert got[i][0].tokens == prefix[1:]


def test_ensemble_of_the_model_with_itself(run_dir):
    model = load(run_dir)
    src = source_batch(run_dir, count=4)
    cfg = DecodeConfig(beam=3, nbest=3, max_len_a=1, max_len_b=5)
    for x, y in zip(generate(model, src, cfg, 64), generate(Ensemble([model, model]), src, cfg, 64)):
        assert [h.tokens for h in x] == [h.tokens for h in y]
        assert [h.score for h in x] == pytest.approx([h.score for h in y], abs=1e-5)


# --- the command line -------------------------------------------------------------------


def test_stdin_to_stdout_keeps_one_line_per_input_line(run_dir):
    long_line = " ".join(["the dog runs over green grass"] * 8)
    lines = ["the red ball .", "", "   \t ", "привет мир 世界", long_line, "schön Straße", ""]
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    out = result.stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    assert out[1] == "" and out[2] == "" and out[6] == ""
    assert all(out[i] for i in (0, 3, 4, 5))  # a trained-a-little model always says something here
    assert "<stdin>:5" in result.stderr and "truncated" in result.stderr
    assert "<stdin>:1:" not in result.stderr


def test_the_collector_freeze_ends_with_the_command(run_dir):
    """translate freezes what is alive while lines stream (see decode/streaming.py), and
    unfreezes it when it ends, even on an error: a process that goes on (the Python API's,
    a test run) keeps collecting its garbage."""
    assert gc.get_freeze_count() == 0
    assert nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, input="the red ball .\n").exit_code == 0
    assert gc.get_freeze_count() == 0
    assert nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, input=b"ok\n\xff\n").exit_code == 1
    assert gc.get_freeze_count() == 0


def test_output_order_does_not_depend_on_batching(run_dir):
    lines = generated_sentences(40, seed=9)
    text = "\n".join(lines) + "\n"
    ckpt = str(run_dir / "checkpoint_best.pt")
    together = nmt("--path", ckpt, *FAST, "--output-format", "bpe", "--max-tokens", "60", input=text)
    one_by_one = nmt("--path", ckpt, *FAST, "--output-format", "bpe", "--buffer-size", "1", input=text)
    assert together.exit_code == 0 and one_by_one.exit_code == 0
    assert together.stdout == one_by_one.stdout
    assert len(together.stdout.splitlines()) == 40


def test_a_long_input_gives_freed_memory_back_every_so_many_lines(run_dir, monkeypatch):
    """Batches of other shapes fragment the heap that keep_freed_memory keeps: translate trims
    it every RELEASE_MEMORY_EVERY lines, so its memory does not grow with the input's length."""
    from nmt_cli.decode import streaming

    written, lines_at_release = [], []
    monkeypatch.setattr(streaming, "RELEASE_MEMORY_EVERY", 3)
    monkeypatch.setattr(streaming, "write_output", lambda sink, data, path: written.append(data))
    monkeypatch.setattr(streaming, "release_freed_memory", lambda: lines_at_release.append(b"".join(written).count(b"\n")))
    text = "\n".join(generated_sentences(10, seed=3)) + "\n"
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--buffer-size", "2", input=text)
    assert result.exit_code == 0, result.stderr
    assert lines_at_release == [4, 8]  # after the first chunks with 3 lines or more since the last release


def test_translate_bounds_onednns_kernel_caches_unless_the_environment_does(run_dir, monkeypatch):
    """oneDNN caches a kernel per product shape, 1024 of each cache's by default (some 400 MB
    once decoding's many batch shapes fill them): translate caps them before the model loads,
    and leaves a value the user set."""
    from nmt_cli.host_memory import ONEDNN_CACHE_ENTRIES

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    assert nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, input="the red ball .\n").exit_code == 0
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ONEDNN_CACHE_ENTRIES)
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"


def test_a_huge_line_is_cut_before_tokenizing_and_translates_as_its_start(run_dir, monkeypatch):
    """The model reads MAX_SOURCE_POSITIONS tokens of a line at most: of a 300,000-character
    line only CHARS_PER_POSITION characters per position reach the tokenizer (it costs many
    times a line's size), with a warning, and the output is that of the line's start."""
    from nmt_cli.decode.translator import CHARS_PER_POSITION
    from nmt_cli.text.pipeline import TextPipeline

    received = []
    encode = TextPipeline.encode
    monkeypatch.setattr(TextPipeline, "encode", lambda self, line: received.append(len(line)) or encode(self, line))
    start = "the dog runs over green grass " * 10  # already more tokens than the model reads
    ckpt = str(run_dir / "checkpoint_best.pt")
    huge = nmt("--path", ckpt, *FAST, input="the red ball .\n" + start * 1000 + "\nschön\n")
    assert huge.exit_code == 0, huge.stderr
    assert max(received) <= CHARS_PER_POSITION * MAX_SOURCE_POSITIONS
    [warning] = [line for line in huge.stderr.splitlines() if line.startswith("warning: <stdin>:2:")]  # one
    assert re.fullmatch(r"warning: <stdin>:2: source has \d+ tokens \(with </s>\) in its first \d+ of 300000 "
                        r"characters; truncated to the model's maximum of \d+", warning), warning
    short = nmt("--path", ckpt, *FAST, input="the red ball .\n" + start + "\nschön\n")
    assert huge.stdout == short.stdout and len(huge.stdout.splitlines()) == 3
    # Pieces of 100 characters: the cut leaves fewer than the model's positions, so only the cut is said.
    pieces = " ".join(["x" * 100] * 30)
    long_pieces = nmt("--path", ckpt, *FAST, "--input-format", "bpe", input=pieces + "\n")
    assert long_pieces.exit_code == 0 and len(long_pieces.stdout.splitlines()) == 1
    cut = len(" ".join(["x" * 100] * (CHARS_PER_POSITION * MAX_SOURCE_POSITIONS // 101)))
    assert long_pieces.stderr.splitlines() == [
        f"warning: <stdin>:1: source line has 3029 characters; only its first {cut} are read "
        f"({CHARS_PER_POSITION} per position of the model's {MAX_SOURCE_POSITIONS})"], long_pieces.stderr


def test_a_writer_that_waits_for_each_translation_gets_it(run_dir):
    """A program that drives `nmt translate` through pipes writes a line and waits for its
    translation (as wrappers of fairseq-interactive do). With the default --buffer-size
    of 2,000 lines, translate must not wait for more input first: a chunk ends when the
    pipe holds no further line."""
    lines = generated_sentences(3, seed=11)
    ckpt = str(run_dir / "checkpoint_best.pt")
    expected = nmt("--path", ckpt, *FAST, input="".join(line + "\n" for line in lines)).stdout.splitlines()
    assert answers_line_by_line(["translate", "--path", ckpt, *FAST], lines) == expected


def test_chunks_end_where_no_further_line_has_arrived():
    """ArrivingInput over a real pipe: lines read ahead and bytes in the pipe count as
    ready, a writer that has sent nothing more does not; the lines are those of a file
    with the same bytes (line ends, a first-line byte order mark, a last line without \\n)."""
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb", buffering=0) as reader, os.fdopen(write_end, "wb", buffering=0) as writer:
        arriving = ArrivingInput(reader)
        writer.write(b"\xef\xbb\xbfone\r\ntwo\nthr")
        assert arriving.readline() == b"\xef\xbb\xbfone\r\n"
        assert arriving.line_ready()  # "two" is read ahead
        assert arriving.readline() == b"two\n"
        assert not arriving.line_ready()  # only a part of the next line, and nothing in the pipe
        writer.write(b"ee\n")
        assert arriving.line_ready()
        assert arriving.readline() == b"three\n"
        writer.write(b"four\nlast")
        writer.close()
        assert [line.text for line in read_lines(arriving, "<pipe>", "strict")] == ["four", "last"]
        assert arriving.line_ready() and arriving.readline() == b""

    last = [0]

    def numbered():
        for number in range(1, 8):
            last[0] = number
            yield InputLine(number, str(number))

    def numbers(groups):
        return [[line.number for line in group] for group, _ in groups]

    # The writer pauses after lines 2 and 6.
    assert numbers(chunks(numbered(), 3, lambda: last[0] not in (2, 6))) == [[1, 2], [3, 4, 5], [6], [7]]
    assert numbers(chunks(numbered(), 3)) == [[1, 2, 3], [4, 5, 6], [7]]


def test_input_formats_agree_and_jsonl_carries_nbest(run_dir, tmp_path):
    lines = generated_sentences(5, seed=11)
    pipeline = TextPipeline.from_data_bin(run_dir, "en")
    dictionary = Dictionary.load(run_dir / "dict.en.txt")
    bpe_lines = [" ".join(pipeline.encode(s)) for s in lines]
    id_lines = [" ".join(str(i) for i in dictionary.encode(pipeline.encode(s), append_eos=False)) for s in lines]
    ckpt = str(run_dir / "checkpoint_best.pt")
    outputs = []
    for fmt, text in (("raw", lines), ("bpe", bpe_lines), ("ids", id_lines)):
        result = nmt("--path", ckpt, *FAST, "--input-format", fmt, "--output-format", "jsonl", "--nbest", "3",
                     "--beam", "3", "--lenpen", "0.6", input="\n".join(text) + "\n")
        assert result.exit_code == 0, result.stderr
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] == outputs[2]
    records = [json.loads(line) for line in outputs[0].splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5]
    for r in records:
        assert len(r["nbest"]) == 3 and r["nbest"][0]["hyp"] == r["hyp"]
        scores = [h["score"] for h in r["nbest"]]
        assert scores == sorted(scores, reverse=True)
        assert len(r["tokens"]) == len(r["ids"]) == len(r["positional_scores"]) and r["tokens"][-1] == "</s>"
        assert sum(r["positional_scores"]) / len(r["ids"]) ** 0.6 == pytest.approx(r["score"], abs=1e-4)
    text = nmt("--path", ckpt, *FAST, "--beam", "3", "--lenpen", "0.6", "-o", str(tmp_path / "out.txt"),
               input="\n".join(lines) + "\n")
    assert text.exit_code == 0 and text.stdout == ""
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == [r["hyp"] for r in records]


def test_special_symbols_in_a_source_line_are_unk(run_dir):
    # As their ids, the `</s>` would end the source in mid-line and the `<pad>` be masked out as padding.
    pipeline = TextPipeline.from_data_bin(run_dir, "en")
    dictionary = Dictionary.load(run_dir / "dict.en.txt")
    first, second = pipeline.encode("the dog runs"), pipeline.encode("a red ball")
    pieces = [*first, "</s>", *second, "<pad>", "<s>", "<unk>"]

    def ids_line(special_ids: dict[str, int]) -> str:
        return " ".join(str(special_ids[p] if p in special_ids else dictionary.index[p]) for p in pieces)

    as_unk = ids_line({"</s>": UNK_ID, "<pad>": UNK_ID, "<s>": UNK_ID})
    as_specials = ids_line({"</s>": EOS_ID, "<pad>": PAD_ID, "<s>": BOS_ID})
    ckpt = str(run_dir / "checkpoint_best.pt")
    outputs = {}
    for name, fmt, line in (("bpe", "bpe", " ".join(pieces)), ("unk", "ids", as_unk)):
        result = nmt("--path", ckpt, *FAST, "--input-format", fmt, "--output-format", "jsonl", input=line + "\n")
        assert result.exit_code == 0, result.stderr
        outputs[name] = json.loads(result.stdout)
    assert outputs["bpe"] == outputs["unk"]
    # The special ids themselves, which an ids source cannot mean as text, are refused.
    result = nmt("--path", ckpt, *FAST, "--input-format", "ids", input=as_specials + "\n")
    assert result.exit_code == 1 and result.stderr == "error: the source may not hold <pad> at <stdin>:1\n"


def test_ensemble_path_with_itself_equals_single_model(run_dir):
    ckpt = str(run_dir / "checkpoint_best.pt")
    text = "\n".join(generated_sentences(6, seed=12)) + "\n"
    single = nmt("--path", ckpt, *FAST, "--output-format", "bpe", input=text)
    double = nmt("--path", f"{ckpt}:{ckpt}", *FAST, "--output-format", "bpe", input=text)
    assert single.exit_code == 0 and single.stdout == double.stdout


def test_int8_keeps_every_line_in_order_whatever_the_batching_and_mostly_agrees_with_fp32(run_dir):
    lines = generated_sentences(40, seed=9)
    text = "\n".join(lines) + "\n"
    ckpt = str(run_dir / "checkpoint_best.pt")
    int8 = (*FAST, "--output-format", "bpe", "--precision", "int8")
    fp32 = nmt("--path", ckpt, *FAST, "--output-format", "bpe", input=text)
    together = nmt("--path", ckpt, *int8, "--max-tokens", "60", input=text)
    one_by_one = nmt("--path", ckpt, *int8, "--buffer-size", "1", input=text)
    ensemble = nmt("--path", f"{ckpt}:{ckpt}", *int8, input=text)
    for result in (fp32, together, one_by_one, ensemble):
        assert result.exit_code == 0, result.stderr
    # Each row is quantized on its own and integer sums are exact: batching changes nothing.
    assert together.stdout == one_by_one.stdout == ensemble.stdout
    assert len(together.stdout.splitlines()) == 40
    same = sum(a == b for a, b in zip(together.stdout.splitlines(), fp32.stdout.splitlines()))
    assert same >= 24, f"{same} of 40 lines as in fp32"


def test_int8_errors_are_one_line(run_dir, monkeypatch):
    ckpt = str(run_dir / "checkpoint_best.pt")
    on_gpu = nmt("--path", ckpt, "--precision", "int8", "--device", "cuda", input="the dog\n")
    assert on_gpu.exit_code == 1
    assert on_gpu.stderr.strip() == "error: --precision int8 needs --device cpu (use bf16 or fp16 on a GPU)"
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    no_kernels = nmt("--path", ckpt, *FAST, "--precision", "int8", input="the dog\n")
    assert no_kernels.exit_code == 1
    assert no_kernels.stderr.strip() == "error: --precision int8: this torch build has no oneDNN (use --precision fp32)"


@pytest.mark.skipif(packed.packed_unavailable_reason(torch.bfloat16) is not None, reason="no oneDNN bf16 kernels here")
def test_bf16_on_the_cpu_packs_the_linear_layers_and_translates_as_autocast(run_dir, monkeypatch):
    text = "\n".join(generated_sentences(40, seed=9)) + "\n"
    ckpt = str(run_dir / "checkpoint_best.pt")
    bf16 = (*FAST, "--output-format", "bpe", "--precision", "bf16")
    packed_run = nmt("--path", ckpt, *bf16, input=text)
    ensemble = nmt("--path", f"{ckpt}:{ckpt}", *bf16, "--buffer-size", "7", input=text)
    monkeypatch.setattr(packed, "packed_unavailable_reason", lambda dtype: "switched off by the test")
    autocast = nmt("--path", ckpt, *bf16, input=text)
    for result in (packed_run, ensemble, autocast):
        assert result.exit_code == 0, result.stderr
        assert len(result.stdout.splitlines()) == 40
    assert packed_run.stderr == "" and "switched off by the test" in autocast.stderr
    # The same arithmetic, summed in another order now and then (see tests/test_packed.py).
    same = sum(a == b for a, b in zip(packed_run.stdout.splitlines(), autocast.stdout.splitlines()))
    assert same >= 36, f"{same} of 40 lines as under autocast"


def test_bf16_on_a_cpu_without_its_kernels_warns_once_and_translates(run_dir, monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--precision", "bf16", input="the dog\nthe cat\n")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2
    assert result.stderr == ("warning: --precision bf16: this torch build has no oneDNN, so it runs under autocast "
                             "(on CPUs without bf16 instructions, slower than fp32)\n")


def test_invalid_utf8_is_an_error_with_the_line_number_and_earlier_lines_reach_stdout(run_dir, tmp_path):
    ckpt = str(run_dir / "checkpoint_best.pt")
    data = b"the dog runs\nthe red ball\nbad \xff\xfe byte\nthe grass\n"
    strict = nmt("--path", ckpt, *FAST, "--buffer-size", "2", input=data)
    assert strict.exit_code == 1
    assert strict.stderr.strip().splitlines()[-1].startswith("error: invalid UTF-8 at <stdin>:3")
    assert "Traceback" not in strict.stderr
    assert len(strict.stdout.splitlines()) == 2
    (tmp_path / "in.txt").write_bytes(data)
    to_file = nmt("--path", ckpt, *FAST, "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.txt"))
    assert to_file.exit_code == 1 and f"{tmp_path / 'in.txt'}:3" in to_file.stderr
    # A file output appears only whole: part of the translations would pass for all of them.
    assert not (tmp_path / "out.txt").exists() and not list(tmp_path.glob(".out.txt.*"))
    replaced = nmt("--path", ckpt, *FAST, "--errors", "replace", input=data)
    assert replaced.exit_code == 0 and len(replaced.stdout.splitlines()) == 4


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    result = nmt("--path", str(tmp_path / "nope.pt"), "--device", "cpu", input="hello\n")
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: checkpoint not found: {tmp_path / 'nope.pt'}"


def test_a_missing_input_is_reported_before_the_checkpoint_is_read(tmp_path):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    missing = tmp_path / "missing.en"
    result = nmt("--path", str(broken), "--device", "cpu", "-i", str(missing), "-o", str(tmp_path / "out.de"))
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1 and str(missing) in result.stderr
    assert str(broken) not in result.stderr
    assert not (tmp_path / "out.de").exists()


def test_dictionary_mismatch_with_data_bin_is_a_clear_error(run_dir, tmp_path):
    other = tmp_path / "other-bin"
    shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("*.pt"))
    symbols = Dictionary.load(run_dir / "dict.de.txt").symbols[4:]
    Dictionary(symbols[1:] + symbols[:1]).save(other / "dict.de.txt")
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), "--data-bin", str(other), *FAST, input="the dog\n")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: dictionary {other / 'dict.de.txt'} does not match checkpoint")
    assert "Traceback" not in result.stderr


def test_ensemble_with_other_dictionaries_is_a_clear_error(run_dir, tmp_path):
    state = torch.load(run_dir / "checkpoint_best.pt", weights_only=True)
    state["tgt_dict"] = state["tgt_dict"][:4] + list(reversed(state["tgt_dict"][4:]))
    save_checkpoint(state, tmp_path / "other.pt")
    ckpt = str(run_dir / "checkpoint_best.pt")
    result = nmt("--path", f"{ckpt}:{tmp_path / 'other.pt'}", *FAST, input="the dog\n")
    assert result.exit_code == 1 and f"the target dictionary of {tmp_path / 'other.pt'} does not match checkpoint {ckpt}" in result.stderr


def test_stdin_is_streamed_chunk_by_chunk(run_dir):
    """With --buffer-size 1 each translation is written before the next line arrives."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_cli", "translate", "--path", str(run_dir / "checkpoint_best.pt"), *FAST,
         "--buffer-size", "1", "--output-format", "bpe"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        answers = []
        for line in ("the dog runs", "", "мир"):
            proc.stdin.write((line + "\n").encode())
            proc.stdin.flush()
            answers.append(proc.stdout.readline())  # blocks until this line's translation is out
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    finally:
        proc.kill()
    assert answers[0].strip() and answers[1] == b"\n" and answers[2].strip()
    assert proc.stdout.read() == b""


def test_bad_ids_input_names_the_line_and_text_mode_prints_nbest_lines_per_input(run_dir):
    ckpt = str(run_dir / "checkpoint_best.pt")
    not_ints = nmt("--path", ckpt, *FAST, "--input-format", "ids", input="5 6\n5 x 6\n")
    assert not_ints.exit_code == 1 and "<stdin>:2" in not_ints.stderr and "not a list of integers" in not_ints.stderr
    too_big = nmt("--path", ckpt, *FAST, "--input-format", "ids", input="5 99999\n")
    assert too_big.exit_code == 1 and "id 99999 is outside the source dictionary" in too_big.stderr
    nbest = nmt("--path", ckpt, *FAST, "--beam", "4", "--nbest", "3", input="the dog\n\nthe ball\n")
    assert nbest.exit_code == 0 and len(nbest.stdout.splitlines()) == 3 * 3  # --nbest lines per input line
    assert nbest.stdout.splitlines()[3:6] == ["", "", ""]  # the blank input line


# --- worker processes (--workers) ---------------------------------------------------------


def test_workers_give_the_same_lines_in_the_same_order(run_dir):
    lines = generated_sentences(30, seed=11)
    lines[4:4] = ["", "   "]  # blank lines keep their place
    text = "\n".join(lines) + "\n"
    ckpt = str(run_dir / "checkpoint_best.pt")
    # Chunks of 7 lines: shares of 4 and 3, and a last chunk of 4.
    alone = nmt("--path", ckpt, *FAST, "--output-format", "bpe", "--buffer-size", "7", input=text)
    shared = nmt("--path", ckpt, *FAST, "--output-format", "bpe", "--buffer-size", "7", "--workers", "2", input=text)
    assert alone.exit_code == 0 and shared.exit_code == 0, shared.stderr
    assert shared.stdout == alone.stdout
    assert len(shared.stdout.split("\n")) - 1 == len(lines)


def test_an_error_in_a_workers_share_is_one_line_naming_the_line(run_dir):
    # Shares are dealt longest line first: the main process takes line 1, the worker line 2.
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--input-format", "ids", "--workers", "2",
                 input="5 6 7 8 9\n5 x\n")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["error: --input-format ids: not a list of integers at <stdin>:2"]


def test_a_bad_checkpoint_with_workers_is_one_error_line(tmp_path):
    (tmp_path / "broken.pt").write_bytes(b"not a checkpoint")
    result = nmt("--path", str(tmp_path / "broken.pt"), *FAST, "--workers", "2", input="the dog\n")
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "broken.pt" in result.stderr


def test_a_worker_gone_before_its_share_is_sent_is_one_error_line(run_dir, monkeypatch):
    """Killed between two chunks (the OOM killer, say), a worker's pipe is broken when its
    next share is sent: an error, not the quiet end of a `| head` whose reader went away."""
    from nmt_cli.decode.workers import ParallelTranslator

    use = ParallelTranslator.use

    def use_then_kill(self, local):
        use(self, local)
        for process, _ in self.workers:
            process.kill()
            process.join()
        return self

    monkeypatch.setattr(ParallelTranslator, "use", use_then_kill)
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--workers", "2", input="the dog\nthe ball\n")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == "error: a translation worker stopped unexpectedly (exit code -9)\n", result.stderr


def test_workers_the_machine_cannot_start_are_one_error_line(run_dir, monkeypatch):
    """No process slots left (fork's EAGAIN): one line that says so, not a traceback."""
    import multiprocessing.context

    def start(process):
        raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start)
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--workers", "2", input="the dog\n")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == (f"error: cannot start the --workers processes: {os.strerror(errno.EAGAIN)}; "
                             "--workers 1 works in this process alone\n"), result.stderr


@pytest.mark.parametrize("flags, message", [
    (("--workers", "0"), "--workers must be >= 1"),
    (("--workers", "2", "--device", "cuda"), "--workers needs --device cpu"),
])
def test_workers_values_that_cannot_work_are_one_error_line(run_dir, flags, message):
    args = [a for a in FAST if a not in ("--device", "cpu")] if "cuda" in flags else FAST
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *args, *flags, input="the dog\n")
    assert result.exit_code == 1 and message in result.stderr


# --- scores at the edges of float32 -------------------------------------------------------


@pytest.mark.parametrize("flags, message", [
    (("--temperature", "1e-40"), "--temperature must be >= 1e-30"),
    (("--lenpen", "1000"), "--lenpen must be between -10 and 10"),
    (("--unk-penalty", "-1e300"), "--unk-penalty must be >= -1e+30"),
    (("--buffer-size", "0"), "--buffer-size must be >= 1"),
    (("--beam", "100000"), "--beam 100000 is larger than the target vocabulary"),
])
def test_values_that_would_break_the_search_are_one_error_line(run_dir, flags, message):
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, *flags, input="the dog\n")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {message}") and result.stderr.count("\n") == 1
    assert result.stdout == ""


@pytest.mark.parametrize("temperature", ["1e-20", "0.01"])
def test_a_sharp_temperature_translates_every_line(run_dir, temperature):
    text = "\n".join(generated_sentences(12, seed=4)) + "\n"
    ckpt = str(run_dir / "checkpoint_best.pt")
    sharp = nmt("--path", ckpt, *FAST, "--output-format", "jsonl", "--temperature", temperature, input=text)
    assert sharp.exit_code == 0, sharp.stderr
    records = [json.loads(line) for line in sharp.stdout.splitlines()]
    assert len(records) == 12 and all(r["score"] is not None and r["tokens"] for r in records)
    # Sampling too, though `</s>` is banned before --min-len and often the likeliest token:
    # the allowed tokens' weights may all underflow to 0 at this temperature.
    sampled = nmt("--path", ckpt, *FAST, "--output-format", "jsonl", "--temperature", temperature, "--sampling",
                  "--min-len", "3", "--beam", "2", input=text)
    assert sampled.exit_code == 0, sampled.stderr
    records = [json.loads(line) for line in sampled.stdout.splitlines()]
    assert len(records) == 12 and all(r["score"] is not None and len(r["tokens"]) >= 4 for r in records)


def test_a_sharp_temperature_searches_as_greedy(run_dir):
    """At temperature 1e-20 every token but the best has log-prob -inf: beam search keeps
    the best token of each step, as greedy search at temperature 1."""
    text = "\n".join(generated_sentences(12, seed=5)) + "\n"
    ckpt = str(run_dir / "checkpoint_best.pt")
    greedy = nmt("--path", ckpt, *FAST, "--output-format", "bpe", "--beam", "1", input=text)
    sharp = nmt("--path", ckpt, *FAST, "--output-format", "bpe", "--beam", "1", "--temperature", "1e-20", input=text)
    assert greedy.exit_code == sharp.exit_code == 0
    assert sharp.stdout == greedy.stdout


def test_checkpoint_with_non_finite_weights_is_refused(run_dir, tmp_path, monkeypatch):
    state = torch.load(run_dir / "checkpoint_best.pt", weights_only=True)
    state["model"]["decoder.layers.0.fc2.weight"][0, 0] = float("nan")
    broken = tmp_path / "nan.pt"
    save_checkpoint(state, broken)
    result = nmt("--path", str(broken), "--data-bin", str(run_dir), *FAST, input="the dog\n")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == (f"error: {broken}: weight decoder.layers.0.fc2.weight holds NaN or infinite values "
                             "(a diverged run or a damaged file)\n")
    # Were such scores met while decoding (fp16 overflow, say), the line would stay, empty, with a warning.
    from nmt_cli.checkpoints import format as checkpoint

    monkeypatch.setattr(checkpoint, "check_finite_weights", lambda weights, source: None)
    result = nmt("--path", str(broken), "--data-bin", str(run_dir), *FAST, input="the dog\nthe cat\n")
    assert result.exit_code == 0 and result.stdout == "\n\n"
    assert result.stderr == "".join(f"warning: <stdin>:{n}: no hypothesis with a finite score; the output line is "
                                     "empty\n" for n in (1, 2))


def test_out_of_memory_is_one_error_line(run_dir, monkeypatch):
    from nmt_cli.decode import translator

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 49152000000 bytes.\nmore")

    monkeypatch.setattr(translator, "generate", out_of_memory)
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, input="the dog\n")
    assert result.exit_code == 1
    assert result.stderr == ("error: out of memory (DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                             "49152000000 bytes.); smaller batches (--max-tokens, --batch-size) or a smaller --beam "
                             "need less\n")


def test_a_line_whose_length_limit_is_below_min_len_is_translated_with_a_warning(run_dir):
    """The forced </s> at the longest output allowed wins over --min-len (as in fairseq's
    search, which asserts instead): each line it cuts is named, and a --min-len no output can
    reach is refused."""
    ckpt = str(run_dir / "checkpoint_best.pt")
    text = "the dog\n\n" + " ".join(["the dog runs"] * 5) + "\n"  # 3 and 16 source tokens with </s>
    result = nmt("--path", ckpt, *FAST, "--min-len", "12", "--output-format", "jsonl", input=text)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ("warning: <stdin>:1: its longest output allowed is 8 tokens (--max-len-a 1 x source + "
                             "--max-len-b 5, within the model's 64 target positions), less than --min-len 12: the "
                             "output ends there\n")
    short, blank, long = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(short["tokens"]) == 8 + 1 and len(long["tokens"]) >= 12 + 1 and blank["tokens"] == []
    refused = nmt("--path", ckpt, *FAST, "--min-len", "64", "--max-len-b", "2000", input=text)
    assert refused.exit_code == 1 and refused.stderr == (
        "error: --min-len 64 exceeds the model's longest output, 63 tokens (its 64 target positions, one of "
        "them for </s>)\n")


def test_bpe_codes_may_name_the_data_directorys_own_sentencepiece_model(run_dir, tmp_path):
    ckpt = str(run_dir / "checkpoint_best.pt")
    plain = nmt("--path", ckpt, *FAST, input="the dog runs\n")
    same = nmt("--path", ckpt, *FAST, "--bpe-codes", str(run_dir / "bpe.model"), input="the dog runs\n")
    assert (same.exit_code, same.stdout) == (0, plain.stdout), same.stderr
    other = tmp_path / "other.model"
    other.write_bytes((run_dir / "bpe.model").read_bytes() + b"\0")
    refused = nmt("--path", ckpt, *FAST, "--bpe-codes", str(other), input="the dog runs\n")
    assert refused.exit_code == 1 and refused.stderr == (
        f"error: --bpe-codes {other}: not the BPE codes of {run_dir} (nmt applies those itself)\n")


def test_sampling_topk_with_topp_is_refused_by_the_cli_and_the_api(run_dir):
    """fairseq would take top-p and drop top-k; nmt took top-k and dropped top-p: neither is asked for."""
    import nmt_cli
    from nmt_cli.errors import NmtError

    with pytest.raises(NmtError, match="give one of --sampling-topk and --sampling-topp, not both"):
        DecodeConfig(sampling=True, sampling_topk=5, sampling_topp=0.5)
    result = nmt("--path", str(run_dir / "checkpoint_best.pt"), *FAST, "--sampling", "--sampling-topk", "5",
                 "--sampling-topp", "0.5", input="the dog\n")
    assert result.exit_code == 1 and result.output == "error: give one of --sampling-topk and --sampling-topp, not both\n"
    model = nmt_cli.load(run_dir, threads=1)
    with pytest.raises(NmtError, match="give one of --sampling-topk and --sampling-topp, not both"):
        model.translate(["the dog"], sampling=True, sampling_topk=5, sampling_topp=0.5)
