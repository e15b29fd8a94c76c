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


def test_the_key_holds_the_sm_count_and_the_driver(tmp_path, monkeypatch):
    """A ranking measured on 132 SMs is not used on 114 (MPS, another model of the same name), nor under another
    driver: a cooperative grid sized for one may not launch on the other."""
    monkeypatch.setenv("MLSTM_CACHE_DIR", str(tmp_path))
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    assert cache.device_label("cpu") == "cpu"
    assert cache.driver_version() == "none" or cache.driver_version().isdigit()
    label = ["NVIDIA H100 80GB HBM3 132 SMs|driver 13000"]
    monkeypatch.setattr(cache, "device_label", lambda device: label[0])
    entry = {"fwd": ["persistent"], "bwd": ["splitk"], "python": False}
    cache.store(64, 1024, torch.bfloat16, "cuda", (str(code),), entry)
    assert cache.load(64, 1024, torch.bfloat16, "cuda", (str(code),)) == entry
    for other in ("NVIDIA H100 80GB HBM3 114 SMs|driver 13000", "NVIDIA H100 80GB HBM3 132 SMs|driver 12080"):
        label[0] = other
        assert cache.load(64, 1024, torch.bfloat16, "cuda", (str(code),)) is None, other


def test_the_cache_is_replaced_through_a_unique_temporary_file(tmp_path, monkeypatch):
    """Another user's link planted at a predictable name next to the cache (the old `gpu_loops.<pid>.tmp`) is
    never written through: the temporary file is made afresh (O_EXCL) under a random name, then renamed."""
    import os

    monkeypatch.setenv("MLSTM_CACHE_DIR", str(tmp_path))
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / f"gpu_loops.{os.getpid()}.tmp").symlink_to(victim)
    entry = {"fwd": ["step"], "bwd": None, "python": None}
    cache.store(16, 256, torch.bfloat16, "cpu", (str(code),), entry)
    assert victim.read_text() == "keep me"
    assert cache.load(16, 256, torch.bfloat16, "cpu", (str(code),)) == entry
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp" and not p.is_symlink()]
