"""Secrets out of copied configs: a DeepSpeed JSON may carry credentials (e.g. a monitor's api_key), and
the config is copied into config.json, every checkpoint and W&B. String values of secret-looking keys
are replaced; numbers and flags are left alone (a `max_tokens` count is no secret)."""

from __future__ import annotations

import re

REDACTED = "<redacted>"
_SECRET = re.compile(r"(key|token|secret|password|passwd|credential)", re.IGNORECASE)


def redact_secrets(obj: object) -> object:
    """A copy of `obj` with every string under a secret-looking key replaced by "<redacted>"."""
    if isinstance(obj, dict):
        return {
            k: REDACTED if isinstance(v, str) and _SECRET.search(str(k)) else redact_secrets(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [redact_secrets(v) for v in obj]
    return obj
