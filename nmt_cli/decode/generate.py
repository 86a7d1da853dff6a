"""`nmt generate`: decode a data-bin's split and print fairseq-generate's lines.

For each sentence, in fairseq's order (batches of the length-sorted split, each batch
longest source first): `S-{id}` source, `T-{id}` target, then per hypothesis
`H-{id}\\t{score}\\t{text}`, `D-{id}\\t{score}\\t{detokenized text}`, `P-{id}\\t{per-token
scores}` and with `--print-alignment` `A-{id}\\t{alignment}` (`alignment_texts`), scores
in base 2 as fairseq prints them. `{id}` is the sentence's position in the split. At the
end: `Generate {subset} with beam={K}: BLEU4 = ...` (fairseq's BLEU, or sacreBLEU's), and
on stderr, where fairseq logs it, `Translated N sentences (M tokens) in ...`.

Batches are cut as fairseq's `batch_by_size` cuts them (`fairseq_batches`), with one
difference: fairseq 0.12 drops a last batch whose size is not a multiple of
`--required-batch-size-multiple` (its issue #5036), so that some sentences get no
output; nmt decodes every sentence.

Without `--tokenizer`/`--bpe` (which nmt does not take here) fairseq's D- text is its H-
text, and so it is here: `--remove-bpe` is what turns pieces back into words.
"""

from __future__ import annotations

import io
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import IO

import numpy as np
import torch

from nmt_cli.config import GENERATE_MAX_TOKENS, GenerateConfig
from nmt_cli.data.dictionary import BOS_ID, EOS_ID, PAD_ID, UNK, UNK_ID, Dictionary, check_same_symbols
from nmt_cli.data.pairs import PairDataset, load_data_bin, padded_rows
from nmt_cli.decode.loading import LoadedModels, load_models
from nmt_cli.decode.forced import cross_attention, hard_alignment, pad_rows, reference_log_probs
from nmt_cli.decode.search import Hypothesis, check_beam_fits, generate
from nmt_cli.errors import NmtError
from nmt_cli.files import write_output
from nmt_cli.scoring.fairseq_bleu import FairseqBleu
from nmt_cli.text.pipeline import remove_bpe_symbols

LOG2 = math.log(2)
ESCAPED_UNK = "<<unk>>"  # how fairseq writes a target's <unk>, so that BLEU never matches it


def fairseq_order(src_sizes: np.ndarray, tgt_sizes: np.ndarray) -> np.ndarray:
    """Sentence indices by source length, then target length, then position (fairseq's
    `LanguagePairDataset.ordered_indices` without shuffling)."""
    order = np.argsort(tgt_sizes, kind="mergesort")
    return order[np.argsort(src_sizes[order], kind="mergesort")]


def fairseq_batches(order: np.ndarray, num_tokens: np.ndarray, max_tokens: int | None,
                    max_sentences: int | None, multiple: int) -> list[np.ndarray]:
    """Consecutive runs of `order` as fairseq's `batch_by_size` cuts them.

    A batch's padded size (sentences x longest `num_tokens`) stays within `max_tokens`
    and its count within `max_sentences`. Under those limits a batch ends only at a size
    below `multiple` or a multiple of it: the sentences added since that size are the
    "tail" that starts the next batch when the limit is reached.
    """
    if len(order) == 0:
        return []
    limit_tokens, limit_sentences = max_tokens or 0, max_sentences or 0
    ends = [0]  # where each batch ends; the last one is the batch being built, up to its last allowed size
    start = 0  # first sentence of the batch being built
    batch_longest = tail_longest = 0  # longest sentence of the batch up to ends[-1], and of the tail after it
    for pos in range(len(order)):
        tail_longest = max(tail_longest, int(num_tokens[order[pos]]))
        end = pos + 1
        longest = max(batch_longest, tail_longest)
        count = end - start
        overflow = 0 < limit_sentences < count or 0 < limit_tokens < count * longest
        if overflow:
            # The batch is complete; its tail and `pos` start the next one, unless that is too
            # big as well: then the tail is a batch of its own and `pos` starts the next.
            if 0 < limit_tokens < tail_longest * (end - ends[-1]):
                ends.append(pos)
                tail_longest = int(num_tokens[order[pos]])
            start = ends[-1]
            ends.append(end)
            longest = tail_longest
        if overflow or count < multiple or count % multiple == 0:
            ends[-1] = end
            batch_longest = longest
            tail_longest = 0
    if ends[-1] != len(order):
        ends.append(len(order))
    bounds = [0] + ends
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def pieces_text(dictionary: Dictionary, ids: list[int], remove_bpe: str | None, escape_unk: bool = False) -> str:
    """fairseq's `Dictionary.string`: pieces without `<s>`/`</s>` joined by spaces, then BPE removed."""
    unk = ESCAPED_UNK if escape_unk else UNK
    text = " ".join(unk if i == UNK_ID else dictionary[i] for i in ids if i not in (EOS_ID, BOS_ID))
    return remove_bpe_symbols(text, remove_bpe)


def base2(value: float) -> float:
    """A natural-log score in base 2, computed in float32 as fairseq does (so the digits match)."""
    return float(torch.tensor(value, dtype=torch.float32) / LOG2)


@dataclass
class Summary:
    """What the closing lines report."""

    sentences: int
    tokens: int  # generated tokens of the best hypotheses, `</s>` included
    seconds: float  # in the search only
    bleu_line: str  # `Generate {subset} with beam={K}: BLEU4 = ...`


def check_same_dictionaries(models: LoadedModels, src_dict: Dictionary, tgt_dict: Dictionary, data: str,
                            checkpoint: str) -> None:
    """The data-bin's ids must mean what they meant to the model."""
    for side, ours, theirs in (("source", models.src_dict, src_dict), ("target", models.tgt_dict, tgt_dict)):
        check_same_symbols(f"the {side} dictionary of {data}", theirs.symbols, checkpoint, ours.symbols)


def check_sizes(pairs: PairDataset, models: LoadedModels, prefix: str, max_tokens: int | None) -> None:
    """fairseq-generate stops on a sentence longer than the model's positions or --max-tokens; so does nmt."""
    for sizes, limit, side in ((pairs.src_sizes, models.max_source_positions, "source"),
                               (pairs.tgt_sizes, models.max_target_positions, "target")):
        too_long = np.flatnonzero(sizes > limit)
        if len(too_long):
            i = int(too_long[0])
            raise NmtError(f"{prefix}: sentence {i} has {int(sizes[i])} {side} tokens, more than the model's "
                           f"{limit} positions")
    if max_tokens is not None and len(pairs):
        longest = np.maximum(pairs.src_sizes, pairs.tgt_sizes)
        i = int(np.argmax(longest))
        if int(longest[i]) > max_tokens:
            raise NmtError(f"{prefix}: sentence {i} has {int(longest[i])} tokens, more than --max-tokens {max_tokens}")


def run_generate(cfg: GenerateConfig, out: IO[str], output_name: str, log: IO[str]) -> Summary:
    """Decode `cfg.gen_subset` of `cfg.data` with `cfg.checkpoints`, writing fairseq-generate's lines to
    `out` (the file `output_name`, "-" for stdout, which a write error names) and its
    `Translated ...` line to `log`."""
    device = torch.device(cfg.device)
    if cfg.fp16 and device.type != "cuda":
        raise NmtError("--fp16 needs a GPU (none is available, or --cpu was given)")
    torch.manual_seed(cfg.decode.seed)
    data = load_data_bin(cfg.data, cfg.source_lang, cfg.target_lang)
    pairs = data.split(cfg.gen_subset)
    models = load_models(cfg.checkpoints, device, "fp16" if cfg.fp16 else "fp32")
    check_same_dictionaries(models, data.src_dict, data.tgt_dict, cfg.data, cfg.checkpoints[0])
    check_beam_fits(cfg.decode.beam, len(models.tgt_dict))
    max_tokens = cfg.max_tokens if cfg.max_tokens is not None or cfg.batch_size is not None else GENERATE_MAX_TOKENS
    prefix = str(data.path / f"{cfg.gen_subset}.{data.source_lang}-{data.target_lang}")
    check_sizes(pairs, models, prefix, max_tokens)

    src_sizes, tgt_sizes = pairs.src_sizes.astype(np.int64), pairs.tgt_sizes.astype(np.int64)
    order = fairseq_order(src_sizes, tgt_sizes)
    batches = fairseq_batches(order, np.maximum(src_sizes, tgt_sizes), max_tokens, cfg.batch_size,
                              cfg.required_batch_size_multiple)
    bleu = FairseqBleu()
    sacre_refs: list[str] = []
    sacre_hyps: list[str] = []
    tokens = 0
    seconds = 0.0
    autocast = torch.autocast("cuda", dtype=torch.float16) if cfg.fp16 else nullcontext()
    sampler = torch.Generator(device=device).manual_seed(cfg.decode.seed)  # for --sampling
    for batch in batches:
        # fairseq's collater puts a batch's longest source first (torch's sort, as fairseq calls it).
        lengths = torch.from_numpy(src_sizes[batch])
        _, within = lengths.sort(descending=True)
        ids = batch[within.numpy()]
        src_rows, src_lengths = padded_rows(pairs.src, ids)
        tgt_rows, tgt_lengths = padded_rows(pairs.tgt, ids)
        sources = [src_rows[row, : src_lengths[row]].tolist() for row in range(len(ids))]
        targets = [tgt_rows[row, : tgt_lengths[row]].tolist() for row in range(len(ids))]
        started = time.perf_counter()
        with torch.no_grad(), autocast:
            src_tokens = torch.from_numpy(src_rows).to(device)
            if cfg.score_reference:
                hypotheses = scored_references(models, src_tokens, targets)
            else:
                hypotheses = generate(models.decoder, src_tokens, cfg.decode, models.max_target_positions, sampler)
            alignments = alignment_texts(cfg, models, src_tokens, hypotheses)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - started
        tokens += sum(len(h[0].tokens) for h in hypotheses if h)
        lines = io.StringIO()  # the batch's lines, written at once
        for row, sentence in enumerate(ids):
            write_sentence(lines, cfg, models, int(sentence), sources[row], targets[row], hypotheses[row],
                           alignments[row], bleu, sacre_refs, sacre_hyps)
        write_output(out, lines.getvalue(), output_name, flush=False)
    if cfg.scoring == "sacrebleu":
        bleu_line = sacrebleu_result(sacre_hyps, sacre_refs)
    else:
        bleu_line = bleu.result_string()
    summary = Summary(len(pairs), tokens, seconds, f"Generate {cfg.gen_subset} with beam={cfg.decode.beam}: {bleu_line}")
    write_summary(out, output_name, log, summary)
    return summary


def scored_references(models: LoadedModels, src_tokens: torch.Tensor, targets: list[list[int]]) -> list[list[Hypothesis]]:
    """`--score-reference`, as fairseq's SequenceScorer: each target (ids ending in `</s>`) by
    teacher forcing, its score the mean of its tokens' log-probabilities (no length penalty)."""
    per_token = reference_log_probs(models.transformers, src_tokens, targets)
    return [[Hypothesis(ids, float(lprobs.sum() / len(ids)), lprobs.tolist())] for ids, lprobs in zip(targets, per_token)]


# fairseq's alignment layer of a standard transformer: the last decoder layer.
ALIGNMENT_LAYER = -1


def alignment_texts(cfg: GenerateConfig, models: LoadedModels, src_tokens: torch.Tensor,
                    hypotheses: list[list[Hypothesis]]) -> list[list[str]]:
    """Per sentence, the A- text of each hypothesis it prints (none without --print-alignment):
    the attention its tokens had, by teacher forcing, as fairseq's `extract_hard_alignment`
    and `extract_soft_alignment` turn it into text."""
    if cfg.print_alignment is None or cfg.quiet:
        return [[] for _ in hypotheses]
    printed = [(row, hyp.tokens) for row, hyps in enumerate(hypotheses) for hyp in hyps[: cfg.decode.nbest]]
    if not printed:
        return [[] for _ in hypotheses]
    ensemble = models.transformers
    sources = src_tokens[torch.tensor([row for row, _ in printed], device=src_tokens.device)]
    targets = [tokens for _, tokens in printed]
    source_lengths = sources.ne(PAD_ID).sum(dim=1).tolist()
    if cfg.print_alignment == "hard":
        positions = hard_alignment(ensemble, sources, targets, ALIGNMENT_LAYER)
        texts = [hard_alignment_text(p, n) for p, n in zip(positions, source_lengths)]
    else:
        attention = cross_attention(ensemble, sources, pad_rows(targets, src_tokens.device), ALIGNMENT_LAYER).cpu()
        texts = [soft_alignment_text(a[: len(t), :n]) for a, t, n in zip(attention, targets, source_lengths)]
    out: list[list[str]] = [[] for _ in hypotheses]
    for (row, _), text in zip(printed, texts):
        out[row].append(text)
    return out


def hard_alignment_text(source_positions: list[int], source_length: int) -> str:
    """`src-tgt` pairs of token positions, 0-based; none for a source of `</s>` alone, as fairseq."""
    if source_length <= 1:
        return ""
    return " ".join(f"{source}-{target}" for target, source in enumerate(source_positions))


def soft_alignment_text(attention: torch.Tensor) -> str:
    """Per target token (`</s>` included), its attention over the source tokens (`</s>` included)."""
    return " ".join(",".join(f"{p:.6f}" for p in row) for row in attention.tolist())


def write_sentence(out: IO[str], cfg: GenerateConfig, models: LoadedModels, sentence: int, source: list[int],
                   target: list[int], hypotheses: list[Hypothesis], alignments: list[str], bleu: FairseqBleu,
                   sacre_refs: list[str], sacre_hyps: list[str]) -> None:
    """One sentence's lines, and its best hypothesis into the BLEU statistics."""
    src_text = pieces_text(models.src_dict, source, cfg.remove_bpe)
    tgt_text = pieces_text(models.tgt_dict, target, cfg.remove_bpe, escape_unk=True)
    if not cfg.quiet:
        out.write(f"S-{sentence}\t{src_text}\nT-{sentence}\t{tgt_text}\n")
    for rank, hyp in enumerate(hypotheses[: cfg.decode.nbest]):
        hyp_text = pieces_text(models.tgt_dict, hyp.tokens, cfg.remove_bpe)
        if not cfg.quiet:
            score = base2(hyp.score)
            positional = torch.tensor(hyp.positional_scores, dtype=torch.float32).div_(LOG2).tolist()
            out.write(f"H-{sentence}\t{score}\t{hyp_text}\nD-{sentence}\t{score}\t{hyp_text}\n"
                      f"P-{sentence}\t{' '.join(f'{p:.4f}' for p in positional)}\n")
            if rank < len(alignments):
                out.write(f"A-{sentence}\t{alignments[rank]}\n")
        if rank == 0:
            if cfg.scoring == "sacrebleu":
                sacre_refs.append(tgt_text)
                sacre_hyps.append(hyp_text)
            elif cfg.remove_bpe is None:
                # fairseq scores the ids themselves; their pieces compare the same.
                bleu.add([models.tgt_dict[i] for i in target if i != EOS_ID],
                         [models.tgt_dict[i] for i in hyp.tokens if i != EOS_ID], unk=UNK)
            else:
                bleu.add(tgt_text.split(), hyp_text.split())


def sacrebleu_result(hyps: list[str], refs: list[str]) -> str:
    """fairseq's `--scoring sacrebleu`: 13a-tokenized text scored with tokenize='none'."""
    import sacrebleu
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tokenize = Tokenizer13a()
    return sacrebleu.corpus_bleu([tokenize(h) for h in hyps], [[tokenize(r) for r in refs]], tokenize="none").format()


def write_summary(out: IO[str], output_name: str, log: IO[str], summary: Summary) -> None:
    """As fairseq: the `Translated` line is logged (stderr), the BLEU line printed with the sentences."""
    seconds = summary.seconds or float("nan")
    log.write(f"Translated {summary.sentences:,} sentences ({summary.tokens:,} tokens) in {summary.seconds:.1f}s "
              f"({summary.sentences / seconds:.2f} sentences/s, {summary.tokens / seconds:.2f} tokens/s)\n")
    write_output(out, summary.bleu_line + "\n", output_name)
