"""`--config FILE`: a YAML or JSON mapping of settings, read safely, its errors naming the file and line.

YAML is read with `yaml.safe_load` (plain data only: no tags that build objects, nothing executed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from app.common.errors import UserError

SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """The mapping a config file holds, with its text kept to point errors at a line."""

    path: Path
    data: dict
    text: str

    def at(self, *keys: str) -> str:
        """`FILE line N` of the setting at key path `keys` (`FILE` alone when the line is not found)."""
        line = key_line(self.text, keys, self.path.suffix == ".json")
        return f"{self.path}{f' line {line}' if line else ''}"

    def where(self, *keys: str) -> str:
        """`FILE line N: `a.b`` (how errors about one setting start)."""
        return f"{self.at(*keys)}: `{'.'.join(keys)}`"


def read_config_file(path: str | Path, flag: str = "--config") -> ConfigFile:
    """The top-level mapping of a .yaml/.yml/.json file, or one UserError line (file, line, problem)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(
            f"{flag} {p}: is a directory, not a config file (a run's own is <run>/config.json; prepared data "
            "is given as --data)"
        )
    if p.suffix.lower() not in SUFFIXES:
        raise UserError(f"{flag} {p}: expected a .yaml, .yml or .json file")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{flag} {p}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{flag} {p}: cannot read ({e})") from None
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{flag} {p} line {e.lineno} column {e.colno}: invalid JSON: {e.msg}") from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise UserError(f"{flag} {p}{at}: invalid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{flag} {p}: expected a mapping of settings (key: value) at the top level")
    for key in data:
        if not isinstance(key, str):
            raise UserError(f"{flag} {p}: setting names must be strings, got {key!r}")
    return ConfigFile(path=p, data=data, text=text)


def key_line(text: str, keys: tuple[str, ...], is_json: bool) -> int | None:
    """1-based line of the last key of `keys`, looking for each key after the line of its parent."""
    lines = text.splitlines()
    start = 0
    found = None
    for key in keys:
        k = re.escape(key)
        pat = re.compile(rf'"{k}"\s*:' if is_json else rf"""^\s*(?:-\s+)?["']?{k}["']?\s*:""")
        found = next((i for i in range(start, len(lines)) if pat.search(lines[i])), None)
        if found is None:
            return None
        start = found
    return None if found is None else found + 1
