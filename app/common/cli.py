"""Command lines from typed dataclasses: each field is a `--field-name` flag, its docstring the --help text.

One typing rule for flags and config files: `int`, `float`, `str`, `bool`, `list[str]`, `list[float]`,
`X | None`, and `Literal[...]` (a closed set of choices, listed in --help). Booleans are `--x` / `--no-x`;
`--x true|false` (and `--x=false`) still work. `--config FILE` (YAML or JSON, app.common.config_file) sets any field;
precedence: the dataclass defaults < the config file < the command line. Every bad value or unknown name is
one UserError line naming the flag, or the file, line and key; argparse's own errors are one line too.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import functools
import inspect
import itertools
import sys
import textwrap
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal

from app.common.config_file import ConfigFile, read_config_file
from app.common.errors import UserError
from app.common.version import __version__

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under each field of a dataclass (`x: int = 1` then `\"\"\"doc\"\"\"`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in itertools.pairwise(body):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


@functools.cache
def field_types(cls: type) -> dict[str, tuple[Any, bool]]:
    """{field: (scalar type, optional?)} of a dataclass, `int | None` -> (int, True)."""
    hints = typing.get_type_hints(cls)
    return {f.name: _base_type(hints[f.name]) for f in dataclasses.fields(cls)}


def _base_type(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def choices(tp: Any) -> tuple | None:
    """The values of a `Literal[...]` type (None for any other type)."""
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


def describe_type(tp: Any) -> str:
    if (opts := choices(tp)) is not None:
        return "one of " + ", ".join(map(str, opts))
    if typing.get_origin(tp) is list:
        return "a list of numbers" if typing.get_args(tp) == (float,) else "a list of strings"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def parse_bool(raw: str, where: str) -> bool:
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise UserError(f"{where}: expects true or false, got {raw!r}")


def unknown_setting(cls: type, name: str, where: str) -> UserError:
    known = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean `{close[0]}`?" if close else f"known: {', '.join(known)}"
    return UserError(f"{where}unknown setting `{name}` for {cls.__name__} ({hint})")


def coerce(cls: type, name: str, value: Any, where: str) -> Any:
    """`value` (a command-line string, or a YAML/JSON value) as the type of field `name` of `cls`."""
    types_ = field_types(cls)
    if name not in types_:
        raise unknown_setting(cls, name, "")
    tp, optional = types_[name]
    bad = UserError(f"{where}: expects {describe_type(tp)}{' or null' if optional else ''}, got {value!r}")
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null", "")):
        if optional:
            return None
        raise bad
    if typing.get_origin(tp) is list:
        items = [value] if isinstance(value, (str, int, float)) else value
        if not isinstance(items, list):
            raise bad
        if typing.get_args(tp) == (float,):
            return [_number(v, bad) for v in items]
        if typing.get_args(tp) != (str,):
            raise TypeError(f"{cls.__name__}.{name}: only list[str] and list[float] fields are supported")
        if not all(isinstance(v, str) for v in items):
            raise bad
        return list(items)
    if (opts := choices(tp)) is not None:
        if value not in opts:
            raise bad
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return parse_bool(value, where)
        raise bad
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise bad
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if tp is int and isinstance(value, float):
        raise bad
    try:
        return tp(value)
    except (TypeError, ValueError, OverflowError):
        raise bad from None


def _number(value: Any, bad: UserError) -> float:
    """One item of a `list[float]` field (a flag's string or a config file's number)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise bad
    try:
        return float(value)
    except (ValueError, OverflowError):  # a word; an integer too large for a float
        raise bad from None


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_value(cls: type, name: str, raw: str, where: str | None = None) -> Any:
    """A command-line string as the type of field `name` of dataclass `cls` (unknown name -> UserError)."""
    if name not in field_types(cls):
        raise unknown_setting(cls, name, "")
    return coerce(cls, name, raw, where or flag_of(name))


class FlagParser(argparse.ArgumentParser):
    """argparse with one-line errors (UserError) and the old `--flag true|false` form of booleans."""

    def __init__(self, description: str | None = None, epilog: str | None = None) -> None:
        super().__init__(
            description=description,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )
        self.add_argument("--version", action="version", version=f"%(prog)s {__version__}")

    def error(self, message: str) -> typing.NoReturn:
        raise UserError(f"{message} (see --help)")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._normalise_booleans(argv), namespace)

    def _normalise_booleans(self, argv: list[str]) -> list[str]:
        """`--x true`, `--x=false` -> `--x`, `--no-x`: the spellings scripts used before `--no-x` existed."""
        flags = {
            a.option_strings[0]
            for a in self._actions
            if isinstance(a, argparse.BooleanOptionalAction) and a.option_strings
        }
        out: list[str] = []
        i = 0
        while i < len(argv):
            arg = argv[i]
            if arg == "--":
                out += argv[i:]
                break
            name, eq, raw = arg.partition("=")
            if name in flags:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                if not eq and nxt is not None and not nxt.startswith("-") and "=" not in nxt:
                    raw, eq, i = nxt, "=", i + 1  # `--x VALUE`: never a positional (those are KEY=VALUE)
                if eq:
                    arg = name if parse_bool(raw, name) else "--no-" + name[2:]
            out.append(arg)
            i += 1
        return out


def _help_text(doc: str, flag: str, default: Any) -> str:
    if isinstance(default, bool):
        return f"{doc} (default: {flag if default else '--no-' + flag[2:]})"
    if default is None or default == "" or default == []:
        return doc
    return f"{doc} (default: {default})"


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One `--field-name` flag per dataclass field; defaults stay on the dataclass (flags default to None)."""
    docs = field_docs(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        tp, _ = field_types(cls)[f.name]
        flag = flag_of(f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        help_text = _help_text(docs.get(f.name, ""), flag, default).replace("%", "%%")  # argparse formats it
        kw: dict[str, Any] = dict(dest=f.name, default=None, help=help_text)
        if tp is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif typing.get_origin(tp) is list:
            group.add_argument(flag, nargs="+", metavar=f.name.upper(), **kw)
        else:
            opts = choices(tp)
            metavar = "{" + ",".join(map(str, opts)) + "}" if opts else f.name.upper()
            group.add_argument(flag, metavar=metavar, **kw)


def add_config_flag(parser: argparse.ArgumentParser, example: str = "") -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help=f"YAML or JSON file of settings (the flags' names with underscores{': ' + example if example else ')'}"
        ". Flags given on the command line override it.",
    )


def collect_flags(ns: argparse.Namespace, cls: type) -> dict[str, Any]:
    """Typed values of the flags the user actually gave."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        raw = getattr(ns, f.name, None)
        if raw is not None:
            out[f.name] = coerce(cls, f.name, raw, flag_of(f.name))
    return out


def settings_from_mapping(cls: type, mapping: dict, cfg: ConfigFile, section: tuple[str, ...] = ()) -> dict:
    """Typed field values from a config file's mapping (`-` in names read as `_`); unknown keys refused."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = str(key).replace("-", "_")
        if name not in field_types(cls):
            raise unknown_setting(cls, name, cfg.at(*section, str(key)) + ": ")
        out[name] = coerce(cls, name, value, cfg.where(*section, str(key)))
    return out


def build(cls: type, values: dict[str, Any]):
    """`cls(**values)`, its validation errors (ValueError) turned into one UserError line."""
    try:
        return cls(**values)
    except ValueError as e:
        raise UserError(str(e)) from None


def parse_config(cls: type, argv: list[str] | None, description: str | None, *, launcher: bool = False):
    """`cls` from `--config FILE` and `--field` flags (entry points with no other arguments).

    `launcher=True` accepts the `--local_rank` the deepspeed launcher passes."""
    p = FlagParser(description=description)
    if launcher:
        p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)
    add_config_flag(p)
    add_dataclass_flags(p, cls)
    ns = p.parse_args(argv)
    values: dict[str, Any] = {}
    if ns.config is not None:
        cfg = read_config_file(ns.config)
        values.update(settings_from_mapping(cls, cfg.data, cfg))
    values.update(collect_flags(ns, cls))
    return build(cls, values)
