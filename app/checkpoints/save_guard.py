"""A checkpoint save that every rank agrees on: a failure on any rank (disk full, quota, I/O error) stops
the run with one line from rank 0, the half-written checkpoint removed and the previous one intact.

Without the agreement a rank whose write failed dies with a traceback while the others wait in the next
barrier until the process-group timeout.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from app.checkpoints.training import LATEST
from app.common.errors import UserError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_LOW_SPACE = 64 << 20  # below this after a failed write, the disk being full is the cause


def describe(e: BaseException, root: Path) -> str:
    """What went wrong, in words a user acts on. torch.save reports a full disk as an internal error
    ('unexpected pos 128 vs 0', 'file write failed'), so the free space decides, measured before the
    partial save is removed."""
    if isinstance(e, OSError) and e.errno in _NO_SPACE:
        return f"no space left on the device holding {root}"
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = -1
    if 0 <= free < _LOW_SPACE:
        return f"no space left on the device holding {root} ({free >> 10} KiB free)"
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{e.__class__.__name__}: {first[:200]}"


def deepspeed_save(ds_engine, root: Path, tag: str) -> None:
    """DeepSpeed's save_checkpoint, made safe to fail on one rank.

    It writes between two barriers; a rank whose write raises skips the closing one while the ranks that
    succeeded wait in it. Joining that barrier before re-raising keeps every rank's collectives in step,
    so run_on_all_ranks can then agree on the outcome.
    """
    try:
        ds_engine.save_checkpoint(str(root), tag=tag, save_latest=False)
    except Exception:
        dist.barrier()
        raise


def run_on_all_ranks(step: Callable[[], None], root: Path, tag: str, device: torch.device) -> None:
    """Run this rank's part of a save, then agree with every rank on whether all parts succeeded.

    On failure anywhere: rank 0 removes the partial `tag` directory and raises UserError (printed as one
    line, exit 2); the other ranks exit 2 silently.
    """
    error = None
    try:
        step()
    except Exception as e:  # any rank's failure must reach every rank, or they wait in the next collective
        error = describe(e, root)
    failed = torch.tensor([0.0 if error is None else 1.0], device=device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item() == 0:
        return
    reasons: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(reasons, error)
    if dist.get_rank() != 0:
        raise SystemExit(2)
    shutil.rmtree(root / tag, ignore_errors=True)  # frees the space the partial save took
    rank, reason = next((r, m) for r, m in enumerate(reasons) if m is not None)
    previous = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else "none"
    raise UserError(
        f"saving checkpoint {root / tag} failed on rank {rank}: {reason}; the previous checkpoint "
        f"({previous}) is intact and a rerun resumes from it once the cause is fixed"
    )
