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
from dataclasses import dataclass

import torch

from nmt_cli.config import DecodeConfig, TranslateConfig
from nmt_cli.data.dictionary import EOS_ID, PAD_ID
from nmt_cli.decode.fixed_search import FixedSearch
from nmt_cli.decode.fixed_search import supports as supports_fixed_search
from nmt_cli.decode.graphs import GraphedTransformer, with_fixed_steps
from nmt_cli.decode.lines import InputLine
from nmt_cli.decode.loading import LoadedModels, TextSides, load_models, load_text_sides, text_directory
from nmt_cli.decode.search import Hypothesis, check_beam_fits, generate
from nmt_cli.errors import NmtError, where
from nmt_cli.host_memory import keep_freed_memory
from nmt_cli.models.fast import packed

# Source tokens per batch when neither --max-tokens nor --batch-size is given.
DEFAULT_MAX_TOKENS = 4096


def prepare_process(cfg: TranslateConfig) -> None:
    """The process settings translation runs under, in the main process and in each of
    --workers: torch's threads (one per process with workers, unless --threads says), the
    C library's reuse of freed memory on a CPU, and the seed."""
    if cfg.threads is not None or cfg.workers > 1:
        torch.set_num_threads(cfg.threads or 1)
    if torch.device(cfg.device).type == "cpu":
        keep_freed_memory()
    torch.manual_seed(cfg.decode.seed)


@dataclass
class Translation:
    number: int  # input line number
    hypotheses: list[Hypothesis]  # best first; empty for a blank line


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


class Translator:
    """Loads the model(s) and text pipelines once; translates groups of input lines."""

    def __init__(self, cfg: TranslateConfig, warn: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.warn = warn
        self.device = torch.device(cfg.device)  # TranslateConfig has checked it against precision and graphs
        if cfg.precision == "bf16" and self.device.type == "cpu":
            reason = packed.packed_unavailable_reason(torch.bfloat16)
            if reason is not None:
                warn(f"warning: --precision bf16: {reason}, so it runs under autocast (on CPUs without bf16 "
                     "instructions, slower than fp32)")
        self.models: LoadedModels = load_models(cfg.checkpoints, self.device, cfg.precision)
        check_beam_fits(cfg.decode.beam, len(self.models.tgt_dict))  # before search allocates beam-sized buffers
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
        need_target = cfg.output_format in ("text", "jsonl")
        directory = text_directory(cfg.checkpoints[0], cfg.data_bin)
        if cfg.data_bin is not None:
            need_source = need_target = True  # an explicit --data-bin is always checked
        self.text: TextSides = load_text_sides(directory, self.models, cfg.checkpoints[0], need_source, need_target)
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.decode.seed)

    def source_ids(self, line: InputLine, source_name: str) -> list[int] | None:
        """Source ids ending in </s>, or None for a line with nothing to translate."""
        if not line.text.strip():
            return None
        if self.cfg.input_format == "raw":
            pieces = self.text.source.encode(line.text)
        elif self.cfg.input_format == "bpe":
            pieces = line.text.split()
        else:
            return self._parse_ids(line, source_name)
        if not pieces:
            return None
        return self._fit(self.models.src_dict.encode(pieces), line, source_name)

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
        if not ids or ids[-1] != EOS_ID:
            ids.append(EOS_ID)
        return self._fit(ids, line, source_name)

    def _fit(self, ids: list[int], line: InputLine, source_name: str) -> list[int]:
        limit = self.models.max_source_positions
        if len(ids) <= limit:
            return ids
        self.warn(
            f"warning: {where(source_name, line.number)}: source has {len(ids)} tokens "
            f"(with </s>); truncated to the model's maximum of {limit}"
        )
        return ids[: limit - 1] + [EOS_ID]

    def translate(self, lines: list[InputLine], source_name: str) -> list[Translation]:
        """Translations of `lines`, in the same order."""
        return self.translate_ids(lines, [self.source_ids(line, source_name) for line in lines], source_name)

    def translate_ids(self, lines: list[InputLine], encoded: list[list[int] | None], source_name: str) -> list[Translation]:
        """Translations of `lines` already encoded by `source_ids` (None: nothing to translate)."""
        results = [Translation(line.number, []) for line in lines]
        todo = [i for i, ids in enumerate(encoded) if ids is not None]
        batches = make_batches([len(encoded[i]) for i in todo], self.cfg.max_tokens, self.cfg.batch_size)
        for batch in batches:
            items = [todo[j] for j in batch]
            src_tokens = pad_batch([encoded[i] for i in items], self.device)
            with self._autocast():
                hypotheses = self._search(src_tokens)
            for i, hyps in zip(items, hypotheses):
                results[i].hypotheses = hyps
        for i in todo:  # in line order
            hyps = results[i].hypotheses
            if not hyps or not math.isfinite(hyps[0].score):  # only when the model's scores were not finite
                self.warn(f"warning: {where(source_name, lines[i].number)}: no hypothesis with a finite score; "
                          "the output line is empty")
        return results

    def _search(self, src_tokens: torch.Tensor) -> list[list[Hypothesis]]:
        max_positions = self.models.max_target_positions
        if self.fixed_search is not None:
            return self.fixed_search.generate(src_tokens, max_positions)
        return generate(self.decoder, src_tokens, self.cfg.decode, max_positions, self.generator)

    def _autocast(self):
        if self.cfg.precision in ("fp32", "int8"):
            return nullcontext()
        dtype = torch.bfloat16 if self.cfg.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def format(self, translation: Translation) -> str:
        """One output line (without the newline) in --output-format."""
        fmt = self.cfg.output_format
        if fmt == "jsonl":
            return json.dumps(self._json(translation), ensure_ascii=False)
        if not translation.hypotheses:
            return ""
        if fmt == "bpe":
            return _one_line(" ".join(self.models.tgt_dict.decode(translation.hypotheses[0].tokens)))
        return self.hypothesis_text(translation.hypotheses[0])

    def hypothesis_text(self, hyp: Hypothesis) -> str:
        """A hypothesis as detokenized text on one line."""
        return _one_line(self.text.target.decode(self.models.tgt_dict.decode(hyp.tokens)))

    def with_decode(self, decode: DecodeConfig) -> Translator:
        """This translator's loaded models and text pipelines searching with `decode` instead
        (the Python API's and the server's per-call options); the original is unchanged."""
        check_beam_fits(decode.beam, len(self.models.tgt_dict))
        other = copy.copy(self)
        other.cfg = dataclasses.replace(self.cfg, decode=decode)
        other.generator = torch.Generator(device=self.device).manual_seed(decode.seed)
        if self.fixed_search is not None:
            other.fixed_search = FixedSearch(self.decoder, decode) if supports_fixed_search(decode) else None
        return other

    def _json(self, translation: Translation) -> dict:
        entries = [self._json_hypothesis(h) for h in translation.hypotheses]
        best = entries[0] if entries else {"hyp": "", "score": None, "tokens": [], "ids": [], "positional_scores": []}
        record = {"line": translation.number, **best}
        if self.cfg.decode.nbest > 1:
            record["nbest"] = entries
        return record

    def _json_hypothesis(self, hyp: Hypothesis) -> dict:
        pieces = self.models.tgt_dict.decode(hyp.tokens)
        return {
            "hyp": _one_line(self.text.target.decode(pieces)),
            "score": _finite_or_none(hyp.score),
            "tokens": self.models.tgt_dict.decode(hyp.tokens, strip_specials=False),
            "ids": hyp.tokens,
            "positional_scores": [_finite_or_none(round(s, 6)) for s in hyp.positional_scores],
        }


def _one_line(text: str) -> str:
    """Keep one output line per input line whatever the detokenizer produced."""
    return " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None

