"""Checkpoint bookkeeping: commit only when complete, `latest` moves atomically, pruning keeps what matters."""

import json
import random

import numpy as np
import pytest
import torch

from app.checkpoints import training as ckpt
from app.common.errors import UserError


def fake_save(root, step, world=2, complete=True, val_loss=None, max_batches=0):
    d = root / ckpt.tag_for(step)
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"x" * 10)
    for r in range(world):
        ckpt.write_rank_state(d, r)
    state = {"step": step}
    if val_loss is not None:  # a validation ran at this step (what the trainer records)
        state["validation"] = {"loss": val_loss, "max_batches": max_batches}
    if complete:
        ckpt.commit(root, d.name, state, world, None)
    return d.name


def test_commit_writes_manifest_and_latest(tmp_path):
    tag = fake_save(tmp_path, 5)
    assert (tmp_path / "latest").read_text() == tag
    assert ckpt.is_complete(tmp_path / tag)
    assert ckpt.read_app_state(tmp_path / tag)["step"] == 5


def test_commit_refuses_missing_rank(tmp_path):
    d = tmp_path / ckpt.tag_for(1)
    d.mkdir()
    (d / "mp_rank_00_model_states.pt").write_bytes(b"x")
    ckpt.write_rank_state(d, 0)
    with pytest.raises(RuntimeError, match=r"rng_rank1\.json"):
        ckpt.commit(tmp_path, d.name, {}, 2, None)
    assert not (tmp_path / "latest").exists()


def test_interrupted_save_is_ignored_then_pruned(tmp_path):
    good = fake_save(tmp_path, 2)
    bad = fake_save(tmp_path, 4, complete=False)
    assert ckpt.find_resume_tag(tmp_path, None) == good
    ckpt.prune(tmp_path, keep_last=3)
    assert not (tmp_path / bad).exists() and (tmp_path / good).exists()


def test_truncated_file_makes_checkpoint_incomplete(tmp_path):
    old = fake_save(tmp_path, 2)
    new = fake_save(tmp_path, 4)
    (tmp_path / new / "mp_rank_00_model_states.pt").write_bytes(b"x")
    assert not ckpt.is_complete(tmp_path / new)
    assert ckpt.find_resume_tag(tmp_path, None) == old  # `latest` names a broken one: fall back


def test_keep_last_never_deletes_latest(tmp_path):
    tags = [fake_save(tmp_path, s) for s in (1, 2, 3, 4)]
    # Pretend `latest` still names an old one (e.g. the user pointed it back by hand).
    (tmp_path / "latest").write_text(tags[0])
    removed = ckpt.prune(tmp_path, keep_last=2)
    assert sorted(removed) == [tags[1]]
    assert {p.name for p in tmp_path.iterdir() if p.is_dir()} == {tags[0], tags[2], tags[3]}


def test_best_is_the_lowest_validation_loss_and_pruning_keeps_it(tmp_path):
    root = tmp_path / "checkpoints"
    losses = {1: 3.0, 2: None, 3: 2.5, 4: 2.9, 5: 3.1}
    tags = {s: fake_save(root, s, val_loss=v) for s, v in losses.items()}
    assert ckpt.best_tag(root) == tags[3]
    assert ckpt.prune(root, keep_last=1) == [tags[1], tags[2], tags[4]]
    for alias in (tmp_path / "best", root / "best"):  # <run>/best and <run>/checkpoints/best
        assert ckpt.resolve_checkpoint_dir(alias) == root / tags[3]
    assert ckpt.resolve_checkpoint_dir(tmp_path) == root / tags[5]  # the run itself: still the latest


def test_best_compares_one_series_and_only_tags_up_to_latest(tmp_path):
    tags = [
        fake_save(tmp_path, s, val_loss=v, max_batches=n)
        for s, v, n in [(1, 2.0, 0), (2, 1.0, 20), (3, 2.5, 0)]
    ]
    # step 2 measured 20 batches, the newest record the whole split: different figures, not compared
    assert ckpt.best_tag(tmp_path) == tags[0]
    (tmp_path / "latest").write_text(tags[1])  # a run resumed at step 2: step 3 is left from before it
    assert ckpt.best_tag(tmp_path) == tags[1]


def test_best_without_any_validation_is_one_clear_line(tmp_path):
    fake_save(tmp_path / "checkpoints", 4)
    with pytest.raises(UserError, match=r"best: no complete checkpoint under .* recorded a validation loss"):
        ckpt.resolve_checkpoint_dir(tmp_path / "best")


def test_explicit_resume_must_exist_and_be_complete(tmp_path):
    fake_save(tmp_path, 2)
    fake_save(tmp_path, 4, complete=False)
    with pytest.raises(UserError, match="no such checkpoint"):
        ckpt.find_resume_tag(tmp_path, "step_00000009")
    with pytest.raises(UserError, match="incomplete"):
        ckpt.find_resume_tag(tmp_path, ckpt.tag_for(4))


def test_rng_roundtrip_through_json():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = json.loads(json.dumps(ckpt.rng_state()))
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    ckpt.set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want


def test_resolve_checkpoint_dir(tmp_path):
    run = tmp_path / "run"
    tag = fake_save(run / "checkpoints", 3)
    assert ckpt.resolve_checkpoint_dir(run).name == tag
    assert ckpt.resolve_checkpoint_dir(run / "checkpoints" / tag).name == tag
    with pytest.raises(UserError, match="no such file"):
        ckpt.resolve_checkpoint_dir(tmp_path / "nope")
    with pytest.raises(UserError, match="no complete checkpoint"):
        ckpt.resolve_checkpoint_dir(tmp_path)


def _fingerprint(accum: int, dp: int, **kw) -> dict:
    return {"examples": 100, "steps_per_epoch": 7, "micro_batch": 16, "grad_accum": accum, "data_parallel": dp,
            "tokens_per_micro_batch": 0, "seed": 0, **kw}  # fmt: skip


def test_a_resume_with_the_same_micro_batches_per_step_keeps_the_data_order(tmp_path):
    """P = 2 x DP = 1 x accum 2 resumed as P = 1 x DP = 2 x accum 1: each step reads the same micro-batches."""
    state = {"sampler": _fingerprint(2, 1), "layout": {"precision": "fp32"}}
    ckpt.check_resumable(state, "step_6", {"precision": "fp32"}, _fingerprint(1, 2), tmp_path)
    with pytest.raises(UserError, match="resuming would change the data order"):
        ckpt.check_resumable(state, "step_6", {"precision": "fp32"}, _fingerprint(2, 2), tmp_path)
    carried = {"sampler": _fingerprint(2, 1, carry_state=True), "layout": {"precision": "fp32"}}
    with pytest.raises(UserError, match="resuming would change the data order"):  # streams are bound to slots
        ckpt.check_resumable(
            carried, "step_6", {"precision": "fp32"}, _fingerprint(1, 2, carry_state=True), tmp_path
        )


def test_a_manifest_names_files_inside_the_checkpoint_only(tmp_path):
    """A COMPLETE manifest naming a file outside its folder (with that file's size) was counted complete,
    and `damaged_files` hashed the outside file; it is now one line naming COMPLETE and the entry."""
    tag = fake_save(tmp_path / "checkpoints", 5)
    d = tmp_path / "checkpoints" / tag
    (tmp_path / "secret").write_bytes(b"s" * 7)
    manifest = json.loads((d / ckpt.COMPLETE).read_text())
    manifest["files"]["../../secret"] = {"size": 7}
    (d / ckpt.COMPLETE).write_text(json.dumps(manifest))
    for check in (ckpt.is_complete, ckpt.damaged_files, lambda d: ckpt.resolve_checkpoint_dir(tmp_path)):
        with pytest.raises(
            UserError, match=r"COMPLETE: files\['\.\./\.\./secret'\] '\.\./\.\./secret' points outside"
        ):
            check(d)
