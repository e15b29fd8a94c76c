"""Pip constraints for one end of the declared dependency ranges (used by launch/compat.sh).

    python launch/compat_pins.py oldest   # name==floor.* for every `name>=floor` in pyproject.toml
    python launch/compat_pins.py newest   # nothing pinned: pip takes the newest releases in range

`==floor.*` is the floor's release series (its newest patch: `ninja>=1.11` has no 1.11.0, `numpy>=1.26`
takes 1.26.4). The floors are read from [project] dependencies and optional-dependencies (the extras' too); torch is left
out (launch/compat.sh installs it first, from the CPU wheel index). Dependencies of dependencies are left
to pip, which picks what each pinned release declares (old transformers: an older huggingface-hub and
tokenizers). Python 3.10 has no tomllib: the requirement strings are read with a regular expression.
"""

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
SKIP = {"torch", "mlstm-ds"}
REQUIREMENT = re.compile(r'"([A-Za-z0-9][A-Za-z0-9_.-]*)(?:\[[^\]]*\])?\s*>=\s*([0-9][0-9A-Za-z.]*)')


def floors(text: str) -> dict[str, str]:
    """{name: lower bound} of the [project] tables (not [build-system] or the tools')."""
    project = re.search(r"^\[project\]$(.*?)^\[project\.scripts\]$", text, re.M | re.S)
    if project is None:
        raise SystemExit("error: pyproject.toml: no [project] ... [project.scripts] section")
    return {n.lower(): v for n, v in REQUIREMENT.findall(project.group(1)) if n.lower() not in SKIP}


def main(argv: list[str]) -> int:
    if argv not in (["oldest"], ["newest"]):
        print("usage: compat_pins.py oldest|newest", file=sys.stderr)
        return 2
    if argv == ["oldest"]:
        for name, floor in sorted(floors(PYPROJECT.read_text()).items()):
            print(f"{name}=={floor}.*")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
