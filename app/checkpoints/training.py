"""Checkpoints: DeepSpeed's own files plus the app's state, committed only once every rank has written.

Layout of `<run>/checkpoints/`:
    step_00000100/            one tag per save
        (DeepSpeed files)     model/optimizer states as DeepSpeed writes them for this layout
        rng_rank{r}.json      python/numpy/torch RNG states of rank r (JSON: nothing to unpickle)
        app_state.json        step, sampler position, resolved configs, tokenizer meta (rank 0)
        tokenizer.model       copy of the data's SentencePiece model (absent for byte tokenizer)
        COMPLETE              manifest {file: {size, sha256}}, written last by rank 0 after a barrier
    latest                    tag of the newest COMPLETE checkpoint, replaced atomically
    (best)                    not a file: `--checkpoint <run>/best` names the checkpoint with the lowest
                              validation loss recorded in its app_state.json (best_tag); pruning keeps it
    damaged/                  checkpoints whose files no longer match their manifest, moved aside

A crash during a save leaves a tag without COMPLETE; it is ignored on resume and pruned later. A tag
with COMPLETE whose files do not match it is never deleted: it is moved to damaged/ with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from app.common.errors import UserError
from app.common.files import atomic_write, fsync_dir, read_json_object
from app.common.handed import member
from app.model import matmul

log = logging.getLogger("mlstm")

CHECKPOINT_FORMAT = 1
COMPLETE = "COMPLETE"
LATEST = "latest"
BEST = "best"
DAMAGED = "damaged"
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
    matmul.restore_choices(state.get("matmul", []))  # absent in checkpoints written before the table


# ---------------------------------------------------------------- finding checkpoints


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(ckpt_dir: Path) -> dict[Path, dict] | None:
    """{file: {size[, sha256]}} of the checkpoint's manifest, every name read only inside the folder (one line
    naming COMPLETE and the entry otherwise); None when it is missing or unreadable."""
    try:
        files = json.loads((ckpt_dir / COMPLETE).read_text())["files"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(files, dict):
        return None
    out = {}
    for name, entry in files.items():
        path = member(ckpt_dir, name, ckpt_dir / COMPLETE, f"files[{name!r}]")
        out[path] = entry if isinstance(entry, dict) else {"size": entry}  # format-1 manifests: sizes only
    return out


def is_complete(ckpt_dir: Path) -> bool:
    """A checkpoint counts only with its manifest, and every file in it present at its recorded size."""
    files = _manifest(ckpt_dir)
    if files is None:
        return False
    return all(f.is_file() and f.stat().st_size == want["size"] for f, want in files.items())


def damaged_files(ckpt_dir: Path) -> list[str]:
    """Files whose size or sha256 differs from the manifest (all of them when the manifest is unreadable)."""
    files = _manifest(ckpt_dir)
    if files is None:
        return [COMPLETE]
    bad = []
    for f, want in files.items():
        name = str(f.relative_to(ckpt_dir))
        if (
            not f.is_file()
            or f.stat().st_size != want["size"]
            or ("sha256" in want and sha256_file(f) != want["sha256"])
        ):
            bad.append(name)
    return bad


def move_aside(root: Path, tag: str) -> Path:
    """Move a damaged checkpoint to `root/damaged/` (kept for inspection, never deleted silently)."""
    dest_root = root / DAMAGED
    dest_root.mkdir(exist_ok=True)
    dest = dest_root / tag
    n = 1
    while dest.exists():
        dest, n = dest_root / f"{tag}.{n}", n + 1
    os.replace(root / tag, dest)
    fsync_dir(root)
    return dest


def complete_tags(root: Path) -> list[str]:
    """Tags of complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    tags = sorted(p.name for p in root.iterdir() if p.is_dir() and _TAG.match(p.name))
    return [t for t in tags if is_complete(root / t)]


def best_tag(root: Path) -> str | None:
    """The complete checkpoint with the lowest recorded validation loss, or None when none has one.

    A save records `validation` {loss, max_batches} when a validation ran at its step (see the trainer).
    Only losses over the same number of batches as the newest record compare (a changed
    --eval-max-batches starts a new series), and only tags up to the one `latest` names: tags past it are
    left from a run that resumed at an earlier step, not from the weights that led to `latest`.
    Ties go to the earlier step.
    """
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    records = []
    for tag in complete_tags(root):
        if latest is not None and tag > latest:  # fixed-width step numbers: names sort as steps
            continue
        try:
            v = json.loads((root / tag / "app_state.json").read_text()).get("validation")
        except (OSError, ValueError):
            continue  # unreadable: not a candidate (a resume or an evaluation reports it)
        if isinstance(v, dict) and isinstance(v.get("loss"), (int, float)) and math.isfinite(v["loss"]):
            records.append((tag, float(v["loss"]), v.get("max_batches")))
    if not records:
        return None
    series = records[-1][2]
    return min((r for r in records if r[2] == series), key=lambda r: r[1])[0]


def find_resume_tag(root: Path, requested: str | None) -> str | None:
    """The tag to resume from: the requested one (must exist and be complete), else `latest`, else none."""
    if requested:
        if not _TAG.match(requested):
            raise UserError(
                f"--resume {requested}: expected a tag under --out/checkpoints such as step_00000100 "
                f"(complete checkpoints: {', '.join(complete_tags(root)) or 'none'})"
            )
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
        if _TAG.match(tag) and is_complete(root / tag):  # a tag name only: never a path elsewhere
            return tag
    tags = complete_tags(root)
    return tags[-1] if tags else None


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A run directory, its checkpoints/ folder, or one tag's folder -> the complete checkpoint folder;
    `<run>/best` (or `<run>/checkpoints/best`) -> the one with the lowest validation loss (best_tag)."""
    p = Path(path)
    if p.name == BEST and not p.exists() and p.parent.is_dir():
        root = p.parent / "checkpoints" if (p.parent / "checkpoints").is_dir() else p.parent
        tag = best_tag(root)
        if tag is None:
            raise UserError(
                f"--checkpoint {p}: no complete checkpoint under {root} recorded a validation loss (a save "
                f"records one when a validation ran at its step: every final save, and periodic saves when "
                f"--save-every is a multiple of --eval-every)"
            )
        return root / tag
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
    """This rank's RNG streams and matmul kernel table: what a bit-exact resume must restore."""
    _write_json_atomic(ckpt_dir / f"rng_rank{rank}.json", {**rng_state(), "matmul": matmul.export_choices()})


def commit(root: Path, tag: str, app_state: dict, world_size: int, tokenizer_path: Path | None) -> None:
    """Rank 0, after a barrier that follows every rank's writes: verify, write the manifest, move `latest`."""
    d = root / tag
    missing = [f"rng_rank{r}.json" for r in range(world_size) if not (d / f"rng_rank{r}.json").is_file()]
    if not any(d.glob("*model_states.pt")):
        missing.append("*model_states.pt")
    if missing:
        raise RuntimeError(f"checkpoint {d} is missing {', '.join(missing)} after every rank reported done")
    if tokenizer_path is not None:
        atomic_write(d / "tokenizer.model", Path(tokenizer_path).read_bytes())
    _write_json_atomic(d / "app_state.json", {"checkpoint_format": CHECKPOINT_FORMAT, **app_state})
    for p in d.rglob("*"):  # DeepSpeed's own files were written without fsync
        if p.is_file() and p.name != COMPLETE:
            _fsync_file(p)
    files = {
        str(p.relative_to(d)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(d.rglob("*"))
        if p.is_file() and p.name != COMPLETE
    }
    _write_json_atomic(d / COMPLETE, {"files": files})
    # Only now does this checkpoint become the one a restart uses.
    atomic_write(root / LATEST, tag)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def invalidate(root: Path, tag: str) -> None:
    """Before a tag folder is (re)written: drop its COMPLETE marker first, so a crash mid-way leaves it
    incomplete rather than an old manifest over new files."""
    marker = root / tag / COMPLETE
    if marker.exists():
        marker.unlink()
        fsync_dir(marker.parent)


def prune(root: Path, keep_last: int) -> list[str]:
    """Delete all but the newest `keep_last` complete checkpoints and any interrupted saves.

    Never deletes the tag `latest` names, nor the best one (best_tag). Runs on rank 0 after the commit
    barrier, so no rank is writing. A folder with a manifest its files do not match is moved to damaged/
    with a warning, not deleted.
    """
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    complete = complete_tags(root)
    keep = set(complete[-keep_last:]) | {t for t in (latest, best_tag(root)) if t}
    removed = []
    for p in sorted(root.iterdir()):
        if p.is_dir() and _TAG.match(p.name) and p.name not in keep:
            if (p / COMPLETE).exists() and not is_complete(p):
                log.warning(
                    f"checkpoint {p} does not match its manifest: moved to {move_aside(root, p.name)}"
                )
                continue
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


# What a resumed run must share with the checkpoint. Stages, data parallelism and ZeRO stage may change
# (app/checkpoints/universal.py re-slices the optimizer state); the precision may not (untested).
RESUME_LAYOUT_KEYS = ("precision",)


def data_order(fingerprint: dict) -> dict:
    """What of a batch plan's fingerprint decides which examples each step reads. Micro-batch j of rank r in
    a step is entry j * data_parallel + r of the step's list, so the step reads the same micro-batches however
    its grad_accum x data_parallel of them are split between accumulation and ranks: only their number
    counts (P = 2 x DP = 1 x accum 2 resumed as P = 1 x DP = 2 x accum 1 reads the same batches). With
    --carry-state streams are bound to (micro-batch, rank) slots, so there the split counts too."""
    if fingerprint.get("carry_state"):
        return fingerprint
    out = {k: v for k, v in fingerprint.items() if k not in ("grad_accum", "data_parallel")}
    out["micro_batches_per_step"] = fingerprint.get("grad_accum", 1) * fingerprint.get("data_parallel", 1)
    return out


def check_resumable(
    state: dict, tag: str, layout: dict, sampler: dict, run_dir: Path, allow_data_change: bool = False
) -> None:
    """Refuse, in one line, a resume that would change the data order or the precision."""
    if data_order(state["sampler"]) != data_order(sampler) and not allow_data_change:
        raise UserError(
            f"--out {run_dir}: checkpoint {tag} was written with batch layout {state['sampler']}, this run has "
            f"{sampler}; resuming would change the data order: use a new --out (or --allow-data-change)"
        )
    was = {k: state["layout"].get(k) for k in RESUME_LAYOUT_KEYS}
    now = {k: layout[k] for k in RESUME_LAYOUT_KEYS}
    if was != now:
        raise UserError(
            f"--out {run_dir}: checkpoint {tag} was written with {was}, this run has {now}; training resumes "
            f"only in the precision that wrote it (use the same --precision, or a new --out with --init-from)"
        )
