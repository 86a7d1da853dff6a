"""Punctuation normalization and Moses tokenization (sacremoses), and their inverse.

Escaping is off by default (`escape=False`): `&`, `<`, `"` stay themselves, so
tokenized text detokenizes back without an unescaping step that could alter text
which already contained `&amp;`. (`escape=True` exists for models imported from
fairseq, whose Moses tokenizer escapes.) Whatever the tokenizer, the result is a line of
tokens separated by single spaces (runs of whitespace, tabs and leading or
trailing spaces are collapsed); that canonical form is what BPE sees.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from nmt_cli.errors import NmtError

TOKENIZERS = ("moses", "none")

# Moses' remove-non-printing-char.perl turns control characters into spaces (sacremoses'
# own option deletes them, which glues "a\tb" into "ab").
# Category Cc is exactly U+0000-U+001F and U+007F-U+009F.
_CONTROL_TO_SPACE = {code: " " for code in (*range(0x20), *range(0x7F, 0xA0))}


@dataclass(frozen=True)
class TokenizerSettings:
    """How one language's text is normalized and tokenized (stored in meta.json)."""

    name: str = "moses"
    lang: str = "en"
    normalize_punctuation: bool = True
    # Moses `-a`: split hyphenated words ("A-B" -> "A @-@ B"). Off: it doubles token counts for little gain.
    aggressive_dash_splits: bool = False
    # Moses XML escaping (`&` -> `&amp;`); detokenization then unescapes.
    escape: bool = False

    def __post_init__(self) -> None:
        if self.name not in TOKENIZERS:
            raise NmtError(f"unknown tokenizer {self.name!r} (choose from {', '.join(TOKENIZERS)})")
        if not self.lang:
            raise NmtError("tokenizer language must not be empty")

    def to_meta(self) -> dict[str, Any]:
        meta = asdict(self)
        del meta["lang"]  # meta.json records the language once, per side
        return meta

    @classmethod
    def from_meta(cls, meta: dict[str, Any], lang: str) -> "TokenizerSettings":
        return cls(
            name=meta.get("name", "moses"),
            lang=lang,
            normalize_punctuation=bool(meta.get("normalize_punctuation", True)),
            aggressive_dash_splits=bool(meta.get("aggressive_dash_splits", False)),
            escape=bool(meta.get("escape", False)),
        )


class Tokenizer:
    """Raw line -> tokenized line, and tokens -> detokenized line. Build once, call per line."""

    def __init__(self, settings: TokenizerSettings) -> None:
        self.settings = settings
        moses = settings.name == "moses"
        # sacremoses recompiles (via re's cache) each of its ~50 patterns per line; compiling
        # them once here gives the same result ~10% faster overall.
        self._normalizer = (
            [(re.compile(pattern), replacement) for pattern, replacement in MosesPunctNormalizer(lang=settings.lang).substitutions]
            if settings.normalize_punctuation
            else None
        )
        self._tokenizer = MosesTokenizer(lang=settings.lang) if moses else None
        self._detokenizer = MosesDetokenizer(lang=settings.lang) if moses else None

    def normalize(self, line: str) -> str:
        """Control characters -> spaces (as Moses' recipes do), then Moses punctuation normalization.

        Spaces first, because the normalizer deletes a bare `\r`, gluing the words around it.
        """
        if self._normalizer is None:
            return line
        line = line.translate(_CONTROL_TO_SPACE)
        for pattern, replacement in self._normalizer:
            line = pattern.sub(replacement, line)
        return line.strip()

    def tokenize(self, line: str) -> str:
        """Normalize and tokenize one line; tokens joined by single spaces ("" for a blank line)."""
        line = self.normalize(line)
        if self._tokenizer is not None and line.strip():
            line = self._tokenizer.tokenize(
                line,
                escape=self.settings.escape,
                aggressive_dash_splits=self.settings.aggressive_dash_splits,
                return_str=True,
            )
        return " ".join(line.split())

    def detokenize(self, tokens: list[str]) -> str:
        """Tokens -> text (Moses detokenization, or joining with spaces for `none`)."""
        if self._detokenizer is None:
            return " ".join(tokens)
        return self._detokenizer.detokenize(tokens, return_str=True, unescape=self.settings.escape)
