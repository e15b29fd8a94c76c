"""User errors: one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable


class UserError(Exception):
    """A problem with what the user asked for (flags, config files, data paths).

    The message is printed as one line; the process exits with status 2.
    """


def exit_on_user_error(fn: Callable[..., int]) -> Callable[..., int]:
    """Turn `UserError` (data_prep's errors included: they subclass it) into `error: ...` and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> int:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            msg = " ".join(str(e).split("\n"))
            print(f"error: {msg}", file=sys.stderr, flush=True)
            return 2

    return wrapper
