"""Load a Hugging Face Hub dataset, failing fast (one line) when the Hub cannot be reached.

``cli`` sets short Hub timeouts before ``datasets`` is imported. Here, unless offline mode is on
(``HF_DATASETS_OFFLINE``/``HF_HUB_OFFLINE``, which read only the local cache), a TCP probe of the
Hub endpoint runs first, so a machine without network gets an answer in seconds instead of a
chain of HTTP retries. Behind an HTTP(S) proxy the probe is skipped and the timeouts apply.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from data_prep.errors import UserError

PROBE_TIMEOUT_S = 3.0
HUB_TIMEOUTS = {"HF_HUB_ETAG_TIMEOUT": "5", "HF_HUB_DOWNLOAD_TIMEOUT": "10"}


def set_hub_timeouts() -> None:
    """Must run before ``datasets``/``huggingface_hub`` are imported (they read these at import)."""
    for key, value in HUB_TIMEOUTS.items():
        os.environ.setdefault(key, value)


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def offline() -> bool:
    return _truthy("HF_DATASETS_OFFLINE") or _truthy("HF_HUB_OFFLINE")


def _probe(endpoint: str) -> str | None:
    """None if a TCP connection to the endpoint opens within PROBE_TIMEOUT_S, else the reason."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme != "http" else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"


def hub_records(name: str, config: str | None, split: str, text_field: str):
    """Stream ``(text | None, reason, row, ends document)`` from a Hub dataset (``datasets`` streaming mode:
    shards are read as they download, nothing is materialised)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if not offline():
        problem = _probe(endpoint)
        if problem is not None:
            raise UserError(
                f"--hub {name}: cannot reach the Hugging Face Hub ({problem}); connect to the network, "
                "or set HF_DATASETS_OFFLINE=1 to use a cached copy, or download the data and pass --input"
            )
    import datasets

    mode = " in offline mode (only the local cache is read)" if offline() else ""
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=True)
        row = 0
        for batch in ds.iter(batch_size=1000):
            if text_field not in batch:
                raise UserError(
                    f"hub dataset {name}: no column {text_field!r} (columns: {', '.join(batch)}); "
                    "pick one with --text-field"
                )
            for value in batch[text_field]:
                if value is None:
                    yield None, "null_text", row, True
                elif not isinstance(value, str):
                    yield None, "non_string_text", row, True
                else:
                    yield value, "", row, True
                row += 1
    except UserError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"--hub {name}: cannot load config={config} split={split}{mode}: {first}") from exc
