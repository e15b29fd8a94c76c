"""Reading a run directory someone handed you: nothing in it may run code or reach outside it.

DeepSpeed's `load_checkpoint` unpickles every `*.pt` with `torch.load(weights_only=False)`, so a crafted
file would run code on resume. Two guards, both needed:
  1. `verify_tag_files` opens every `*.pt` of the tag first with `weights_only=True` and the allow-list
     below, and refuses symlinks that leave the run directory: a crafted file is refused before DeepSpeed
     sees the folder;
  2. `weights_only_loads` forces `weights_only=True` (same allow-list) on every `torch.load` made while
     DeepSpeed loads, so a file swapped in between the check and the load is refused as well.

The allow-list is what DeepSpeed's own files hold besides tensors and containers, found by saving a real
checkpoint with ds_configs/cpu_pp2_zero1.json (ZeRO-1; ZeRO-2 writes the same optimizer class) and
loading each file weights-only until it passed: the ZeRO optimizer's loss scaler, the ZeRO stage enum and
the tensor-fragment address record. Classes are rebuilt without running their code (no __reduce__).
"""

from __future__ import annotations

import contextlib
import functools
import pickle
from pathlib import Path

import torch

from app.common.errors import UserError
from app.common.files import check_tree_inside


def allowed_globals() -> list:
    """The classes DeepSpeed pickles into its checkpoint files (ZeRO 1/2 optimizer states)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    # DynamicLossScaler: what fp16 runs store in the same slot as LossScaler (a subclass of it).
    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def _refusal(e: Exception) -> str:
    """The one informative line of torch's weights-only refusal (which global it would have imported)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    why = next((ln for ln in lines if "GLOBAL" in ln or "Unsupported" in ln), lines[0] if lines else "")
    return why.split(" was not an allowed global")[0]


def load_weights_only(path: Path, allowed: list, holds: str, hint: str, mmap: bool = False) -> object:
    """`torch.load` weights-only on the CPU with `allowed` globals; a refusal or a damaged file is one line
    naming the file (`holds`: what the refused file holds, `hint`: what to do)."""
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:  # weights_only refuses the first global it does not allow
        raise UserError(f"{path}: refused to load: {holds} ({_refusal(e)}); {hint}") from None
    except Exception as e:  # damaged bytes: unpickling garbage raises anything (KeyError: 101 for b"hello")
        first = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
        first = (
            first if isinstance(e, (RuntimeError, OSError, ValueError)) else f"{type(e).__name__}: {first}"
        )
        raise UserError(f"{path}: unreadable or corrupt checkpoint file ({first})") from None


def safe_torch_load(path: Path) -> object:
    """`torch.load` weights-only with DeepSpeed's allow-list; a refusal is one line naming the file."""
    return load_weights_only(
        path,
        allowed_globals(),
        "it needs more than tensors and DeepSpeed's checkpoint types",
        "a checkpoint from elsewhere may be crafted to run code: re-create it or use a new --out",
    )


def verify_tag_files(tag_dir: Path, run_dir: Path) -> None:
    """Before DeepSpeed touches `tag_dir`: nothing links outside `run_dir`, every `*.pt` loads weights-only."""
    check_tree_inside(tag_dir, run_dir, "--resume")
    for p in sorted(tag_dir.rglob("*.pt")):
        safe_torch_load(p)


@contextlib.contextmanager
def weights_only_loads():
    """Every `torch.load` in this block runs weights-only with the allow-list, whatever its caller asks."""
    original = torch.load

    @functools.wraps(original)
    def forced(*args, **kwargs):
        kwargs["weights_only"] = True
        try:
            return original(*args, **kwargs)
        except pickle.UnpicklingError as e:
            where = args[0] if args else kwargs.get("f", "?")
            raise UserError(f"{where}: refused to load weights-only ({_refusal(e)})") from None

    with torch.serialization.safe_globals(allowed_globals()):
        torch.load = forced
        try:
            yield
        finally:
            torch.load = original
