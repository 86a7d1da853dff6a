"""Reading a data-bin's (or run directory's) `meta.json`, checked field by field.

Every reader of meta.json goes through `read_meta`: a field of the wrong type (a list
where a language name belongs, a number for the BPE model's file name) is one error
line naming the file and the field, never a traceback further on. The fields are those
of docs/FORMATS.md; a field not listed there is kept as it is (newer files may add some).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nmt_cli.errors import NmtError
from nmt_cli.field_types import has_type
from nmt_cli.json_text import JSON_NAMES, json_object

# The layout of meta.json (docs/FORMATS.md); a file of another is refused, not misread.
META_FORMAT_VERSION = 1
NONE = type(None)
# Top-level fields and the JSON types each may have (a bool is not a number).
FIELDS: dict[str, tuple[type, ...]] = {
    "format_version": (int,), "source_lang": (str,), "target_lang": (str,), "joined_dictionary": (bool,),
    "tokenizer": (dict, NONE), "bpe": (dict, NONE), "dictionary_size": (dict,), "inputs": (dict,),
    "counts": (dict,), "cleaning": (dict,), "versions": (dict,), "fingerprint": (str,), "created": (str,),
    "imported_from": (dict,), "references": (dict,), "segmented_input": (str,),
}
TOKENIZER_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "lang": (str,), "normalize_punctuation": (bool,), "aggressive_dash_splits": (bool,),
    "escape": (bool,),
}
BPE_FIELDS: dict[str, tuple[type, ...]] = {
    "type": (str,), "model": (str,), "model_src": (str,), "model_tgt": (str,), "codes": (str,), "separator": (str,),
}
# The fields of `bpe` that name a file of the directory: a joint sentencepiece model, one per
# side (an imported Marian model's source.spm and target.spm), subword-nmt codes.
BPE_FILE_FIELDS = ("model", "model_src", "model_tgt", "codes")


def read_meta(directory: str | Path) -> dict[str, Any]:
    """The contents of `directory/meta.json`, or NmtError naming the file (and the field)."""
    path = Path(directory) / "meta.json"
    if not path.is_file():
        raise NmtError(f"no meta.json in {directory} (not a data-bin directory written by `nmt preprocess`?)")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise NmtError(f"cannot read {path}: {error.strerror or error}") from None
    meta = json_object(raw, str(path))
    _check_fields(meta, FIELDS, path, "")
    if meta.get("format_version", META_FORMAT_VERSION) != META_FORMAT_VERSION:
        raise NmtError(f"{path} has format_version {meta['format_version']}; this version of nmt reads "
                       f"format_version {META_FORMAT_VERSION} (a newer nmt wrote it?)")
    for name, fields in (("tokenizer", TOKENIZER_FIELDS), ("bpe", BPE_FIELDS)):
        if isinstance(meta.get(name), dict):
            _check_fields(meta[name], fields, path, f"{name}.")
    for name in ("source_lang", "target_lang"):
        if name in meta and not meta[name]:
            raise NmtError(f"{path}: field {name} is empty")
    return meta


def _check_fields(values: dict[str, Any], fields: dict[str, tuple[type, ...]], path: Path, prefix: str) -> None:
    for name, allowed in fields.items():
        if name in values and not has_type(values[name], allowed):
            expected = " or ".join(JSON_NAMES[t] for t in allowed)
            shown = json.dumps(values[name])
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise NmtError(f"{path}: field {prefix}{name} is {shown}, not {expected}")


def text_files(directory: str | Path, languages: Iterable[str] | None = None) -> list[Path]:
    """The files of a data-bin or run directory that turn text into ids and back: meta.json
    (when there is one), the dictionaries `dict.LANG.txt` of `languages` (None: every one
    the directory holds) and the BPE files meta.json names, whatever their names.

    Named files are listed whether they exist or not: a caller that reads them says which
    is missing."""
    directory = Path(directory)
    if languages is None:
        files = sorted(directory.glob("dict.*.txt"))
    else:
        files = [directory / f"dict.{lang}.txt" for lang in languages]
    if not (directory / "meta.json").is_file():  # a fairseq-preprocess data-bin: dictionaries only
        return list(dict.fromkeys(files))
    bpe = read_meta(directory).get("bpe") or {}
    named = [directory / bpe[field] for field in BPE_FILE_FIELDS if bpe.get(field)]
    return list(dict.fromkeys([directory / "meta.json", *files, *named]))
