"""The build tools and the build folder of a JIT-compiled extension (the fused core, DeepSpeed's ops).

torch's `cpp_extension.load` runs `ninja` from PATH. A rank started by pdsh/ssh (DeepSpeed's multi-node
launcher) runs this environment's python without the environment being activated, so PATH finds the
system's ninja instead of the one installed with the project (the `ninja` dependency). Two ninja versions
keep build logs in different formats, so each one discards the other's cached build and compiles again:
measured 25-40 s per extension per launch, alternating between the nodes' ranks and the launching node's
processes (`use_environment_scripts`).

Our builds live in a folder of ours, never in one other programs share: `extensions_root()` is
`$MLSTM_CACHE_DIR/torch_extensions/<py tag>_<cpu|cuXY|rocmXY>` (default `~/.cache/mlstm-ds/...`), and
our processes point TORCH_EXTENSIONS_DIR at it (`use_own_extensions_dir`: DeepSpeed's op builders and
torch's loader read that variable), so a plain DeepSpeed program building the same op in torch's own
folder (`~/.cache/torch_extensions`, or the TORCH_EXTENSIONS_DIR a user set) meets no file of ours, and
we touch none of its: its `lock` file is its own. A TORCH_EXTENSIONS_DIR set by the user is not read
by us; MLSTM_CACHE_DIR moves our builds.

A build killed mid-way (Ctrl-C, a timeout, a preempted job) leaves torch's `lock` file in its build
folder, and every later build of that extension waits on it forever. `build_lock` holds an flock, which
the kernel drops when its holder dies, around each of our builds: every build in our folder is made under
it, so a `lock` file found while holding it can only be one a dead build left, and it is removed. A
folder outside ours is never cleaned (another program's build may own its `lock`). DeepSpeed's CPU comm
op is built the same way, under that flock, before `deepspeed.init_distributed` asks for it
(`prebuild_deepspeed_op`): DeepSpeed keeps an op it loaded once per process, so its own load then never
waits on torch's `lock`.
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


def cache_dir() -> Path:
    """The folder of our caches: MLSTM_CACHE_DIR, else ~/.cache/mlstm-ds."""
    return Path(os.environ.get("MLSTM_CACHE_DIR") or Path.home() / ".cache" / "mlstm-ds")


def extensions_root() -> Path:
    """Our extensions' build root, one per Python and accelerator build of torch (torch's own layout)."""
    import torch

    if torch.version.hip is not None:
        kind = "rocm" + torch.version.hip.replace(".", "")
    elif torch.version.cuda is not None:
        kind = "cu" + torch.version.cuda.replace(".", "")
    else:
        kind = "cpu"
    tag = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{kind}"
    return cache_dir() / "torch_extensions" / tag


def use_own_extensions_dir(environ: dict | None = None) -> Path:
    """Point TORCH_EXTENSIONS_DIR at `extensions_root()` in this process (and those it starts), where
    DeepSpeed's JIT-built ops then build -> that folder."""
    env = os.environ if environ is None else environ
    root = extensions_root()
    env["TORCH_EXTENSIONS_DIR"] = str(root)
    return root


def build_directory(name: str) -> Path:
    """Where the extension NAME of ours builds: extensions_root() / NAME."""
    return extensions_root() / name


torch_extension_directory = build_directory  # DeepSpeed's ops, with TORCH_EXTENSIONS_DIR pointed at ours


def prebuild_deepspeed_op(builder) -> None:
    """Build (or load from the cache) a DeepSpeed op under `build_lock`: a `lock` file left in its folder by a
    build that was killed is removed first, where torch's loader would wait on it forever."""
    use_environment_scripts()  # this environment's ninja, whose build log the cached build was made with
    use_own_extensions_dir()  # DeepSpeed builds where TORCH_EXTENSIONS_DIR says: in our folder
    with build_lock(build_directory(builder.NAME)):
        builder.load(verbose=False)


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive flock on `folder` (one of ours, under extensions_root()) for one build; remove a
    `lock` file a killed build left. A folder elsewhere gets neither: it may be another program's."""
    ours = Path(os.path.realpath(cache_dir())) in Path(os.path.realpath(folder)).parents
    if not ours:
        raise ValueError(f"build_lock({folder}): not a build folder of ours (under {cache_dir()})")
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
