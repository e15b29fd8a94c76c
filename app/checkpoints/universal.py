"""Resume under another layout (P, data parallelism, ZeRO stage) with the optimizer state.

DeepSpeed keeps Adam's state flattened per pipeline stage and per data-parallel rank, so a checkpoint
loads only into the layout that wrote it. DeepSpeed's universal checkpoint
(`deepspeed.checkpoint.ds_to_universal`) rewrites it per parameter (fp32 weight, exp_avg, exp_avg_sq,
step), and an engine configured with `checkpoint.load_universal` re-slices that for its own layout; both
support the pipeline engine. Rank 0 converts once into `checkpoints/universal/<tag>`, after the tag was
verified (every file weights-only loadable, app/checkpoints/safety.py), since the converter itself reads
with `weights_only=False`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
from pathlib import Path

from app.common.errors import UserError

LAYOUT_FREE = ("stages", "data_parallel", "zero_stage")  # what a universal checkpoint lets change
DONE = "CONVERTED"


def layout_changed(saved: dict, layout: dict) -> bool:
    return any(saved.get(k) != layout[k] for k in LAYOUT_FREE)


def describe(layout: dict) -> str:
    return f"P={layout.get('stages')} x DP={layout.get('data_parallel')} ZeRO-{layout.get('zero_stage')}"


def universal_dir(root: Path, tag: str) -> Path:
    return root / "universal" / tag


def convert(root: Path, tag: str) -> Path:
    """Rank 0: `root/tag` as a universal checkpoint (converted once; a half-written one is redone)."""
    from deepspeed.checkpoint import ds_to_universal

    out = universal_dir(root, tag)
    if (out / DONE).exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    args = argparse.Namespace(
        input_folder=str(root / tag),
        output_folder=str(out),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # our checkpoints carry no Megatron-style universal info: none is needed
    )
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):  # its prints, bars
            ds_to_universal.main(args)
    except (AssertionError, KeyError, ValueError, RuntimeError) as e:
        raise UserError(
            f"checkpoint {root / tag}: cannot convert it for another layout ({e.__class__.__name__}: {e}); "
            "resume with the layout that wrote it"
        ) from None
    (out / DONE).write_text("")
    return out
