"""W&B model artifacts: the newest checkpoint, exported (weights, config, tokenizer), logged by rank 0.

An export rather than the checkpoint itself: a checkpoint also holds the optimizer state (two Adam moments
and, in bf16, an fp32 master copy: three to four times the weights) in a layout-specific set of files,
while an export is the float32 weights alone in one safetensors file and loads anywhere
(`app/generate.py --checkpoint <artifact folder>`). It is written from the checkpoint just committed, by the
same consolidation `app/export.py` uses, into a temporary folder under the run that W&B copies from.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from app.checkpoints import training as ckpt
from app.checkpoints.export_format import write_export
from app.checkpoints.loader import open_source
from app.training.tracking import Tracker


def export_checkpoint(tag_dir: Path, out: Path) -> dict:
    """Write the export of checkpoint `tag_dir` to `out`; returns its config (the artifact's metadata)."""
    src = open_source(tag_dir)
    sd = src.state_dict()
    tok = src.tokenizer()
    config = {
        "model_config": src.model_cfg.to_dict(),
        "tokenizer": {**tok.meta(), **src.tokenizer_meta},
        "step": src.step,
        "trained_layout": src.trained_layout,
        "source": f"{tag_dir.parent.name}/{tag_dir.name}",  # relative: the artifact travels
        "parameters": sum(v.numel() for v in sd.values()),
    }
    write_export(out, sd, config, src.tokenizer_path)
    return config


def log_model_artifact(tracker: Tracker, run_dir: Path, tag_dir: Path, aliases: list[str]) -> bool:
    """Export `tag_dir` and log it as the next version of the run's model artifact. Never fatal."""
    if tracker.run is None:
        return False
    tmp = Path(tempfile.mkdtemp(prefix=".artifact-", dir=run_dir))
    try:
        meta = export_checkpoint(tag_dir, tmp)
        return tracker.log_model(tmp, aliases, {k: meta[k] for k in ("step", "parameters", "trained_layout")})
    except Exception as e:  # an unreadable checkpoint here is for resume to report, not for training to die
        tracker.log.warning(f"model artifact of {tag_dir.name} skipped ({e.__class__.__name__}: {e})")
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def log_saved_checkpoint(
    tracker: Tracker, run_dir: Path, root: Path, tag: str, *, step: int, mode: str, last: bool, log
) -> None:
    """Rank 0: checkpoint `tag`, just saved, as the next model artifact under --wandb-artifacts `mode`
    (none; final: the run's last save only; saves: every one), with the aliases W&B moves to it."""
    if mode == "none" or (mode == "final" and not last) or tracker.run is None:
        return
    best = ckpt.best_tag(root) == tag  # the lowest validation loss so far: W&B moves "best" here
    aliases = [f"step-{step}", "latest", *(["final"] if last else []), *(["best"] if best else [])]
    if log_model_artifact(tracker, run_dir, root / tag, aliases):
        log.info(f"W&B model artifact model-{tracker.run_id} ({', '.join(aliases)}) from {tag}")
