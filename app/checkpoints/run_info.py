"""What a checkpoint's run says about it, for the model card: the run's resolved config (as the
checkpoint recorded it), the data summary recorded with it (never read from the data folder the run named:
that is outside what the export is handed), the end-of-training metrics and app/evaluate.py's results for
this checkpoint. Every piece is optional: a card states what it lacks. JSON only: nothing found here is
executed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.checkpoints.loader import Source
from app.checkpoints.training import read_app_state


@dataclass(frozen=True, slots=True)
class RunInfo:
    run_name: str | None = None  # the run folder's name (never its path)
    config: dict | None = None  # the resolved run config the checkpoint recorded
    data_meta: dict | None = None  # the prepared data's meta.json
    final_metrics: dict | None = None  # final_metrics.json, when it is this checkpoint's step
    evaluation: dict | None = None  # app/evaluate.py's JSON for this checkpoint


def run_dir_of(src: Source) -> Path | None:
    """<run> of <run>/checkpoints/<tag>; None for an export or a loose checkpoint folder."""
    if src.kind == "checkpoint" and src.path.parent.name == "checkpoints":
        return src.path.parent.parent
    return None


def eval_result_path(src: Source) -> Path:
    """Where app/evaluate.py writes its results for `src` by default."""
    if src.kind == "export":
        return src.path / "eval.json"
    run = run_dir_of(src) or src.path.parent
    return run / "eval" / f"{src.path.name}.json"


def _read(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def read_run_info(src: Source) -> RunInfo:
    if src.kind != "checkpoint":
        return RunInfo(evaluation=_read(eval_result_path(src)))
    run = run_dir_of(src)
    config = read_app_state(src.path).get("config")
    config = config if isinstance(config, dict) else None
    summary = ((config or {}).get("data") or {}).get("summary")  # recorded in the checkpoint, not re-read
    final = _read(run / "final_metrics.json") if run is not None else None
    return RunInfo(
        run_name=run.name if run is not None else None,
        config=config,
        data_meta=summary if isinstance(summary, dict) else None,
        final_metrics=final if final is not None and final.get("step") == src.step else None,
        evaluation=_read(eval_result_path(src)),
    )
