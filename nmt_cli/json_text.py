"""JSON text that must hold an object (meta.json, a Hugging Face config, a training log's
records): one error line for each way it can fail."""

from __future__ import annotations

import json
from typing import Any

from nmt_cli.errors import NmtError

# What each type json.loads returns is called in messages.
JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
              bool: "true or false", type(None): "null"}


def json_object(raw: bytes, place: str, holds: str | None = None) -> dict[str, Any]:
    """The object that the UTF-8 JSON text `raw` holds, or NmtError "{place}: ...", ending
    ", so not {holds}" where `holds` names what it should have been."""
    so_not = f", so not {holds}" if holds else ""
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise NmtError(f"{place}: invalid UTF-8 (byte {error.start}){so_not}") from None
    except json.JSONDecodeError as error:
        at = f"column {error.colno}" if error.lineno == 1 else f"line {error.lineno}, column {error.colno}"
        raise NmtError(f"{place}: not JSON ({error.msg}: {at}){so_not}") from None
    if not isinstance(value, dict):
        raise NmtError(f"{place}: not a JSON object (it holds {JSON_NAMES[type(value)]}){so_not}")
    return value


def lone_surrogate_at(text: str) -> int | None:
    """The index of the first lone surrogate in `text` (what JSON's "\\ud800" escapes give,
    which is no character: no UTF-8, no tokenizer takes it), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None
