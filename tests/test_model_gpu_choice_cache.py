"""app/model/gpu_choice_cache.py: the GPU loop winners on disk, keyed by the code that runs them."""

import torch

from app.model import gpu_choice_cache as cache


def test_a_stored_choice_is_found_again_and_tied_to_the_code(tmp_path, monkeypatch):
    monkeypatch.setenv("MLSTM_CACHE_DIR", str(tmp_path))
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    entry = {"fwd": "persistent", "bwd": "splitk", "python": False}
    cache.store(64, 1024, torch.bfloat16, "cpu", (str(code),), entry)
    assert cache.load(64, 1024, torch.bfloat16, "cpu", (str(code),)) == entry
    assert cache.load(32, 1024, torch.bfloat16, "cpu", (str(code),)) is None  # another shape
    code.write_text("x = 2\n")  # the loops' code changed: their old timings say nothing
    assert cache.load(64, 1024, torch.bfloat16, "cpu", (str(code),)) is None


def test_an_unreadable_or_unwritable_cache_is_timed_afresh(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLSTM_CACHE_DIR", str(tmp_path))
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    (tmp_path / "gpu_loops.json").write_text("{not json")
    assert cache.load(64, 1024, torch.bfloat16, "cpu", (str(code),)) is None
    blocked = tmp_path / "a_file"
    blocked.write_text("")  # a cache folder that cannot be made (under a file: refused even to root)
    monkeypatch.setenv("MLSTM_CACHE_DIR", str(blocked / "sub"))
    with caplog.at_level("WARNING", logger="app.model.gpu_choice_cache"):
        cache.store(
            64, 1024, torch.bfloat16, "cpu", (str(code),), {"fwd": "step", "bwd": None, "python": None}
        )
    assert "could not write the GPU loop cache" in caplog.text
