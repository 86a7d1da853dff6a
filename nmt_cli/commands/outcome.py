"""What the commands that write a directory as a whole (export, the imports) say at the end."""

from __future__ import annotations

from pathlib import Path

import click


def say_outcome(written: bool, out_dir: Path, already: str, wrote: str) -> bool:
    """On stderr: `wrote`, or that `out_dir` already held `already` and was left as it was.
    Returns `written`."""
    click.echo(wrote if written else f"{out_dir} already holds {already}; nothing written", err=True)
    return written
