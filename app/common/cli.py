"""Build argparse flags from a dataclass whose fields carry docstrings (the docstring becomes --help)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from typing import Any

from app.common.errors import UserError


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


def _base_type(tp: Any) -> tuple[type, bool]:
    """(scalar type, optional?) of an annotation such as `int | None`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def parse_value(cls: type, name: str, raw: str) -> Any:
    """Convert a command-line string to the type of field `name` of dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    if name not in hints:
        known = ", ".join(f.name for f in dataclasses.fields(cls))
        raise UserError(f"unknown setting `{name}` for {cls.__name__}; known: {known}")
    tp, optional = _base_type(hints[name])
    if optional and raw.lower() in ("none", "null", ""):
        return None
    try:
        if tp is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        return tp(raw)
    except ValueError:
        raise UserError(f"`{name}` expects {tp.__name__}, got {raw!r}") from None


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One `--field-name` flag per dataclass field; defaults stay on the dataclass (flags default to None)."""
    docs = field_docs(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = docs.get(f.name, "") + (f" (default: {default})" if default is not None else "")
        group.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(), help=help_text)


def collect_flags(ns: argparse.Namespace, cls: type) -> dict[str, Any]:
    """Typed values of the flags the user actually gave."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        raw = getattr(ns, f.name, None)
        if raw is not None:
            out[f.name] = parse_value(cls, f.name, raw)
    return out


def parse_config(cls: type, argv: list[str] | None, description: str | None):
    """`cls` built from `--field` flags only (the entry points with no extra arguments); bad values -> UserError."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    add_dataclass_flags(p, cls)
    try:
        return cls(**collect_flags(p.parse_args(argv), cls))
    except ValueError as e:
        raise UserError(str(e)) from None
