"""Damaged prepared data is refused at start, in one line naming the file, by training as users run it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from in_process import call
from launcher import deepspeed_cmd, run, train_args

from app.train import main as train_main
from data_prep.format import load_prepared
from data_prep.integrity import file_digest


def _damage(prepared: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (a damaged copy of `prepared`, what the error line must say)."""
    cases = {}
    for name in ("same_size", "truncated", "missing", "small_vocab", "outside", "huge_vocab"):
        shutil.copytree(prepared, root / name)
    train = root / "same_size" / "train" / "00000.arrow"
    size = train.stat().st_size
    with open(train, "r+b") as f:  # 4 KiB of 0xFF in the middle, the size kept
        f.seek(size // 2)
        f.write(b"\xff" * 4096)
    cases["same_size"] = (root / "same_size", f"{train}: shard damaged")
    os.truncate(root / "truncated" / "train" / "00000.arrow", size // 2)
    cases["truncated"] = (
        root / "truncated",
        f"{root / 'truncated' / 'train' / '00000.arrow'}: shard truncated: {size // 2} bytes",
    )
    (root / "missing" / "validation" / "00000.arrow").unlink()
    cases["missing"] = (root / "missing", f"{root / 'missing' / 'validation' / '00000.arrow'}: shard missing")
    meta_path = root / "small_vocab" / "meta.json"
    meta = json.loads(meta_path.read_text())
    top = max(
        int(np.max(c.values)) for c in load_prepared(prepared).split("train").data.column("input_ids").chunks
    )
    meta["tokenizer"]["vocab_size"] = top  # the largest id is now one past the end
    meta_path.write_text(json.dumps(meta))
    pieces = load_prepared(prepared).meta["tokenizer"]["vocab_size"]
    cases["small_vocab"] = (  # what the ids would show: the tokenizer file says it first
        root / "small_vocab",
        f"{meta_path}: tokenizer.vocab_size is {top:,}, but {root / 'small_vocab' / 'tokenizer.model'} has "
        f"{pieces:,} ids",
    )
    # a train shard outside the folder, with its size and digest: it was trained on
    manifest_path = root / "outside" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    os.replace(root / "outside" / "train" / "00000.arrow", root / "outside.arrow")
    manifest["groups"][0]["files"]["train"]["name"] = "../outside.arrow"
    manifest_path.write_text(json.dumps(manifest))
    cases["outside"] = (
        root / "outside",
        f"{manifest_path}: groups[0].files.train.name '../outside.arrow' points outside",
    )
    # a vocabulary of 10^12: the embedding tried to allocate 128 TB (a traceback on rank 0)
    meta_path = root / "huge_vocab" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["tokenizer"]["vocab_size"] = 10**12
    meta_path.write_text(json.dumps(meta))
    cases["huge_vocab"] = (
        root / "huge_vocab",
        f"{meta_path}: tokenizer.vocab_size must be an integer in [1, 16,777,216], got 1000000000000",
    )
    return cases


def _one_line(stderr: str, rc: int, needle: str) -> None:
    errors = [ln for ln in stderr.splitlines() if "error: " in ln]
    assert rc != 0 and errors, stderr[-3000:]
    assert all(needle in ln for ln in errors), stderr[-3000:]  # each rank that says it says the same
    assert "Traceback" not in stderr and "IndexError" not in stderr, stderr[-3000:]


def test_damaged_data_is_refused_at_start(prepared_dir, tmp_path, capsys):
    """Six damages, each refused by `python app/train.py` (one plain process; its main called in this one,
    tests/in_process.py): a shard damaged, truncated or missing, a vocabulary too small for the ids or larger
    than the tokenizer's (10^12), and a shard named outside the folder."""
    for name, (data, needle) in _damage(prepared_dir, tmp_path).items():
        args = train_args(
            data, tmp_path / f"run_{name}", "--max-steps", "2", "--wandb-mode", "disabled", stages=1
        )
        p = call(train_main, args, capsys)
        _one_line(p.stderr, p.returncode, needle)
        assert not list((tmp_path / f"run_{name}").glob("checkpoints/step_*")), name


# `long`: a launch of 2 ranks for a refusal the test above reads from the command's main (the same-size damage);
# what only it runs is the refusal on every rank of a 2-stage launch, no rank reaching its first batch
@pytest.mark.long
def test_damaged_shard_under_the_launcher(prepared_dir, tmp_path):
    """2 ranks, 2 stages: the same-size damage is named before step 1 (it was an IndexError traceback)."""
    data, needle = _damage(prepared_dir, tmp_path)["same_size"]
    args = train_args(data, tmp_path / "run", "--max-steps", "2", "--wandb-mode", "disabled")
    p = run(deepspeed_cmd(2, "app/train.py", args), timeout=600)
    _one_line(p.stderr, p.returncode, needle)
    assert "step 1/" not in p.stderr


@pytest.mark.parametrize("size", [0, 1, (1 << 24) + 3])
def test_file_digest_matches_a_whole_buffer_hash(tmp_path, size):
    import xxhash

    blob = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    (tmp_path / "f").write_bytes(blob)
    assert file_digest(tmp_path / "f") == xxhash.xxh3_128(blob).hexdigest()


def test_id_range_names_negative_and_too_large_ids(tmp_path):
    import pyarrow as pa

    from data_prep.integrity import id_problem

    def ids(*rows):
        return pa.chunked_array([pa.array(list(rows), pa.list_(pa.int32()))])

    shard, meta = tmp_path / "00000.arrow", tmp_path / "meta.json"
    assert id_problem(shard, ids([0, 5], [9]), 10, meta) is None
    assert "token id 10 is outside the vocabulary of 10" in id_problem(shard, ids([0], [10, 3]), 10, meta)
    assert "token id -1 is outside" in id_problem(shard, ids([0], [4, -1]), 10, meta)
    assert id_problem(shard, ids(), 10, meta) is None
