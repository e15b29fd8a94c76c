"""A rank started without the environment activated (pdsh/ssh) must build with the project's ninja."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from app.common.toolchain import use_environment_scripts

ROOT = Path(__file__).resolve().parents[1]


def test_scripts_folder_goes_first_when_path_lacks_it():
    scripts = sysconfig.get_path("scripts")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    assert use_environment_scripts(env) == scripts
    assert env["PATH"].split(os.pathsep) == [scripts, "/usr/local/bin", "/usr/bin", "/bin"]
    assert use_environment_scripts(env) is None, "added twice"
    assert shutil.which("ninja", path=env["PATH"]) == os.path.join(scripts, "ninja")


def test_a_bare_ssh_like_environment_finds_the_projects_ninja():
    """What a pdsh rank gets: the venv's python by absolute path, the system's PATH. After the call (made
    by init_distributed and the fused core's build) ninja is the one installed with the project, not
    /usr/bin/ninja, whose build log format would make every cached extension build again."""
    code = (
        "import shutil; from app.common.toolchain import use_environment_scripts; "
        "use_environment_scripts(); print(shutil.which('ninja'))"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == os.path.join(sysconfig.get_path("scripts"), "ninja")


def test_build_lock_removes_a_dead_builds_lock_and_excludes_a_second_builder(tmp_path):
    """Holding the flock, a torch `lock` file can only be a dead build's: it goes. While held, another
    process cannot take it (the kernel drops it when the holder dies, so nothing waits on a dead one)."""
    from app.common.toolchain import build_lock

    folder = tmp_path / "ext"
    folder.mkdir()
    (folder / "lock").touch()
    probe = (
        "import fcntl, sys\n"
        "f = open(sys.argv[1], 'a')\n"
        "try:\n"
        "    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
        "except BlockingIOError:\n"
        "    print('held')\n"
    )
    with build_lock(folder):
        assert not (folder / "lock").exists()
        held = subprocess.run(
            [sys.executable, "-c", probe, str(folder / "build.flock")], capture_output=True, text=True
        )
        assert held.stdout.strip() == "held"
    free = subprocess.run(
        [sys.executable, "-c", probe, str(folder / "build.flock")], capture_output=True, text=True
    )
    assert free.stdout.strip() == "free"
