"""Building a command's config from its arguments, as the command does when it runs."""

from __future__ import annotations

from typing import Any

from nmt_cli.cli import main
from nmt_cli.options import config_from_params


def config_of(name: str, args: list[str], config_class: type, **resolved: Any) -> Any:
    """The `config_class` that command `name` builds from `args`: inside its click context,
    which says which flags were given."""
    import click

    with main.get_command(click.Context(main), name).make_context(name, [str(a) for a in args]) as ctx:
        return config_from_params(config_class, ctx.params, **resolved)
