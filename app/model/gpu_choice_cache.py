"""The on-disk cache of the GPU loop winners app/model/gpu_tuning.py measured: a later run starts without the
timing (Triton keeps the compiled kernels itself).

`$MLSTM_CACHE_DIR/gpu_loops.json` (default ~/.cache/mlstm-ds), one entry per (device name, its SM count, the
driver, torch, triton, the hash of the code that runs the loops, batch bucket, H, dtype, tf32 where it
applies): the forward and backward loops' rankings (names, fastest first) and whether the reference core won.
The SM count and the driver are in the key because a loop that launched on one setting may not on another
(a cooperative grid sized for 132 SMs under MPS with fewer, another GPU of the same name). A file that cannot
be read or holds nothing for the shape is timed afresh; an entry is checked before it is trusted
(gpu_tuning._cached); a file that cannot be written leaves the choice to this process, with a warning. The
file is replaced through a temporary file of a unique name in its own folder (never a predictable one another
user could plant). Ranks that write at once may lose each other's entries: a lost entry costs the next run a
timing, nothing else.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import torch

from app.model.gpu_tiles import interpreting

log = logging.getLogger(__name__)


def cache_path() -> Path:
    base = os.environ.get("MLSTM_CACHE_DIR") or Path.home() / ".cache" / "mlstm-ds"
    return Path(base) / "gpu_loops.json"


@functools.lru_cache(maxsize=1)
def driver_version() -> str:
    """The CUDA driver's version (cuDriverGetVersion, e.g. "13000"), or "none" where there is no driver."""
    for lib in ("libcuda.so.1", "libcuda.so"):
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        v = ctypes.c_int(0)
        if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return str(v.value)
    return "none"


def device_label(device) -> str:
    """The device's name, SM count and driver; Triton's interpreter is a device of its own."""
    device = torch.device(device)
    if interpreting():
        return "triton interpreter"
    if device.type != "cuda":
        return str(device)
    props = torch.cuda.get_device_properties(device)
    return f"{props.name} {props.multi_processor_count} SMs|driver {driver_version()}"


def _disk_key(B: int, H: int, dtype: torch.dtype, device, code_files: tuple[str, ...], variant: str) -> str:
    import triton

    code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in code_files)).hexdigest()[:16]
    label = device_label(device)
    return f"{label}|torch {torch.__version__}|triton {triton.__version__}|{code}|B{B} H{H} {dtype} {variant}".rstrip()


def load(
    B: int, H: int, dtype: torch.dtype, device, code_files: tuple[str, ...], variant: str = ""
) -> dict | None:
    """The stored entry for the shape ({"fwd", "bwd", "python"}), or None."""
    try:
        entry = json.loads(cache_path().read_text()).get(_disk_key(B, H, dtype, device, code_files, variant))
    except (OSError, ValueError, AttributeError):
        return None
    return entry if isinstance(entry, dict) else None


def store(
    B: int, H: int, dtype: torch.dtype, device, code_files: tuple[str, ...], entry: dict, variant: str = ""
) -> None:
    path = cache_path()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[_disk_key(B, H, dtype, device, code_files, variant)] = entry
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # O_EXCL, 0600
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError as e:  # a read-only home: the choice holds for this process only
        log.warning("could not write the GPU loop cache %s: %s", path, e)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
