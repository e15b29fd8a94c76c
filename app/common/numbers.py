"""The one check every numeric setting of every CLI gets: finite, and not below its floor.

Each config dataclass calls `check_numbers(self, ...)` first in its `__post_init__`, so a flag, a config
file key and a programmatic value are checked alike, and a new numeric field is checked without anyone
remembering to: `nan` and `inf` are refused always (`x < 0` is false for NaN, which then reaches
`torch.multinomial` or a schedule), and a negative value unless the field is declared `signed`. Finer
bounds (>= 1, fractions in [0, 1], what 0 means) stay in the dataclass's own checks, which follow.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

from app.common.cli import flag_for


def check_numbers(
    obj: Any, *, signed: tuple[str, ...] = (), name_of: Callable[[str], str] | None = None
) -> None:
    """Every int/float field of the dataclass `obj` (None skipped), and every number in a list field, finite,
    and >= 0 unless it is in `signed`. Raises ValueError naming the flag (`name_of(field)`, by default the
    field's flag)."""
    if name_of is None:
        name_of = functools.partial(flag_for, type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if not math.isfinite(v):
                raise ValueError(f"{name_of(f.name)}: expects a finite number, got {v}")
            if v < 0 and f.name not in signed:
                raise ValueError(f"{name_of(f.name)}: must not be negative, got {v}")
