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


def load_hub(name: str, config: str | None, split: str):
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if not offline():
        problem = _probe(endpoint)
        if problem is not None:
            raise UserError(
                f"--hub {name}: cannot reach the Hugging Face Hub ({problem}); connect to the network, "
                "or set HF_DATASETS_OFFLINE=1 to use a cached copy, or download the data and pass --input"
            )
    import datasets

    try:
        # The hub cache (not our per-run temp cache) so that downloads are reused across runs.
        return datasets.load_dataset(name, config, split=split)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        mode = " in offline mode (only the local cache is read)" if offline() else ""
        raise UserError(f"--hub {name}: cannot load config={config} split={split}{mode}: {first}") from exc
