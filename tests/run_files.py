"""Read what a training run leaves on disk: its offline W&B run (records, tables, staged artifact files),
samples.jsonl, plots. Shared by the tests that check the session's training runs."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_BLOCK = 32768  # W&B's transaction log: a LevelDB-style log of 32 KiB blocks after a 7-byte file header


def wandb_records(run_dir: Path) -> list:
    """Every record of the run's one offline W&B run file, parsed with wandb's own protobuf schema."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    return wandb_file_records(path)


def wandb_file_records(path: Path) -> list:
    """Every record of one W&B run file (`run-<id>.wandb`)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    out, pos, buf = [], 7, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and n == 0):  # the rest of a block is padding
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def wandb_config(records: list) -> dict:
    """The config the run was created with (and any later updates), W&B's own "_wandb" entry left out."""
    cfg = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        items = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
        cfg.update({i.key: json.loads(i.value_json) for i in items})
    cfg.pop("_wandb", None)
    return cfg


def wandb_artifacts(records: list, type_: str) -> list:
    return [
        r.artifact for r in records if r.WhichOneof("record_type") == "artifact" and r.artifact.type == type_
    ]


def check_staged(entry) -> Path:
    """A manifest entry's staged copy exists with the recorded size and MD5 (what the upload will send)."""
    path = Path(entry.local_path)
    assert path.is_file(), f"{entry.path}: staged file {path} missing"
    data = path.read_bytes()
    assert len(data) == entry.size, entry.path
    assert base64.b64encode(hashlib.md5(data).digest()).decode() == entry.digest, entry.path
    return path


def sample_tables(run_dir: Path) -> dict[int, list[dict]]:
    """step -> the rows of the W&B samples table logged at that step (files/media/table/*.table.json)."""
    out: dict[int, list[dict]] = {}
    for f in run_dir.glob("wandb/offline-run-*/files/media/table/samples_*.table.json"):
        t = json.loads(f.read_text())
        rows = [dict(zip(t["columns"], row)) for row in t["data"]]
        out[rows[0]["step"]] = rows
    return out


def samples(run_dir: Path) -> dict[int, list[dict]]:
    """step -> the samples.jsonl records of that step."""
    out: dict[int, list[dict]] = {}
    for line in (run_dir / "samples.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        out.setdefault(rec["step"], []).append(rec)
    return out


def samples_from_checkpoint(run_dir: Path, num_samples: int = 4, max_new_tokens: int = 128) -> list[str]:
    """The texts the trainer's sampling would write for the run's latest checkpoint, sampled here (one
    process) from the consolidated checkpoint: equal to the trainer's only if it gathered every weight."""
    import torch

    from app.checkpoints.loader import open_source
    from app.training.samples import sample_texts

    src = open_source(run_dir)
    seed = json.loads((run_dir / "config.json").read_text())["train"]["seed"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks' thread count: the same order of every sum
    try:
        rows = sample_texts(src.state_dict(), src.model_cfg, src.tokenizer(), [""], num_samples=num_samples,
                            max_new_tokens=max_new_tokens, seed=seed)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return [r["text"] for r in rows]


def check_samples(run_dir: Path, steps: list[int], rows: int = 4) -> dict[int, list[dict]]:
    """samples.jsonl holds `rows` samples at each validation step; the last step's equal the checkpoint's."""
    got = samples(run_dir)
    assert sorted(got) == steps and all(len(v) == rows for v in got.values()), {
        s: len(v) for s, v in got.items()
    }
    assert [r["text"] for r in got[steps[-1]]] == samples_from_checkpoint(run_dir, rows)
    return got


def check_png(path: Path) -> None:
    """A PNG file (signature, IHDR) of a real picture: not tiny, not one flat colour."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path}: not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 200 and height >= 150 and len(data) > 5000, (path, width, height, len(data))
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width) and float(pixels.std()) > 0.01, f"{path}: a blank picture"
