"""Every command line, built one way: from a typed dataclass, each field a `--field-name` flag whose --help
text is the docstring under the field, with `--config FILE`, `--version` and one-line errors.

One typing rule for flags and config files: `int`, `float`, `str`, `Path`, `bool`, `list[str]`,
`list[float]`, `X | None`, and `Literal[...]` (a closed set of choices, listed in --help). Booleans are
`--x` / `--no-x`; `--x true|false` (and `--x=false`) still work. A field's `metadata=flag(...)` spells its
flag another way (`--input` for `inputs`), makes it a positional argument, or takes exactly N values
(`--from KIND PATH`); a `FLAG_GROUPS` class attribute groups the flags in --help. `--config FILE` (YAML or
JSON, app.common.config_file) sets any field by its flag's name; precedence: the dataclass defaults < the
config file < the command line. Every bad value or unknown name is one UserError line naming the flag, or
the file, line and key; argparse's own errors are one line too (exit status 2 through
app.common.errors.exit_on_user_error).
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
from pathlib import Path
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
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", Path: "a path"}
    return names.get(tp, str(tp))


def parse_bool(raw: str, where: str) -> bool:
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise UserError(f"{where}: expects true or false, got {raw!r}")


def unknown_setting(cls: type, name: str, where: str) -> UserError:
    known = list(setting_names(cls))
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
    if tp is str or tp is Path:
        if not isinstance(value, str):
            raise bad
        return tp(value)
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


@dataclasses.dataclass(frozen=True, slots=True)
class Flag:
    """How a field appears on the command line when not as `--field-name VALUE` (see `flag`)."""

    name: str | None = None
    metavar: str | tuple[str, ...] | None = None
    positional: bool = False
    nargs: int | None = None
    default_text: str | None = None


def flag(**options: Any) -> dict[str, Flag]:
    """A field's `metadata`: `name` (the flag's spelling and its config-file key: `input` for `inputs`),
    `metavar`, `positional` (a list field: the arguments left over), `nargs` (a list field: exactly N values),
    `default_text` (the default as --help says it, for one computed at run time)."""
    return {"flag": Flag(**options)}


def _flag_spec(f: dataclasses.Field) -> Flag:
    return f.metadata.get("flag", Flag())


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def flag_for(cls: type, name: str) -> str:
    """The command-line spelling of field `name` of `cls` (`--vocab-size`; `--input` for `inputs`; `RUN`)."""
    spec = _flag_spec(next(f for f in dataclasses.fields(cls) if f.name == name))
    if spec.positional:
        return str(spec.metavar or name.upper())
    return flag_of(spec.name or name)


@functools.cache
def setting_names(cls: type) -> dict[str, str]:
    """{a config file's key (the flag's name, with `_` for `-`): the field it sets}."""
    return {(_flag_spec(f).name or f.name).replace("-", "_"): f.name for f in dataclasses.fields(cls)}


def parse_value(cls: type, name: str, raw: str, where: str | None = None) -> Any:
    """A command-line string as the type of field `name` of dataclass `cls` (unknown name -> UserError)."""
    if name not in field_types(cls):
        raise unknown_setting(cls, name, "")
    return coerce(cls, name, raw, where or flag_for(cls, name))


class FlagParser(argparse.ArgumentParser):
    """argparse with one-line errors (UserError) and the old `--flag true|false` form of booleans."""

    def __init__(self, description: str | None = None, epilog: str | None = None) -> None:
        super().__init__(
            prog=_prog(),
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


def _prog() -> str:
    """The command as the user typed it: `mlstm-prep`, `train.py`, `python -m data_prep` (Python 3.11's
    argparse would say `__main__.py`)."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    return f"python -m {argv0.parent.name}" if argv0.name == "__main__.py" else argv0.name


def _help_text(doc: str, flag: str, default: Any) -> str:
    if isinstance(default, bool):
        return f"{doc} (default: {flag if default else '--no-' + flag[2:]})"
    if default is None or default == "" or default == []:
        return doc
    return f"{doc} (default: {default})"


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per dataclass field (`flag_for`), in the groups of `cls.FLAG_GROUPS` ({title: field names},
    the rest under the class's name); defaults stay on the dataclass (flags default to None)."""
    titles = {name: title for title, names in getattr(cls, "FLAG_GROUPS", {}).items() for name in names}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(cls):
        title = titles.get(f.name, cls.__name__)
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        _add_flag(groups[title], cls, f)


def _add_flag(group: argparse._ArgumentGroup, cls: type, f: dataclasses.Field) -> None:
    tp, _ = field_types(cls)[f.name]
    spec, flag_name = _flag_spec(f), flag_for(cls, f.name)
    default = f.default if f.default is not dataclasses.MISSING else None
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        default = f.default_factory()  # type: ignore[misc]
    doc = field_docs(cls).get(f.name, "")
    shown = (
        f"{doc} (default: {spec.default_text})" if spec.default_text else _help_text(doc, flag_name, default)
    )
    kw: dict[str, Any] = dict(default=None, help=shown.replace("%", "%%"))  # argparse formats the help
    if spec.positional:
        group.add_argument(f.name, nargs="*", metavar=spec.metavar or f.name.upper(), **kw)
        return
    kw["dest"] = f.name
    if tp is bool:
        group.add_argument(flag_name, action=argparse.BooleanOptionalAction, **kw)
    elif typing.get_origin(tp) is list:
        group.add_argument(flag_name, nargs=spec.nargs or "+", metavar=spec.metavar or f.name.upper(), **kw)
    else:
        opts = choices(tp)
        metavar = "{" + ",".join(map(str, opts)) + "}" if opts else spec.metavar or f.name.upper()
        group.add_argument(flag_name, metavar=metavar, **kw)


def add_config_flag(parser: argparse.ArgumentParser, example: str = "") -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="YAML or JSON file of settings, each keyed by its flag's name without the leading dashes"
        + (f"; {example}" if example else "")
        + ". Flags given on the command line override it.",
    )


def collect_flags(ns: argparse.Namespace, cls: type) -> dict[str, Any]:
    """Typed values of the flags the user actually gave (a positional left empty was not given)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        raw = getattr(ns, f.name, None)
        if raw is not None and not (_flag_spec(f).positional and raw == []):
            out[f.name] = coerce(cls, f.name, raw, flag_for(cls, f.name))
    return out


def settings_from_mapping(cls: type, mapping: dict, cfg: ConfigFile, section: tuple[str, ...] = ()) -> dict:
    """Typed field values from a config file's mapping, keyed by the flags' names (`-` read as `_`); unknown
    keys refused."""
    out: dict[str, Any] = {}
    names = setting_names(cls)
    for key, value in mapping.items():
        setting = str(key).replace("-", "_")
        if setting not in names:
            raise unknown_setting(cls, setting, cfg.at(*section, str(key)) + ": ")
        out[names[setting]] = coerce(cls, names[setting], value, cfg.where(*section, str(key)))
    return out


def build(cls: type, values: dict[str, Any]):
    """`cls(**values)`, its validation errors (ValueError) turned into one UserError line."""
    try:
        return cls(**values)
    except ValueError as e:
        raise UserError(str(e)) from None


def command_parser(
    cls: type,
    description: str | None,
    *,
    epilog: str | None = None,
    launcher: bool = False,
    example: str = "",
) -> FlagParser:
    """The parser of a command whose settings are `cls`: `--version`, `--config FILE` (`example`: what a file
    may hold beyond the flags' names), one flag per field. `launcher=True` accepts the `--local_rank` the
    deepspeed launcher passes."""
    p = FlagParser(description=description, epilog=epilog)
    if launcher:
        p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)
    add_config_flag(p, example)
    add_dataclass_flags(p, cls)
    return p


def parse_config(
    cls: type,
    argv: list[str] | None,
    description: str | None,
    *,
    epilog: str | None = None,
    launcher: bool = False,
):
    """`cls` from `--config FILE` and the flags: every command's settings (app/train.py adds its DeepSpeed
    and model arguments to the same `command_parser`)."""
    ns = command_parser(cls, description, epilog=epilog, launcher=launcher).parse_args(argv)
    values: dict[str, Any] = {}
    if ns.config is not None:
        cfg = read_config_file(ns.config)
        values.update(settings_from_mapping(cls, cfg.data, cfg))
    values.update(collect_flags(ns, cls))
    return build(cls, values)
