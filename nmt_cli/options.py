"""Command-line options declared once, on the fields of the typed configs.

A config field made with `option(...)` carries its flag names, help and click details
in its metadata beside its default; `click_options(Config)` turns those fields into
click options, and `config_from_params(Config, params)` builds the config from what
click parsed. So a setting's name, type, default and help are written once, and the
config's `__post_init__` is the one place that checks it.

Adding an option: add a field with `option(...)` to the config the command builds.
click is imported only when options are generated, so the library does not need it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

_FLAG = "nmt_flag"
# `Flag.cli_default` when click's default is the field's own.
SAME = object()


@dataclasses.dataclass(frozen=True)
class Flag:
    """How one config field appears on the command line."""

    decls: tuple[str, ...]  # click's declarations: "--batch-size", "--max-sentences", "-b", "--x/--no-x"
    help: str = ""
    type: Any = None  # int, float or str; None: click's choice from the default
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None  # a callable is asked when options are built
    path: str | None = None  # "file", "dir" or "any": click.Path, for click's metavar and check
    metavar: str | None = None
    show_default: bool | None = None  # None: the command's setting
    required: bool = False
    multiple: bool = False
    is_flag: bool = False
    argument: bool = False  # a positional argument instead of an option
    # What click passes when the flag is absent, where that is not the field's default: a
    # value that `to_value` turns into it, or None for one the command resolves (translate's --device).
    cli_default: Any = SAME
    to_value: Callable[[Any], Any] | None = None  # click's value -> the field's value
    # The value of an option given without one (fairseq's `--remove-bpe` means `--remove-bpe '@@ '`).
    flag_value: Any = None


def option(*decls: str, default: Any = dataclasses.MISSING, **details: Any) -> Any:
    """A dataclass field with a default and the command-line option that sets it."""
    return dataclasses.field(default=default, metadata={_FLAG: Flag(decls, **details)})


def flag_option(*decls: str, **details: Any) -> Any:
    """A boolean field, False unless its flag is given."""
    return option(*decls, default=False, is_flag=True, **details)


def flag_of(field: dataclasses.Field) -> Flag | None:
    return field.metadata.get(_FLAG)


def nested_config(field: dataclasses.Field) -> type | None:
    """The config class of a field holding another config (TranslateConfig.decode), else None."""
    return type(field.default) if dataclasses.is_dataclass(field.default) else None


def flag_fields(config_class: type) -> list[tuple[dataclasses.Field, Flag]]:
    """Every field set by a flag, nested configs' fields included, in declaration order."""
    found: list[tuple[dataclasses.Field, Flag]] = []
    for field in dataclasses.fields(config_class):
        inner = nested_config(field)
        if inner is not None:
            found += flag_fields(inner)
        elif flag_of(field) is not None:
            found.append((field, flag_of(field)))
    return found


def click_options(config_class: type, overrides: bool = False) -> Callable[[Callable], Callable]:
    """A decorator adding one click option (or argument) per flag field of `config_class`.

    With `overrides`, every option defaults to None ("keep the preset's value"): for
    ModelConfig, whose defaults come from the `--arch` preset (see `overrides_from`).
    """
    import click

    params = []
    for field, flag in flag_fields(config_class):
        if flag.argument:
            params.append(click.argument(field.name, metavar=flag.metavar, type=_click_type(flag, field, False)))
            continue
        default = flag.cli_default if flag.cli_default is not SAME else field.default
        if default is dataclasses.MISSING:  # a field without a default: its flag is required
            default = None
        help_text = flag.help
        if overrides:
            default, help_text = None, f"{help_text} [default: the --arch preset's]"
        extra: dict[str, Any] = {}
        # Left out where click's own choice is the same (a switch --x/--no-x would pick False, not None).
        if not (default is None and "/" not in flag.decls[0]) and not (flag.is_flag and default is False):
            extra["default"] = default
        if flag.show_default is not None:
            extra["show_default"] = flag.show_default
        if flag.metavar is not None:
            extra["metavar"] = flag.metavar
        if flag.is_flag:
            extra["is_flag"] = True
        if flag.flag_value is not None:
            extra["is_flag"], extra["flag_value"] = False, flag.flag_value
        kind = _click_type(flag, field, overrides)
        if kind is not None:
            extra["type"] = kind
        params.append(click.option(*flag.decls, field.name, help=help_text, required=flag.required,
                                   multiple=flag.multiple, **extra))

    def decorate(func: Callable) -> Callable:
        for param in reversed(params):
            func = param(func)
        return func

    return decorate


def _click_type(flag: Flag, field: dataclasses.Field, overrides: bool) -> Any:
    """click's type for a flag; None lets click infer it from the default, as it does."""
    import click

    if flag.choices is not None:
        return click.Choice(list(flag.choices() if callable(flag.choices) else flag.choices))
    if flag.path is not None:
        return click.Path(file_okay=flag.path != "dir", dir_okay=flag.path != "file")
    if flag.type is not None:
        return flag.type
    if overrides and type(field.default) in (int, float):  # the default click sees is None
        return type(field.default)
    return None


def config_from_params(config_class: type, params: dict[str, Any], **resolved: Any) -> Any:
    """Build `config_class` from click's parsed `params` (keyed by field name).

    `resolved` gives the values of fields the command works out itself (e.g. a default that
    depends on the machine); the others come from their flags, through `Flag.to_value`.
    """
    values: dict[str, Any] = {}
    for field in dataclasses.fields(config_class):
        inner = nested_config(field)
        if field.name in resolved:
            values[field.name] = resolved[field.name]
        elif inner is not None:
            values[field.name] = config_from_params(inner, params)
        elif flag_of(field) is not None:
            flag, value = flag_of(field), params[field.name]
            values[field.name] = flag.to_value(value) if flag.to_value is not None else value
    return config_class(**values)


def overrides_from(config_class: type, params: dict[str, Any]) -> dict[str, Any]:
    """The fields whose options were given (not None), keyed by field name: for
    `click_options(config_class, overrides=True)`."""
    return {field.name: params[field.name] for field, _ in flag_fields(config_class)
            if params.get(field.name) is not None}
