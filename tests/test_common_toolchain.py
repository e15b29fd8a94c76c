"""A rank started without the environment activated (pdsh/ssh) must build with the project's ninja."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
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


def test_build_lock_removes_a_dead_builds_lock_and_excludes_a_second_builder(tmp_path, monkeypatch):
    """Holding the flock, a torch `lock` file can only be a dead build's: it goes. While held, another
    process cannot take it (the kernel drops it when the holder dies, so nothing waits on a dead one)."""
    from app.common.toolchain import build_lock

    monkeypatch.setenv("MLSTM_CACHE_DIR", str(tmp_path))
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


SLOW_CXX = """#!/bin/sh
# the plain program's compiler (first on its PATH as c++): it builds once the test says go, so the build is
# under way, torch's lock taken, while ours runs; a question about its version is answered at once
case " $* " in *" -o "*) while [ ! -e "{go}" ]; do sleep 0.2; done;; esac
exec g++ "$@"
"""
PLAIN_BUILD = (
    "from deepspeed.accelerator import get_accelerator\n"
    "get_accelerator().create_op_builder('ShareMemCommBuilder').load(verbose=False)\n"
    "print('plain build done')\n"
)


def _plain_program(tmp_path: Path) -> tuple[dict, Path, Path]:
    """(its environment, torch's default folder of the op in it, the file that lets its compiler go). The
    folder is seeded with the objects of our own build of the op (the same sources and commands), so its
    build is a real one that only links: seconds, not a compile of minutes."""
    from deepspeed.accelerator import get_accelerator

    built = Path(
        get_accelerator().create_op_builder("ShareMemCommBuilder").load().__file__
    ).parent  # conftest's
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_EXTENSIONS_DIR", "RANK", "WORLD_SIZE")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")  # torch's default folder: XDG_CACHE_HOME/torch_extensions
    theirs = tmp_path / "xdg" / "torch_extensions" / built.parent.name / built.name  # py311_cpu: torch's tag
    shutil.copytree(built, theirs, ignore=shutil.ignore_patterns("lock", "*.flock", "*.so"))
    go, bin_ = tmp_path / "go", tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "c++").write_text(SLOW_CXX.format(go=go))
    (bin_ / "c++").chmod(0o755)
    env["PATH"] = os.pathsep.join([str(bin_), sysconfig.get_path("scripts"), env.get("PATH", "")])
    return env, theirs, go


def test_a_plain_deepspeed_build_in_torchs_folder_and_ours_both_finish(tmp_path):
    """A DeepSpeed program that is not ours builds the CPU comm op in torch's default extensions folder
    (XDG_CACHE_HOME/torch_extensions here) and holds torch's `lock` there while its compiler runs; our
    process set-up (init_distributed, what every rank of a launch runs) builds the same op meanwhile. Ours
    finishes without touching that folder, and the plain build finishes too, its lock its own until it
    releases it. At 087d2a2 ours built in torch's folder and removed the plain build's `lock` as a dead
    build's: the plain build's release then failed (FileNotFoundError), two builds wrote one folder."""
    env, theirs, go = _plain_program(tmp_path)
    plain = subprocess.Popen(
        [sys.executable, "-c", PLAIN_BUILD], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    their_lock = theirs / "lock"
    try:
        deadline = time.monotonic() + 180
        while not their_lock.exists() and time.monotonic() < deadline and plain.poll() is None:
            time.sleep(0.1)
        assert their_lock.exists(), f"the plain build never took torch's lock: {plain.communicate()[0]}"
        code = "from app.parallel.runtime import init_distributed; init_distributed(); print('ours started')"
        ours_env = {k: v for k, v in env.items() if k != "PATH"} | {"PATH": os.environ.get("PATH", "")}
        ours = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env={**ours_env, "MASTER_PORT": "29873"},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert ours.returncode == 0 and "ours started" in ours.stdout, ours.stderr[-3000:]
        assert their_lock.exists(), "our launch removed the plain build's lock in torch's folder"
        assert plain.poll() is None, "the plain build ended before it was let go"
    finally:
        go.touch()
        try:
            out, _ = plain.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            plain.kill()
            out, _ = plain.communicate()
    assert plain.returncode == 0 and "plain build done" in out, out[-3000:]
    assert not their_lock.exists() and (theirs / "deepspeed_shm_comm.so").is_file()  # its own, released
