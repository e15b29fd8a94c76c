"""The build tools a JIT-compiled extension (the fused core, DeepSpeed's CPU comm op) runs with.

torch's `cpp_extension.load` runs `ninja` from PATH. A rank started by pdsh/ssh (DeepSpeed's multi-node
launcher) runs this environment's python without the environment being activated, so PATH finds the
system's ninja instead of the one installed with the project (the `ninja` dependency). Two ninja versions
keep build logs in different formats, so each one discards the other's cached build in a shared
TORCH_EXTENSIONS_DIR and compiles again: measured 25-40 s per extension per launch, alternating between
the nodes' ranks and the launching node's processes.
"""

from __future__ import annotations

import os
import sysconfig


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
