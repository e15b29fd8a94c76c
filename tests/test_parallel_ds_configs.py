"""The DeepSpeed JSONs shipped as package data: found by bare name from anywhere, and inside the wheel."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from app.common.errors import UserError
from app.parallel.ds_configs import resolve_ds_config
from app.parallel.layout import load_ds_json

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(p.name for p in (ROOT / "ds_configs").glob("*.json"))


def test_a_bare_name_not_found_as_a_path_is_the_shipped_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ds_configs/ here
    for given in ("gpu_bf16_pp2_zero1.json", "ds_configs/gpu_bf16_pp2_zero1.json", "gpu_bf16_pp2_zero1"):
        got = load_ds_json(given)
        assert got == json.loads((ROOT / "ds_configs" / "gpu_bf16_pp2_zero1.json").read_text())
    (tmp_path / "gpu_bf16_pp2_zero1.json").write_text('{"train_micro_batch_size_per_gpu": 3}')
    assert load_ds_json("gpu_bf16_pp2_zero1.json") == {"train_micro_batch_size_per_gpu": 3}  # a path wins


def test_neither_a_path_nor_a_shipped_name_is_one_line_listing_the_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for given in ("gpu_fp8.json", "elsewhere/cpu_zero2.json"):
        with pytest.raises(UserError) as e:
            resolve_ds_config(given, "--deepspeed")
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"--deepspeed: file not found: {given};")
        assert all(name in msg for name in NAMES), msg


def _isolation() -> list[str]:
    """No build isolation (offline) where this environment has the build backend pyproject.toml asks for
    (setuptools>=77); else pip's isolated build, which fetches it (its cache, or the index)."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        major = 0
    return ["--no-build-isolation"] if major >= 77 else []


def test_the_wheel_holds_the_configs_and_its_install_finds_them(tmp_path):
    """`pip wheel` of a copy of the tree; the wheel unpacked and imported alone."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("app", "data_prep", "ds_configs"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *_isolation(), str(src)]
    subprocess.run([*cmd, "-w", str(wheels)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert sorted(Path(n).name for n in z.namelist() if n.startswith("app/ds_configs/")) == NAMES
        z.extractall(tmp_path / "site")
    code = "from app.parallel.ds_configs import resolve_ds_config as r; print(r('cpu_zero2.json', 'x'))"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(out) == tmp_path / "site" / "app" / "ds_configs" / "cpu_zero2.json"
