"""Punctuation normalization and Moses tokenization (sacremoses), and their inverse.

Escaping is off by default (`escape=False`): `&`, `<`, `"` stay themselves, so
tokenized text detokenizes back without an unescaping step that could alter text
which already contained `&amp;`. (`escape=True` exists for models imported from
fairseq, whose Moses tokenizer escapes.) Whatever the tokenizer, the result is a line of
tokens separated by single spaces (runs of whitespace, tabs and leading or
trailing spaces are collapsed); that canonical form is what BPE sees.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

from nmt_cli.errors import NmtError

try:  # the regular-expression parser, to find the text every match of a pattern contains
    from re import _parser as sre_parse  # Python >= 3.11
except ImportError:  # Python 3.10
    import sre_parse

TOKENIZERS = ("moses", "none")

# Moses' remove-non-printing-char.perl turns control characters into spaces (sacremoses'
# own option deletes them, which glues "a\tb" into "ab").
# Category Cc is exactly U+0000-U+001F and U+007F-U+009F.
_CONTROL_TO_SPACE = {code: " " for code in (*range(0x20), *range(0x7F, 0xA0))}


@functools.cache  # once a process: sacremoses' large character classes are slow to parse
def required_text(pattern: re.Pattern[str], replacement: str) -> str:
    """A substring of every line that `pattern.sub(replacement, line)` can change ("" if none is known).

    Most normalization and tokenization rules rarely apply, yet each `sub` runs its regex
    over the line even without a match; a substring test first, far cheaper, skips them. The text is the
    longest run of plain characters at the top level of the pattern, which every match contains.
    """
    if pattern.flags & re.IGNORECASE:
        return ""
    items = list(sre_parse.parse(pattern.pattern, pattern.flags))
    # `c+` -> `c` (Moses' " +" -> " ") replaces a single `c` by itself: only `cc` changes the line.
    if len(items) == 1 and items[0][0] == sre_parse.MAX_REPEAT:
        low, _, body = items[0][1]
        if low >= 1 and len(replacement) == 1 and list(body) == [(sre_parse.LITERAL, ord(replacement))]:
            return replacement * 2
    longest, run = "", ""
    for op, arg in items:
        run = run + chr(arg) if op == sre_parse.LITERAL else ""
        longest = max(longest, run, key=len)
    return longest


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


def _normalization_rule(pattern: str, replacement: str) -> tuple[re.Pattern[str], str, str]:
    compiled = re.compile(pattern)
    return compiled, replacement, required_text(compiled, replacement)


class _Prefiltered:
    """A compiled pattern whose `sub` leaves text alone, unscanned, when `can_change(text)` is false."""

    def __init__(self, pattern: re.Pattern[str], can_change: Callable[[str], bool]) -> None:
        self.pattern, self.can_change = pattern, can_change

    def sub(self, replacement: str, text: str) -> str:
        return self.pattern.sub(replacement, text) if self.can_change(text) else text


def _prefiltered(rule: tuple[re.Pattern[str], str]) -> tuple[re.Pattern[str] | _Prefiltered, str]:
    pattern, replacement = rule
    required = required_text(pattern, replacement)
    return (_Prefiltered(pattern, lambda text: required in text), replacement) if required else rule


def _has_whitespace_to_collapse(text: str) -> bool:
    """Whether `\\s+` -> " " changes `text`: printable text has no whitespace but " " (see the tests)."""
    return "  " in text or not text.isprintable()


class _MosesTokenizer(MosesTokenizer):
    """sacremoses' tokenizer, doing less work for the same output.

    Its rules that need a character most lines lack ("," or "'") are prefiltered, and so is
    its whitespace collapsing (twice a line, on text that has single spaces nearly always):
    each scans the whole line. sacremoses reads its rules as attributes, which are shadowed
    here per instance.
    """

    # (pattern, replacement) attributes, or lists of them, that `tokenize` applies with `.sub`
    PREFILTERED_RULES = (
        "AGGRESSIVE_HYPHEN_SPLIT",
        "COMMA_SEPARATE_1",
        "COMMA_SEPARATE_2",
        "COMMA_SEPARATE_3",
        "ENGLISH_SPECIFIC_APOSTROPHE",
        "FR_IT_SPECIFIC_APOSTROPHE",
        "NON_SPECIFIC_APOSTROPHE",
        "TRAILING_DOT_APOSTROPHE",
    )

    def __init__(self, lang: str) -> None:
        super().__init__(lang=lang)
        for name in self.PREFILTERED_RULES:
            rules = getattr(self, name)
            rules = [_prefiltered(rule) for rule in rules] if isinstance(rules, list) else _prefiltered(rules)
            setattr(self, name, rules)
        pattern, replacement = self.DEDUPLICATE_SPACE
        if (pattern.pattern, replacement) == (r"\s+", " "):
            self.DEDUPLICATE_SPACE = (_Prefiltered(pattern, _has_whitespace_to_collapse), replacement)

    def handles_nonbreaking_prefixes(self, text: str) -> str:
        # sacremoses runs a regex on every token, but only a token ending in "." can change, and
        # what happens to the last token depends on it alone. When it is the only such token
        # (most sentences), sacremoses gets just that token.
        tokens = text.split()
        before_last = " ".join(tokens[:-1])
        # A token there ends in "." exactly when a "." ends the text or precedes a space.
        if not before_last or before_last.endswith(".") or ". " in before_last:
            return super().handles_nonbreaking_prefixes(text)
        return before_last + " " + super().handles_nonbreaking_prefixes(tokens[-1])


class Tokenizer:
    """Raw line -> tokenized line, and tokens -> detokenized line. Build once, call per line."""

    def __init__(self, settings: TokenizerSettings) -> None:
        self.settings = settings
        moses = settings.name == "moses"
        # sacremoses recompiles (via re's cache) each of its ~50 patterns per line; compiling
        # them once here gives the same result without that cost per line.
        self._normalizer = (
            [_normalization_rule(pattern, replacement) for pattern, replacement in MosesPunctNormalizer(lang=settings.lang).substitutions]
            if settings.normalize_punctuation
            else None
        )
        self._tokenizer = _MosesTokenizer(lang=settings.lang) if moses else None
        self._detokenizer = MosesDetokenizer(lang=settings.lang) if moses else None

    def normalize(self, line: str) -> str:
        """Control characters -> spaces (as Moses' recipes do), then Moses punctuation normalization.

        Spaces first, because the normalizer deletes a bare `\r`, gluing the words around it.
        """
        if self._normalizer is None:
            return line
        if not line.isprintable():  # a quick scan: printable text has no control characters
            line = line.translate(_CONTROL_TO_SPACE)
        for pattern, replacement, required in self._normalizer:
            if required in line:  # same order, same result: a rule skipped here would change nothing
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
