"""The build tools a JIT-compiled extension (the fused core, DeepSpeed's CPU comm op) runs with.

torch's `cpp_extension.load` runs `ninja` from PATH. A rank started by pdsh/ssh (DeepSpeed's multi-node
launcher) runs this environment's python without the environment being activated, so PATH finds the
system's ninja instead of the one installed with the project (the `ninja` dependency). Two ninja versions
keep build logs in different formats, so each one discards the other's cached build in a shared
TORCH_EXTENSIONS_DIR and compiles again: measured 25-40 s per extension per launch, alternating between
the nodes' ranks and the launching node's processes.

A build killed mid-way (Ctrl-C, a timeout, a preempted job) leaves torch's `lock` file in its build
folder, and every later build of that extension waits on it forever. `build_lock` holds an flock, which
the kernel drops when its holder dies, around our own builds: holding it, a `lock` file can only be
one a dead build left, so it is removed. DeepSpeed's CPU comm op is built the same way, under that flock, before
`deepspeed.init_distributed` asks for it (`prebuild_deepspeed_op`): DeepSpeed keeps an op it loaded once per
process, so its own load then never waits on torch's `lock`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def use_environment_scripts(environ: dict | None = None) -> str | None:
    """Put this Python environment's scripts folder (`.venv/bin`) first on PATH when PATH lacks it, so the
    tools installed with the project are the ones found. Returns the folder added, or None."""
    env = os.environ if environ is None else environ
    scripts = sysconfig.get_path("scripts")
    parts = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    if not scripts or not os.path.isdir(scripts) or scripts in parts:
        return None
    env["PATH"] = os.pathsep.join([scripts, *parts])
    return scripts


def build_directory(name: str) -> Path:
    """Where an extension of ours builds: TORCH_EXTENSIONS_DIR (default torch's build root) / python tag / name."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}" / name


def torch_extension_directory(name: str) -> Path:
    """The folder torch's JIT loader builds NAME in when the caller names none (DeepSpeed's ops): torch's own
    layout, TORCH_EXTENSIONS_DIR/NAME, else its build root / py<version><abiflags>_<cpu|cuXY|rocmXY> / NAME."""
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        if torch.version.hip is not None:
            kind = "rocm" + torch.version.hip.replace(".", "")
        elif torch.version.cuda is not None:
            kind = "cu" + torch.version.cuda.replace(".", "")
        else:
            kind = "cpu"
        tag = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{kind}"
        root = os.path.join(get_default_build_root(), tag)
    return Path(root) / name


def prebuild_deepspeed_op(builder) -> None:
    """Build (or load from the cache) a DeepSpeed op under `build_lock`: a `lock` file left in its folder by a
    build that was killed is removed first, where torch's loader would wait on it forever."""
    use_environment_scripts()  # this environment's ninja, whose build log the cached build was made with
    with build_lock(torch_extension_directory(builder.NAME)):
        builder.load(verbose=False)


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive flock on `folder` for one build; remove a `lock` file a killed build left."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.flock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released by the kernel if this process dies
        try:
            stale = folder / "lock"
            if stale.exists():
                log.warning("removing %s, left by a build that was killed", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
