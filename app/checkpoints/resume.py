"""Deciding what a restart resumes from, once (rank 0), and checking that it may.

Rank 0 picks the tag and broadcasts it, so ranks never disagree (one of them seeing a `latest` another
has not). A checkpoint whose files no longer match their sha256 in the manifest is moved to
`checkpoints/damaged/` with a warning and the previous complete one is used. An explicit `--resume TAG`
repoints `latest` at once, so a crash after it restarts from TAG, not from the abandoned newer tag.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch.distributed as dist

from app.checkpoints import training as ckpt
from app.common.errors import UserError
from app.common.files import atomic_write

log = logging.getLogger("mlstm")


def _newest_intact(root: Path) -> str | None:
    """`latest` if intact, else the newest intact complete tag; damaged ones are moved aside."""
    tags = ckpt.complete_tags(root)
    first = ckpt.find_resume_tag(root, None)
    order = ([first] if first else []) + [t for t in reversed(tags) if t != first]
    for tag in order:
        bad = ckpt.damaged_files(root / tag)
        if not bad:
            return tag
        dest = ckpt.move_aside(root, tag)
        log.warning(
            f"checkpoint {root / tag} is damaged ({', '.join(bad[:3])} differ from its manifest): "
            f"moved to {dest}; falling back to the previous complete checkpoint"
        )
    return None


def pick_resume_tag(root: Path, requested: str | None) -> str | None:
    """Rank 0: the tag to resume from (verified against its manifest), or None for a fresh start."""
    if not requested:
        tag = _newest_intact(root)
        if tag is not None and ckpt.find_resume_tag(root, None) != tag:
            atomic_write(root / ckpt.LATEST, tag)
        return tag
    tag = ckpt.find_resume_tag(root, requested)
    bad = ckpt.damaged_files(root / tag)
    if bad:
        raise UserError(
            f"--resume {tag}: {root / tag} is damaged ({', '.join(bad[:3])} differ from its manifest); "
            f"resume another tag (complete: {', '.join(ckpt.complete_tags(root))})"
        )
    atomic_write(root / ckpt.LATEST, tag)  # a crash from here on restarts from the tag asked for
    return tag


def rank0_decides(fn, rank: int):
    """`fn()` on rank 0, its result (or its one-line UserError) on every rank.

    A UserError raised on rank 0 alone would leave the other ranks waiting in a collective forever.
    """
    box: list = [None, None]
    if rank == 0:
        try:
            box[0] = fn()
        except UserError as e:
            box[1] = str(e)
    dist.broadcast_object_list(box, src=0)
    if box[1] is not None:
        raise UserError(box[1])
    return box[0]


def file_sha256(path: Path | None) -> str | None:
    return None if path is None else ckpt.sha256_file(path)


def data_fingerprint(meta_path: Path) -> str:
    """The prepared set's identity: sha256 of its meta.json (counts, buckets, tokenizer, content hashes)."""
    return hashlib.sha256(meta_path.read_bytes()).hexdigest()


def check_compatible(saved: dict, now: dict, tag: str, run_dir: Path, allow_data_change: bool) -> None:
    """Refuse, in one line, a resume whose model, tokenizer or data differ from the checkpoint's.

    `now` holds model_config, tokenizer_sha256 and data_fingerprint of this run; keys a checkpoint
    written before they were recorded lacks are not compared.
    """
    was_model, now_model = saved.get("model_config") or {}, now["model_config"]
    diff = sorted(k for k in set(was_model) | set(now_model) if was_model.get(k) != now_model.get(k))
    if diff:
        what = ", ".join(f"{k}: {was_model.get(k)!r} -> {now_model.get(k)!r}" for k in diff)
        raise UserError(
            f"--out {run_dir}: checkpoint {tag} has another model config ({what}); resume with the same "
            f"--model-config and overrides, or train the new model in a new --out"
        )
    if saved.get("tokenizer_sha256", now["tokenizer_sha256"]) != now["tokenizer_sha256"]:
        raise UserError(
            f"--out {run_dir}: checkpoint {tag} was trained with another tokenizer (sha256 of its model file "
            f"differs from --data's); token ids would mean other pieces: use a new --out"
        )
    if (
        saved.get("data_fingerprint", now["data_fingerprint"]) != now["data_fingerprint"]
        and not allow_data_change
    ):
        raise UserError(
            f"--out {run_dir}: checkpoint {tag} was trained on other data (--data's meta.json differs from "
            f"the one recorded); use a new --out, or pass --allow-data-change to continue on the new data"
        )
