"""The DeepSpeed JSONs shipped with the package: `--deepspeed_config gpu_bf16_pp2_zero1.json` works from any
directory and from a non-editable `pip install .`, where no ds_configs/ folder sits beside the run.

In the source tree `app/ds_configs` is a link to the top-level `ds_configs/`; a wheel holds the files
themselves (package data, pyproject.toml).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from app.common.errors import UserError

SHIPPED_DIR = "ds_configs"


def shipped_configs() -> dict[str, Path]:
    """{file name: path} of the packaged DeepSpeed JSONs."""
    folder = resources.files("app") / SHIPPED_DIR
    if not folder.is_dir():
        return {}
    return {p.name: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".json")}


def resolve_ds_config(path: str, flag: str) -> Path:
    """`path` when it exists; else the shipped config of that name (`x.json`, `ds_configs/x.json`, or `x`);
    else one line naming the flag, the path and the shipped names."""
    given = Path(path)
    if given.exists():
        return given
    shipped = shipped_configs()
    parts = given.parts
    if len(parts) == 1 or (len(parts) == 2 and parts[0] == SHIPPED_DIR):
        name = parts[-1] if parts[-1].endswith(".json") else parts[-1] + ".json"
        if name in shipped:
            return shipped[name]
    names = ", ".join(sorted(shipped)) or "none (this install has no ds_configs)"
    raise UserError(f"{flag}: file not found: {path}; not a shipped config either (shipped: {names})")
