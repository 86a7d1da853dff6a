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
import functools
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
    # fairseq's list form taken too, with one item ("[0.0005]"): for its flags that take one value per epoch.
    one_item_list: bool = False
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None  # a callable is asked when options are built
    path: str | None = None  # "file", "dir" or "any": click.Path, for click's metavar and check
    metavar: str | None = None
    show_default: bool | None = None  # None: the command's setting
    required: bool = False
    multiple: bool = False
    is_flag: bool = False
    flag_value: Any = None  # the value of an option given without one (fairseq's `--remove-bpe`)
    argument: bool = False  # a positional argument instead of an option
    # What click passes when the flag is absent, where that is not the field's default: a
    # value that `to_value` turns into it, or None for one the command resolves (translate's --device).
    cli_default: Any = SAME
    to_value: Callable[[Any], Any] | None = None  # click's value -> the field's value
    # click's value -> why nmt refuses it (Refused), or None: e.g. --arch of a model family nmt does not build.
    refuse: Callable[[Any], Refused | None] | None = None


def option(*decls: str, default: Any = dataclasses.MISSING, **details: Any) -> Any:
    """A dataclass field with a default and the command-line option that sets it."""
    return dataclasses.field(default=default, metadata={_FLAG: Flag(decls, **details)})


def flag_option(*decls: str, **details: Any) -> Any:
    """A boolean field, False unless its flag is given."""
    return option(*decls, default=False, is_flag=True, **details)


def auto_switch(decl: str, help: str, auto: str) -> Any:
    """A `--x/--no-x` switch that is None when neither is given: the command decides then.

    `auto` says what it decides, for the help's "[default: ...]".
    """
    return option(f"{decl}/--no-{decl.removeprefix('--')}", default=None, help=f"{help} [default: {auto}].")


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
            many = {"nargs": -1, "required": True} if flag.multiple else {}  # one or more
            params.append(click.argument(field.name, metavar=flag.metavar, type=_click_type(flag, field, False), **many))
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
        if flag.refuse is not None:
            decl = flag.decls[0].split("/")[0]
            extra["callback"] = _refusing_callback(flag.refuse, lambda value, refused, decl=decl:
                                                   f"{decl} {value}: {refused.reason}")
        params.append(click.option(*flag.decls, field.name, help=help_text, required=flag.required,
                                   multiple=flag.multiple, **extra))

    params += _alias_params(config_class)

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
        return _path_type()(file_okay=flag.path != "dir", dir_okay=flag.path != "file")
    if flag.one_item_list:
        return _one_item_list_type()(flag.type)
    if flag.type is not None:
        return flag.type
    if overrides and type(field.default) in (int, float):  # the default click sees is None
        return type(field.default)
    return None


@functools.cache
def _path_type() -> type:
    """click.Path, refusing a NUL byte in one usage line (click's own check lets os.stat
    raise ValueError on it, a traceback)."""
    import click

    class Path(click.Path):
        def convert(self, value, param, ctx):
            if isinstance(value, str) and "\x00" in value:
                self.fail(f"{value!r} holds a NUL byte, which no path can", param, ctx)
            return super().convert(value, param, ctx)

    return Path


@functools.cache
def _one_item_list_type() -> type:
    """A click type taking a value bare or as fairseq writes a list of one, "[0.0005]"; a list of
    several (fairseq's one value per epoch, "[0.001, 0.0005]" or "0.001,0.0005") is refused by name."""
    import click

    class OneItemList(click.ParamType):
        def __init__(self, item_type: Any) -> None:
            self.item_type = click.types.convert_type(item_type)
            self.name = self.item_type.name

        def convert(self, value, param, ctx):
            if isinstance(value, str):
                text = value.strip()
                listed = text[1:-1] if text[:1] + text[-1:] == "[]" else text
                items = [item for item in listed.split(",") if item.strip()]
                if len(items) > 1:
                    raise refused_option_class()(f"{param.opts[0]} {value}: nmt takes one value for the whole run, "
                                                 "not fairseq's one per epoch")
                value = items[0].strip() if items else text
            return self.item_type.convert(value, param, ctx)

    return OneItemList


def config_from_params(config_class: type, params: dict[str, Any], **resolved: Any) -> Any:
    """Build `config_class` from click's parsed `params` (keyed by field name), inside the
    running command's click context.

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
    return config_class(**apply_aliases(config_class, params, values, given_params()))


def given_params() -> frozenset[str]:
    """The parameters the running click command was given, on its command line or by an
    environment variable: one given its default value is given all the same."""
    import click
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return frozenset(name for name in ctx.params
                     if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT))


def overrides_from(config_class: type, params: dict[str, Any]) -> dict[str, Any]:
    """The fields whose options were given (not None), keyed by field name: for
    `click_options(config_class, overrides=True)`."""
    given = {field.name: params[field.name] for field, _ in flag_fields(config_class)
             if params.get(field.name) is not None}
    return apply_aliases(config_class, params, given, given_params())


# --- other programs' flags (fairseq's) -------------------------------------------------
#
# A fairseq user's command line names settings nmt holds under its own flags (`--fp16` is
# `--precision fp16`), or asks for something nmt does not do (`--optimizer sgd`). Such a
# flag is an `Alias` in the `ALIASES` of the config that holds the settings: it is a
# click option (or argument) of the command, but no field; `sets(value)` says which fields
# it sets, or why nmt refuses it. A refusal stops the command line while click parses it,
# with one line and click's usage exit status 2; never is a flag silently ignored.


@dataclasses.dataclass(frozen=True)
class Refused:
    """Why nmt refuses an alias's value: one line saying what nmt does instead."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Alias:
    """A flag of another program that stands for settings of nmt's own fields."""

    decl: str  # "--fp16", "--stop-time-hours"; a name without dashes for a positional argument
    help: str
    # The flag's value (True for a switch) -> {field name: value}, or Refused.
    sets: Callable[[Any], dict[str, Any] | Refused]
    type: Any = None  # None: a switch that takes no value
    metavar: str | None = None
    argument: bool = False  # an optional positional argument (fairseq's data directory)
    # Another alias this one only makes sense with (nmt's one setting for two of fairseq's).
    together_with: str | None = None

    @property
    def shown_name(self) -> str:
        """How messages name it: the flag, or a positional argument's metavar."""
        return (self.metavar or self.decl).strip("[]") if self.argument else self.decl

    @property
    def param_name(self) -> str:
        return "alias_" + self.decl.lstrip("-").replace("-", "_")

    def settings(self, value: Any) -> dict[str, Any] | None:
        """The fields this alias sets for click's `value`; None when it was not given."""
        if value is None or value is False:
            return None
        result = self.sets(value)
        if isinstance(result, Refused):  # click's callback refused it already; library callers get the same line
            from nmt_cli.errors import NmtError

            raise NmtError(self.refusal_line(value, result))
        return result

    def refused(self, value: Any) -> Refused | None:
        """Why click's `value` is refused, or None (not given, or accepted)."""
        result = None if value is None or value is False else self.sets(value)
        return result if isinstance(result, Refused) else None

    def refusal_line(self, value: Any, refused: Refused) -> str:
        shown = self.decl if value is True else f"{self.decl} {value}"
        return f"{shown}: {refused.reason}"


def switch_alias(decl: str, sets: dict[str, Any], help: str) -> Alias:
    """A switch standing for fixed settings: `--fp16` -> {"precision": "fp16"}."""
    return Alias(decl, help, lambda _: dict(sets))


def value_alias(decl: str, type: Any, sets: Callable[[Any], dict[str, Any] | Refused], help: str,
                metavar: str | None = None) -> Alias:
    """A flag whose value becomes settings: `--stop-time-hours H` -> {"max_time": H * 3600}."""
    return Alias(decl, help, sets, type=type, metavar=metavar)


def choice_alias(decl: str, accepted: dict[str, dict[str, Any]], refusal: str, help: str) -> Alias:
    """A flag naming one of several things: the `accepted` ones become settings, any other
    value is refused with `refusal` (what nmt does instead)."""
    def sets(value: str) -> dict[str, Any] | Refused:
        return dict(accepted[value]) if value in accepted else Refused(refusal)

    return Alias(decl, help, sets, type=str, metavar="|".join(accepted))


def no_effect_alias(decl: str, help: str, type: Any = None) -> Alias:
    """A flag accepted because it changes nothing nmt computes (`--num-workers` of a loader nmt
    does not have); `help` says what nmt does instead."""
    return Alias(decl, help, lambda _: {}, type=type)


def refused_alias(decl: str, reason: str, type: Any = None) -> Alias:
    """A flag nmt never takes, whatever its value; `reason` says what nmt does instead."""
    return Alias(decl, f"Refused: {reason}", lambda _: Refused(reason), type=type)


def aliases_of(config_class: type) -> tuple[Alias, ...]:
    """The aliases of `config_class` and of the configs nested in it."""
    found = tuple(getattr(config_class, "ALIASES", ()))
    for field in dataclasses.fields(config_class):
        inner = nested_config(field)
        if inner is not None:
            found += aliases_of(inner)
    return found


def _refusing_callback(refuse: Callable[[Any], Refused | None], line: Callable[[Any, Refused], str]) -> Callable:
    """A click callback stopping the command line, with `line`'s message, on a value `refuse` refuses."""
    def check(ctx: Any, param: Any, value: Any) -> Any:
        refused = refuse(value) if value is not None else None
        if refused is not None:
            raise refused_option_class()(line(value, refused))
        return value
    return check


def _alias_params(config_class: type) -> list[Callable[[Callable], Callable]]:
    import click

    params = []
    for alias in aliases_of(config_class):  # nested configs' too
        refuse = _refusing_callback(alias.refused, alias.refusal_line)
        if alias.argument:
            params.append(click.argument(alias.param_name, required=False, metavar=alias.metavar,
                                         type=alias.type, callback=refuse))
        elif alias.type is None:
            params.append(click.option(alias.decl, alias.param_name, is_flag=True, default=False, help=alias.help,
                                       callback=refuse))
        else:
            params.append(click.option(alias.decl, alias.param_name, type=alias.type, default=None, help=alias.help,
                                       metavar=alias.metavar, show_default=False, callback=refuse))
    return params


@functools.cache
def refused_option_class() -> type:
    import click

    class RefusedOption(click.UsageError):
        """A refused flag or value: one `error:` line, click's usage exit status (2)."""

        def show(self, file: Any = None) -> None:
            click.echo(f"error: {self.format_message()}", err=True)

    return RefusedOption


def apply_aliases(config_class: type, params: dict[str, Any], values: dict[str, Any],
                  given: frozenset[str]) -> dict[str, Any]:
    """`values` (fields of `config_class`) with the settings of the aliases given in `params`.

    An alias may not contradict a flag given beside it (`--fp16 --precision bf16`): a field
    whose flag is in `given` with another value than the alias's is an error, whatever the
    value (`--fp16 --precision fp32` too).
    """
    from nmt_cli.errors import NmtError

    set_by: dict[str, str] = {}
    aliases = {alias.decl: alias for alias in getattr(config_class, "ALIASES", ())}
    for alias in aliases.values():
        settings = alias.settings(params.get(alias.param_name))
        partner = aliases.get(alias.together_with or "")
        if settings is not None and partner is not None and params.get(partner.param_name) in (None, False):
            names = ", ".join(f"--{name.replace('_', '-')}" for name in settings)
            raise NmtError(f"{alias.decl} needs {partner.decl} too: nmt has one setting for both ({names})")
        for name, value in (settings or {}).items():
            current = values.get(name)
            if name in set_by and current != value:
                raise NmtError(f"{alias.shown_name} and {set_by[name]} ask for different --{name.replace('_', '-')}")
            if name in given and current != value and name not in set_by:
                raise NmtError(f"{alias.shown_name} means --{name.replace('_', '-')} {_shown(value)}, "
                               f"but --{name.replace('_', '-')} {_shown(current)} is given too")
            values[name], set_by[name] = value, alias.shown_name
    return values


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
