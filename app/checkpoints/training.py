"""Checkpoints: DeepSpeed's own files plus the app's state, committed only once every rank has written.

Layout of `<run>/checkpoints/`:
    step_00000100/            one tag per save
        (DeepSpeed files)     model/optimizer states as DeepSpeed writes them for this layout
        rng_rank{r}.json      python/numpy/torch RNG states of rank r (JSON: nothing to unpickle)
        app_state.json        step, sampler position, resolved configs, tokenizer meta (rank 0)
        tokenizer.model       copy of the data's SentencePiece model (absent for byte tokenizer)
        COMPLETE              manifest {file: size}, written last by rank 0 after a barrier
    latest                    tag of the newest COMPLETE checkpoint, replaced atomically

A crash during a save leaves a tag without COMPLETE; it is ignored on resume and pruned later.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from app.common.errors import UserError
from app.common.files import atomic_write, read_json_object

CHECKPOINT_FORMAT = 1
COMPLETE = "COMPLETE"
LATEST = "latest"
_TAG = re.compile(r"^step_(\d{8})$")


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def _write_json_atomic(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True))


# ---------------------------------------------------------------- RNG state, as JSON


def rng_state() -> dict:
    py = random.getstate()
    npy = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [npy[0], npy[1].tolist(), int(npy[2]), int(npy[3]), float(npy[4])],
        "torch": torch.get_rng_state().tolist(),
    }


def set_rng_state(state: dict) -> None:
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


# ---------------------------------------------------------------- finding checkpoints


def is_complete(ckpt_dir: Path) -> bool:
    """A checkpoint counts only with its manifest, and every file in it present at its recorded size."""
    manifest = ckpt_dir / COMPLETE
    if not manifest.is_file():
        return False
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError):
        return False
    for name, size in files.items():
        f = ckpt_dir / name
        if not f.is_file() or f.stat().st_size != size:
            return False
    return True


def complete_tags(root: Path) -> list[str]:
    """Tags of complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    tags = sorted(p.name for p in root.iterdir() if p.is_dir() and _TAG.match(p.name))
    return [t for t in tags if is_complete(root / t)]


def find_resume_tag(root: Path, requested: str | None) -> str | None:
    """The tag to resume from: the requested one (must exist and be complete), else `latest`, else none."""
    if requested:
        if not (root / requested).is_dir():
            have = ", ".join(complete_tags(root)) or "none"
            raise UserError(
                f"--resume {requested}: no such checkpoint in {root} (complete checkpoints: {have})"
            )
        if not is_complete(root / requested):
            raise UserError(
                f"--resume {requested}: checkpoint {root / requested} is incomplete (a save was interrupted)"
            )
        return requested
    latest = root / LATEST
    if latest.is_file():
        tag = latest.read_text().strip()
        if is_complete(root / tag):
            return tag
    tags = complete_tags(root)
    return tags[-1] if tags else None


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A run directory, its checkpoints/ folder, or one tag's folder -> the complete checkpoint folder."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"--checkpoint: no such file or directory: {p}")
    if (p / COMPLETE).exists() or _TAG.match(p.name):
        if not is_complete(p):
            raise UserError(
                f"--checkpoint: {p} is incomplete or corrupt (its manifest does not match its files)"
            )
        return p
    root = p / "checkpoints" if (p / "checkpoints").is_dir() else p
    tag = find_resume_tag(root, None)
    if tag is None:
        raise UserError(f"--checkpoint: no complete checkpoint found under {p}")
    return root / tag


# ---------------------------------------------------------------- saving


def write_rank_state(ckpt_dir: Path, rank: int) -> None:
    _write_json_atomic(ckpt_dir / f"rng_rank{rank}.json", rng_state())


def commit(root: Path, tag: str, app_state: dict, world_size: int, tokenizer_path: Path | None) -> None:
    """Rank 0, after a barrier that follows every rank's writes: verify, write the manifest, move `latest`."""
    d = root / tag
    missing = [f"rng_rank{r}.json" for r in range(world_size) if not (d / f"rng_rank{r}.json").is_file()]
    if not any(d.glob("*model_states.pt")):
        missing.append("*model_states.pt")
    if missing:
        raise RuntimeError(f"checkpoint {d} is missing {', '.join(missing)} after every rank reported done")
    if tokenizer_path is not None:
        shutil.copyfile(tokenizer_path, d / "tokenizer.model")
    _write_json_atomic(d / "app_state.json", {"checkpoint_format": CHECKPOINT_FORMAT, **app_state})
    files = {
        str(p.relative_to(d)): p.stat().st_size
        for p in sorted(d.rglob("*"))
        if p.is_file() and p.name != COMPLETE
    }
    _write_json_atomic(d / COMPLETE, {"files": files})
    # Only now does this checkpoint become the one a restart uses.
    atomic_write(root / LATEST, tag)


def prune(root: Path, keep_last: int) -> list[str]:
    """Delete all but the newest `keep_last` complete checkpoints and any interrupted saves.

    Never deletes the tag `latest` names. Runs on rank 0 after the commit barrier, so no rank is writing.
    """
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    complete = complete_tags(root)
    keep = set(complete[-keep_last:]) | ({latest} if latest else set())
    removed = []
    for p in sorted(root.iterdir()):
        if p.is_dir() and _TAG.match(p.name) and p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return removed


def read_app_state(ckpt_dir: Path) -> dict:
    p = ckpt_dir / "app_state.json"
    state = read_json_object(p, "checkpoint state")
    if state.get("checkpoint_format") != CHECKPOINT_FORMAT:
        raise UserError(
            f"{p}: checkpoint format {state.get('checkpoint_format')!r}, this version reads {CHECKPOINT_FORMAT}"
        )
    return state


def read_rank_state(ckpt_dir: Path, rank: int) -> dict:
    return json.loads((ckpt_dir / f"rng_rank{rank}.json").read_text())


# What a resumed run must share with the checkpoint: DeepSpeed keeps optimizer state per stage and per
# data-parallel rank (flattened over that stage's layers), in a layout that depends on ZeRO and precision.
RESUME_LAYOUT_KEYS = ("stages", "data_parallel", "zero_stage", "precision")


def check_resumable(state: dict, tag: str, layout: dict, sampler: dict, run_dir: Path) -> None:
    """Refuse, in one line, a resume that would change the data order or the parallel layout."""
    if state["sampler"] != sampler:
        raise UserError(
            f"--out {run_dir}: checkpoint {tag} was written with batch layout {state['sampler']}, this run has "
            f"{sampler}; resuming would change the data order: use a new --out"
        )
    was = {k: state["layout"].get(k) for k in RESUME_LAYOUT_KEYS}
    now = {k: layout[k] for k in RESUME_LAYOUT_KEYS}
    if was != now:
        raise UserError(
            f"--out {run_dir}: checkpoint {tag} was written with {was}, this run has {now}; training resumes "
            f"only in the layout that wrote it (use the same --pipeline-stages, world size and DeepSpeed "
            f"config, or a new --out; evaluate.py and export.py read any layout)"
        )
