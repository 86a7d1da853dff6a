"""Text in, text out: encode lines, batch them by length, search, restore input order.

Every input line gives exactly one output line, in input order: blank lines give
an empty line without running the model; a source longer than the model's
maximum source positions is cut to fit, with a warning naming the line.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from nmt_cli.config import DecodeConfig, TranslateConfig
from nmt_cli.data.dictionary import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID
from nmt_cli.decode.constraints import ConstraintSet
from nmt_cli.decode.fixed_search import FixedSearch
from nmt_cli.decode.fixed_search import supports as supports_fixed_search
from nmt_cli.decode.forced import hard_alignment, reference_log_probs
from nmt_cli.decode.graphs import GraphedTransformer, with_fixed_steps
from nmt_cli.decode.guided import (GuidedLine, as_piece, format_alignment, parse_line, replace_unknowns,
                                   word_alignment, word_indices)
from nmt_cli.decode.lines import InputLine
from nmt_cli.decode.loading import (LoadedModels, TextSides, fairseq_interactive_text, load_models,
                                   load_text_sides, text_directory)
from nmt_cli.decode.search import Hypothesis, check_beam_fits, check_min_len_fits, generate, max_output_lengths
from nmt_cli.errors import NmtError, where
from nmt_cli.host_memory import bound_onednn_caches, keep_freed_memory
from nmt_cli.models.fast import packed

# Source tokens per batch when neither --max-tokens nor --batch-size is given.
DEFAULT_MAX_TOKENS = 4096
# Characters of a source line read per source position of the model: far more than text
# needs (a token is a few characters, a sentencepiece piece at most 16), so that only a line
# the model could not read whole anyway is cut, before tokenizing it costs 35x its size.
CHARS_PER_POSITION = 64


def prepare_process(cfg: TranslateConfig) -> None:
    """The process settings translation runs under, in the main process and in each of
    --workers: torch's threads (one per process with workers, unless --threads says), the
    C library's reuse of freed memory and oneDNN's bounded kernel caches on a CPU, and the
    seed. Runs before the model is loaded (the caches' bound is read at their first use)."""
    if cfg.threads is not None or cfg.workers > 1:
        torch.set_num_threads(cfg.threads or 1)
    if torch.device(cfg.device).type == "cpu":
        keep_freed_memory()
        bound_onednn_caches()
    torch.manual_seed(cfg.decode.seed)


@dataclass
class Translation:
    number: int  # input line number
    hypotheses: list[Hypothesis]  # best first; empty for a blank line (--score-reference: the reference)
    source_ids: list[int] | None = None  # the source as the model read it (for alignments)
    # Its pieces (one per id but the </s>) as segmented before the dictionary lookup, where a
    # word the dictionary lacks is still itself: the words of alignments and --replace-unk.
    source_pieces: list[str] | None = None


def make_batches(lengths: list[int], max_tokens: int | None, batch_size: int | None) -> list[list[int]]:
    """Group item indices, longest first, so that padded size (count x longest) fits the budget.

    An item longer than `max_tokens` still forms a batch of its own.
    """
    if max_tokens is None and batch_size is None:
        max_tokens = DEFAULT_MAX_TOKENS
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        batch = batches[-1] if batches else None
        fits = batch is not None
        if fits and batch_size is not None and len(batch) >= batch_size:
            fits = False
        if fits and max_tokens is not None and (len(batch) + 1) * lengths[batch[0]] > max_tokens:
            fits = False
        if fits:
            batch.append(i)
        else:
            batches.append([i])
    return batches


def pad_batch(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Right-pad id lists into a (B, S) tensor."""
    S = max(len(r) for r in rows)
    batch = torch.full((len(rows), S), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return batch.to(device)


def without_specials(ids: list[int], what: str, final_eos: bool, at: str) -> list[int]:
    """`ids` without a final </s> where `final_eos` allows one; NmtError naming the line where
    <pad>, <s> or </s> is left among them (search would mask, force or end at it)."""
    if final_eos and ids and ids[-1] == EOS_ID:
        ids = ids[:-1]
    for special in (PAD_ID, BOS_ID, EOS_ID):
        if special in ids:
            last = " but as its last token" if final_eos and special == EOS_ID else ""
            raise NmtError(f"{what} may not hold {SPECIALS[special]}{last} at {at}")  # SPECIALS: in id order
    return ids


def cut_source_text(text: str, positions: int) -> str:
    """`text` cut to CHARS_PER_POSITION x `positions` characters, at the last space within
    them where there is one (a word cut in two would be segmented otherwise)."""
    limit = CHARS_PER_POSITION * positions
    if len(text) <= limit:
        return text
    space = text.rfind(" ", 0, limit + 1)
    return text[:space] if space > 0 else text[:limit]


def truncated_source(ids: list[int], limit: int) -> list[int]:
    """A source's ids (ending in </s>) cut to the model's `limit` positions, </s> kept."""
    return ids if len(ids) <= limit else ids[: limit - 1] + [EOS_ID]


class Translator:
    """Loads the model(s) and text pipelines once; translates groups of input lines."""

    def __init__(self, cfg: TranslateConfig, warn: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.warn = warn
        self.engine = None  # --engine ctranslate2: it runs the batch -> hypotheses step (_search)
        if cfg.engine == "ctranslate2":
            self._open_ctranslate2()
            return
        self.device = torch.device(cfg.device)  # TranslateConfig has checked it against precision and graphs
        if cfg.precision == "bf16" and self.device.type == "cpu":
            reason = packed.packed_unavailable_reason(torch.bfloat16)
            if reason is not None:
                warn(f"warning: --precision bf16: {reason}, so it runs under autocast (on CPUs without bf16 "
                     "instructions, slower than fp32)")
        self.models: LoadedModels = load_models(cfg.checkpoints, self.device, cfg.precision, cfg.use_ema)
        check_beam_fits(cfg.decode.beam, len(self.models.tgt_dict))  # before search allocates beam-sized buffers
        check_min_len_fits(cfg.decode.min_len, self.models.max_target_positions)
        self.decoder = self.models.decoder
        # With CUDA graphs (by default on a GPU, where they decode several times faster),
        # beam search on one model is one graph per step; otherwise (ensembles, sampling,
        # n-gram bans) the model's step alone is graphed.
        self.fixed_search: FixedSearch | None = None
        if cfg.cuda_graphs or (cfg.cuda_graphs is None and self.device.type == "cuda"):
            self.decoder = with_fixed_steps(self.models.decoder, use_graphs=True, warn=warn)
            if isinstance(self.decoder, GraphedTransformer) and supports_fixed_search(cfg.decode):
                self.fixed_search = FixedSearch(self.decoder, cfg.decode)
        need_source = cfg.input_format == "raw"
        need_target = cfg.output_format in ("text", "jsonl") or (need_source and cfg.guided.reads_target_text)
        directory = text_directory(cfg.checkpoints[0], cfg.data_bin)
        # An explicit --data-bin is always checked; alignments' words are those of the BPE, whatever the formats.
        if cfg.data_bin is not None or cfg.guided.needs_alignment:
            need_source = need_target = True
        self.text = self._open_text(directory, cfg.checkpoints[0], need_source, need_target)
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.decode.seed)

    def _open_ctranslate2(self) -> None:
        """The CTranslate2 engine, and the text pipelines of its export (or of --data-bin)."""
        from nmt_cli.decode.ctranslate2_engine import CTranslate2Engine

        cfg = self.cfg
        self.engine = CTranslate2Engine(cfg, self.warn)
        self.models = self.engine.models
        check_beam_fits(cfg.decode.beam, len(self.models.tgt_dict))
        check_min_len_fits(cfg.decode.min_len, self.models.max_target_positions)
        self.device = torch.device("cpu")  # where the batches are built; CTranslate2 has its own --device
        self.decoder, self.fixed_search = None, None
        need_source = cfg.input_format == "raw" or cfg.data_bin is not None
        need_target = cfg.output_format in ("text", "jsonl") or cfg.data_bin is not None
        directory = Path(cfg.data_bin) if cfg.data_bin is not None else self.engine.directory
        self.text = self._open_text(directory, str(self.engine.directory), need_source, need_target)
        self.generator = torch.Generator().manual_seed(cfg.decode.seed)

    def _open_text(self, directory: Path, checkpoint: str, need_source: bool, need_target: bool) -> TextSides:
        """The text pipelines of `directory` (checked against the model), or those that
        fairseq's -s/-t/--tokenizer/--bpe/--bpe-codes give; both engines take the same."""
        sides = load_text_sides(directory, self.models, checkpoint, need_source, need_target)
        return fairseq_interactive_text(self.cfg, directory, self.models) or sides

    def source_ids(self, line: InputLine, source_name: str) -> list[int] | None:
        """Source ids ending in </s>, or None for a line with nothing to translate."""
        source = self._source(line, source_name)
        return source[1] if source is not None else None

    def _source(self, line: InputLine, source_name: str) -> tuple[list[str], list[int]] | None:
        """The source's pieces (see Translation.source_pieces) and ids ending in </s>, cut to
        the model's positions; None for a line with nothing to translate."""
        if not line.text.strip():
            return None
        at = where(source_name, line.number)
        text = cut_source_text(line.text, self.models.max_source_positions)
        cut = None
        if len(text) < len(line.text):
            cut, line = (len(text), len(line.text)), replace(line, text=text)
        if self.cfg.input_format == "raw":
            pieces = self.text.source.encode(line.text)
            ids = self.models.src_dict.encode(pieces, append_eos=False)
        elif self.cfg.input_format == "bpe":  # text: a piece spelt </s> is <unk>, as in training data
            pieces = line.text.split()
            ids = self.models.src_dict.encode(pieces, append_eos=False)
        else:
            ids = without_specials(self._parse_ids(line, source_name), "the source", True, at)
            pieces = self.models.src_dict.decode(ids)
        if not ids:  # ids of nothing but </s>: as a blank line
            return None
        ids = self._fit(ids + [EOS_ID], at, cut)
        return pieces[: len(ids) - 1], ids

    def _parse_ids(self, line: InputLine, source_name: str) -> list[int]:
        try:
            ids = [int(field) for field in line.text.split()]
        except ValueError:
            raise NmtError(f"--input-format ids: not a list of integers at {where(source_name, line.number)}") from None
        bad = [i for i in ids if not 0 <= i < len(self.models.src_dict)]
        if bad:
            raise NmtError(
                f"--input-format ids: id {bad[0]} is outside the source dictionary "
                f"(0..{len(self.models.src_dict) - 1}) at {where(source_name, line.number)}"
            )
        return ids

    def _fit(self, ids: list[int], at: str, cut: tuple[int, int] | None) -> list[int]:
        """`ids` truncated to the model's positions, with one warning for the line at `at`;
        `cut` (characters read, characters of the line) where cut_source_text cut its text."""
        limit = self.models.max_source_positions
        if len(ids) <= limit:
            if cut is not None:
                self.warn(f"warning: {at}: source line has {cut[1]} characters; only its first {cut[0]} are read "
                          f"({CHARS_PER_POSITION} per position of the model's {limit})")
            return ids
        read = f" in its first {cut[0]} of {cut[1]} characters" if cut is not None else ""
        self.warn(f"warning: {at}: source has {len(ids)} tokens (with </s>){read}; truncated to the model's "
                  f"maximum of {limit}")
        return truncated_source(ids, limit)

    def translate(self, lines: list[InputLine], source_name: str) -> list[Translation]:
        """Translations of `lines`, in the same order (--score-reference: their references' scores)."""
        guided = [parse_line(line, self.cfg.guided, source_name) for line in lines]
        sources = [self._source(replace(line, text=g.source), source_name) for line, g in zip(lines, guided)]
        encoded = [source[1] if source is not None else None for source in sources]
        if self.cfg.guided.score_reference:  # a reference is scored even against an empty source (</s> alone)
            encoded = [[EOS_ID] if ids is None and (g.reference or "").strip() else ids
                       for ids, g in zip(encoded, guided)]
        results = self.translate_ids(lines, encoded, source_name, guided)
        for result, source in zip(results, sources):
            result.source_pieces = source[0] if source is not None else None
        return results

    def translate_ids(self, lines: list[InputLine], encoded: list[list[int] | None], source_name: str,
                      guided: list | None = None) -> list[Translation]:
        """Translations of `lines` already encoded by `source_ids` (None: nothing to translate);
        `guided`: each line's parsed guidance, or None for lines of source text alone (the Python API's)."""
        if guided is None:
            guided = [parse_line(line, self.cfg.guided, source_name) for line in lines]
        results = [Translation(line.number, [], ids) for line, ids in zip(lines, encoded)]
        todo = [i for i, ids in enumerate(encoded) if ids is not None]
        targets = {i: self._guide_ids(guided[i], lines[i].number, source_name) for i in todo}
        if not self.cfg.guided.score_reference:
            self._warn_where_min_len_is_cut(lines, encoded, [i for i in todo if targets[i].free], source_name)
        batches = make_batches([len(encoded[i]) for i in todo], self.cfg.max_tokens, self.cfg.batch_size)
        for batch in batches:
            items = [todo[j] for j in batch]
            src_tokens = pad_batch([encoded[i] for i in items], self.device)
            with self._autocast():
                if self.cfg.guided.score_reference:
                    hypotheses = self._score_references(src_tokens, [targets[i].reference for i in items])
                else:
                    hypotheses = self._guided_search(src_tokens, [targets[i] for i in items])
                    if self.cfg.guided.needs_alignment:
                        self._align(src_tokens, hypotheses)
            for i, hyps in zip(items, hypotheses):
                results[i].hypotheses = hyps
        # In line order. (A reference's score is printed as it is, finite or not.)
        for i in [] if self.cfg.guided.score_reference else todo:
            hyps = results[i].hypotheses
            if not hyps or not math.isfinite(hyps[0].score):  # only when the model's scores were not finite
                self.warn(f"warning: {where(source_name, lines[i].number)}: no hypothesis with a finite score; "
                          "the output line is empty")
        return results

    def _warn_where_min_len_is_cut(self, lines: list[InputLine], encoded: list, todo: list[int],
                                   source_name: str) -> None:
        """A line whose longest output allowed is shorter than --min-len ends there (the forced
        </s> wins, in both engines): said for each such line rather than silently."""
        decode, positions = self.cfg.decode, self.models.max_target_positions
        if decode.min_len == 0:
            return
        for i, limit in zip(todo, max_output_lengths([len(encoded[i]) for i in todo], decode, positions)):
            if limit < decode.min_len:
                self.warn(f"warning: {where(source_name, lines[i].number)}: its longest output allowed is {limit} "
                          f"tokens (--max-len-a {decode.max_len_a:g} x source + --max-len-b {decode.max_len_b}, "
                          f"within the model's {positions} target positions), less than --min-len {decode.min_len}: the output "
                          "ends there")

    def _search(self, src_tokens: torch.Tensor) -> list[list[Hypothesis]]:
        max_positions = self.models.max_target_positions
        if self.engine is not None:
            return self.engine.generate(src_tokens)
        if self.fixed_search is not None:
            return self.fixed_search.generate(src_tokens, max_positions)
        return generate(self.decoder, src_tokens, self.cfg.decode, max_positions, self.generator)

    # ---- guided decoding (decode/guided.py, decode/constraints.py, decode/forced.py) ----

    def _guide_ids(self, guide: GuidedLine, number: int, source_name: str) -> "GuideIds":
        """A line's prefix, phrases and reference as target ids (without </s>)."""
        at = where(source_name, number)
        prefix = self._target_ids(guide.prefix, "a prefix", at) if guide.prefix else []
        if len(prefix) >= self.models.max_target_positions:
            raise NmtError(f"prefix of {len(prefix)} tokens does not fit the model's {self.models.max_target_positions} "
                           f"target positions at {at}")
        phrases = [ids for ids in (self._target_ids(c, "a constraint", at) for c in guide.constraints) if ids]
        if phrases and self.cfg.decode.sampling:  # --json-input's (TranslateConfig refuses --constraints)
            raise NmtError(f"constraints need beam search, not --sampling, at {at}")
        # The output holds every phrase and its </s>.
        if sum(map(len, phrases)) >= self.models.max_target_positions:
            raise NmtError(f"constraints of {sum(map(len, phrases))} tokens do not fit the model's "
                           f"{self.models.max_target_positions} target positions at {at}")
        reference = None
        if self.cfg.guided.score_reference:
            reference = self._target_ids(guide.reference or "", "the reference", at) + [EOS_ID]
            if len(reference) > self.models.max_target_positions:
                raise NmtError(f"reference of {len(reference)} tokens (with </s>) is longer than the model's "
                               f"{self.models.max_target_positions} target positions at {at}")
        return GuideIds(prefix, phrases, reference)

    def _target_ids(self, text: str, what: str, at: str) -> list[int]:
        """`what`'s target ids; ids of a reference may end in </s> (dropped: it gets one anyway).
        Text (raw or bpe) spelling `<s>`, `<pad>` or `</s>` gives `<unk>` (Dictionary.encode)."""
        if self.cfg.input_format == "raw":
            return self.models.tgt_dict.encode(self.text.target.encode(text), append_eos=False)
        if self.cfg.input_format == "bpe":
            return self.models.tgt_dict.encode(text.split(), append_eos=False)
        try:
            ids = [int(field) for field in text.split()]
        except ValueError:
            raise NmtError(f"--input-format ids: {what} is not a list of integers at {at}") from None
        bad = [i for i in ids if not 0 <= i < len(self.models.tgt_dict)]
        if bad:
            raise NmtError(f"--input-format ids: {what} id {bad[0]} is outside the target dictionary "
                           f"(0..{len(self.models.tgt_dict) - 1}) at {at}")
        return without_specials(ids, what, what == "the reference", at)

    def _guided_search(self, src_tokens: torch.Tensor, guides: list["GuideIds"]) -> list[list[Hypothesis]]:
        """Search with the batch's prefixes and phrases; plain search when it has none.
        (A guided batch takes the eager search: the fixed-shape one knows no guides.)"""
        if not any(g.prefix or g.phrases for g in guides):
            return self._search(src_tokens)
        prefix = pad_batch([g.prefix or [PAD_ID] for g in guides], self.device) if any(g.prefix for g in guides) else None
        constraints = None
        if any(g.phrases for g in guides):
            ordered = (self.cfg.guided.constraints or "ordered") == "ordered"
            constraints = ConstraintSet.from_lists([g.phrases for g in guides], ordered, self.device)
        return generate(self.decoder, src_tokens, self.cfg.decode, self.models.max_target_positions, self.generator,
                        prefix_tokens=prefix, constraints=constraints)

    def _score_references(self, src_tokens: torch.Tensor, references: list[list[int]]) -> list[list[Hypothesis]]:
        """Each reference as a hypothesis scored by teacher forcing: score = summed log-prob."""
        per_token = reference_log_probs(self.models.transformers, src_tokens, references)
        out = []
        for ids, lprobs in zip(references, per_token):
            scores = lprobs.tolist()
            out.append([Hypothesis(ids, float(sum(scores)), scores)])
        return out

    def _align(self, src_tokens: torch.Tensor, hypotheses: list[list[Hypothesis]]) -> None:
        """Set each hypothesis' source_positions from the --alignment-layer's cross-attention
        (of the first model of an ensemble), by teacher forcing."""
        flat = [(b, h) for b, hyps in enumerate(hypotheses) for h in hyps]
        if not flat:
            return
        model = self.models.transformers[0]
        layers = len(model.decoder.layers)
        layer = self.cfg.guided.alignment_layer
        if not -layers <= layer < layers:
            raise NmtError(f"--alignment-layer {layer} is outside the model's {layers} decoder layers")
        src = src_tokens[torch.tensor([b for b, _ in flat], device=src_tokens.device)]
        positions = hard_alignment([model], src, [h.tokens for _, h in flat], layer % layers)
        for (_, hyp), row in zip(flat, positions):
            hyp.source_positions = row

    def _pieces(self, hyp: Hypothesis, translation: Translation) -> tuple[list[str], list[int] | None, dict[int, str]]:
        """The hypothesis' target pieces, with alignments the source position of each, and
        --replace-unk's source words by the index of the `<unk>` they replace."""
        tgt_dict = self.models.tgt_dict
        if hyp.source_positions is None:
            return tgt_dict.decode(hyp.tokens), None, {}
        kept = [(t, s) for t, s in zip(hyp.tokens, hyp.source_positions) if t not in (BOS_ID, PAD_ID, EOS_ID)]
        pieces, positions = [tgt_dict.symbols[t] for t, _ in kept], [s for _, s in kept]
        copies = {}
        if self.cfg.guided.replace_unk:
            copies = replace_unknowns(pieces, self._source_pieces(translation), positions,
                                      self._segmenter(self.text.source), tgt_dict.symbols[UNK_ID])
        return pieces, positions, copies

    def _source_pieces(self, translation: Translation) -> list[str]:
        """The source's pieces; for sources the Python API encoded, those of its ids."""
        if translation.source_pieces is not None:
            return translation.source_pieces
        return self.models.src_dict.decode(translation.source_ids)

    @staticmethod
    def _segmenter(pipeline) -> object | None:
        return pipeline.bpe if pipeline is not None else None

    def _alignment(self, pieces: list[str], positions: list[int], copies: dict[int, str],
                   translation: Translation) -> list[tuple[int, int]]:
        return word_alignment(positions, word_indices(self._source_pieces(translation), self._segmenter(self.text.source)),
                              word_indices(pieces, self._segmenter(self.text.target), copies))

    def _autocast(self):
        if self.cfg.precision in ("fp32", "int8") or self.engine is not None:
            return nullcontext()
        dtype = torch.bfloat16 if self.cfg.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def format(self, translation: Translation) -> str:
        """The output of one input line in --output-format, without its last newline: one JSON
        object (jsonl), or --nbest lines (text, bpe)."""
        fmt = self.cfg.output_format
        if fmt == "jsonl":
            return json.dumps(self._json(translation), ensure_ascii=False)
        if self.cfg.guided.score_reference:  # one score line per input line (the reference's)
            if not translation.hypotheses:
                return ""
            best = translation.hypotheses[0]
            return f"{best.score:.6f}\t" + " ".join(f"{s:.6f}" for s in best.positional_scores)
        # --nbest N: N lines per input line, best first; missing hypotheses (an empty input) are empty lines.
        lines = []
        for hypothesis in translation.hypotheses[: self.cfg.decode.nbest]:
            pieces, positions, copies = self._pieces(hypothesis, translation)
            if fmt == "bpe":  # a copied word as one piece that starts a word
                segmenter = self._segmenter(self.text.target)
                text = _one_line(" ".join(as_piece(copies[i], segmenter) if i in copies else piece
                                          for i, piece in enumerate(pieces)))
            else:
                text = self._text(pieces, copies)
            if self.cfg.guided.print_alignment:
                text += "\t" + format_alignment(self._alignment(pieces, positions, copies, translation))
            lines.append(text)
        return "\n".join(lines + [""] * (self.cfg.decode.nbest - len(lines)))

    def _text(self, pieces: list[str], copies: dict[int, str]) -> str:
        """Target pieces as detokenized text on one line, each copied word a word of its own."""
        return _one_line(self.text.target.decode([copies.get(i, p) for i, p in enumerate(pieces)], copies))

    def hypothesis_text(self, hyp: Hypothesis) -> str:
        """A hypothesis as detokenized text on one line."""
        return _one_line(self.text.target.decode(self.models.tgt_dict.decode(hyp.tokens)))

    def restart_sampling(self) -> None:
        """Sample from --seed's start again, as a new `nmt translate` run does: each call of
        the Python API (and each batch of the server) samples as that run would, whatever
        was sampled before it."""
        if self.cfg.decode.sampling:
            self.generator.manual_seed(self.cfg.decode.seed)
            if self.engine is not None:
                self.engine.restart_sampling()

    def with_decode(self, decode: DecodeConfig) -> Translator:
        """This translator's loaded models and text pipelines searching with `decode` instead
        (the Python API's and the server's per-call options); the original is unchanged."""
        check_beam_fits(decode.beam, len(self.models.tgt_dict))
        check_min_len_fits(decode.min_len, self.models.max_target_positions)
        other = copy.copy(self)
        other.cfg = dataclasses.replace(self.cfg, decode=decode)
        other.generator = torch.Generator(device=self.device).manual_seed(decode.seed)
        if self.engine is not None:
            other.engine = self.engine.with_decode(other.cfg)
        if self.fixed_search is not None:
            other.fixed_search = FixedSearch(self.decoder, decode) if supports_fixed_search(decode) else None
        return other

    def _json(self, translation: Translation) -> dict:
        entries = [self._json_hypothesis(h, translation) for h in translation.hypotheses]
        best = entries[0] if entries else {"hyp": "", "score": None, "tokens": [], "ids": [], "positional_scores": []}
        if not entries and self.cfg.guided.print_alignment:
            best["alignment"] = []
        record = {"line": translation.number, **best}
        if self.cfg.decode.nbest > 1:
            record["nbest"] = entries
        return record

    def _json_hypothesis(self, hyp: Hypothesis, translation: Translation) -> dict:
        pieces, positions, copies = self._pieces(hyp, translation)
        entry = {
            "hyp": self._text(pieces, copies),
            "score": _finite_or_none(hyp.score),
            "tokens": self.models.tgt_dict.decode(hyp.tokens, strip_specials=False),
            "ids": hyp.tokens,
            "positional_scores": [_finite_or_none(round(s, 6)) for s in hyp.positional_scores],
        }
        if self.cfg.guided.print_alignment:
            entry["alignment"] = [list(pair) for pair in self._alignment(pieces, positions, copies, translation)]
        return entry


@dataclass
class GuideIds:
    """One line's guides as target ids, none ending in </s> but the reference."""

    prefix: list[int]  # empty: none
    phrases: list[list[int]]  # each non-empty
    reference: list[int] | None  # --score-reference only, ending in </s>

    @property
    def free(self) -> bool:
        """No prefix and no phrases: the output's length limit is --max-len-a/-b's alone."""
        return not self.prefix and not self.phrases


def _one_line(text: str) -> str:
    """Keep one output line per input line whatever the detokenizer produced."""
    return " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None

