"""The on-disk cache of the GPU loop winners app/model/gpu_tuning.py measured: a later run starts without the
timing (Triton keeps the compiled kernels itself).

`$MLSTM_CACHE_DIR/gpu_loops.json` (default ~/.cache/mlstm-ds), one entry per (device name, torch, triton, the
hash of the code that runs the loops, batch bucket, H, dtype, tf32 where it applies): the names of the forward and backward loops and
whether the reference core won. A file that cannot be read or holds nothing for the shape is timed afresh; one
that cannot be written leaves the choice to this process, with a warning. Ranks that write at once may lose
each other's entries: a lost entry costs the next run a timing, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from app.model import gpu_loops

log = logging.getLogger(__name__)


def cache_path() -> Path:
    base = os.environ.get("MLSTM_CACHE_DIR") or Path.home() / ".cache" / "mlstm-ds"
    return Path(base) / "gpu_loops.json"


def _disk_key(B: int, H: int, dtype: torch.dtype, device, code_files: tuple[str, ...], variant: str) -> str:
    import triton

    code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in code_files)).hexdigest()[:16]
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    return f"{name}|torch {torch.__version__}|triton {triton.__version__}|{code}|B{B} H{H} {dtype} {variant}".rstrip()


def load(
    B: int, H: int, dtype: torch.dtype, device, code_files: tuple[str, ...], variant: str = ""
) -> dict | None:
    """The stored entry for the shape ({"fwd", "bwd", "python"}), or None."""
    if gpu_loops.interpreting():
        return None
    try:
        entry = json.loads(cache_path().read_text()).get(_disk_key(B, H, dtype, device, code_files, variant))
    except (OSError, ValueError, AttributeError):
        return None
    return entry if isinstance(entry, dict) else None


def store(
    B: int, H: int, dtype: torch.dtype, device, code_files: tuple[str, ...], entry: dict, variant: str = ""
) -> None:
    if gpu_loops.interpreting():
        return
    path = cache_path()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[_disk_key(B, H, dtype, device, code_files, variant)] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError as e:  # a read-only home: the choice holds for this process only
        log.warning("could not write the GPU loop cache %s: %s", path, e)
