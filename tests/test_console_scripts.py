"""pyproject.toml's console scripts: one per entry point, each target importable and answering --help.

Called in-process through the target a script would call (the shared venv's installed scripts point at
whichever checkout installed it); `python -m app.generate` runs as a module in tests/test_generate.py and
`deepspeed --module app.train` launches the reference run (tests/conftest.py).
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from launcher import ROOT
from test_code_layout import ENTRY_POINTS


def console_scripts() -> dict[str, str]:
    """name -> "module:function" from [project.scripts] (read as text: tomllib is Python >= 3.11)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.]+:\w+)"', section, flags=re.M))


def test_every_entry_point_has_a_console_script():
    targets = {t.split(":")[0] for t in console_scripts().values()}
    assert set(ENTRY_POINTS) | {"data_prep.cli"} <= targets, sorted(targets)


@pytest.mark.parametrize("name", sorted(console_scripts()))
def test_console_script_target_answers_help(name, capsys):
    module, func = console_scripts()[name].split(":")
    main = getattr(importlib.import_module(module), func)
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out  # (importing DeepSpeed in this process may print a line first)
    assert done.value.code == 0 and re.search(r"^usage: ", out, flags=re.M), out[:500]


def test_the_wheel_carries_what_the_package_reads_at_run_time(tmp_path):
    """A pip-installed user builds the fused core from the C++ sources: they must be in the wheel (without
    them the build fails and every run falls back to the Python core)."""
    src = tmp_path / "src"
    for part in ("app", "data_prep"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(tmp_path),
    ]
    p = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    csrc = ROOT / "app" / "model" / "csrc"
    needed = {str(f.relative_to(ROOT)) for f in csrc.iterdir() if f.suffix in (".cpp", ".h")}
    assert len(needed) >= 2 and needed <= names, sorted(needed - names)
