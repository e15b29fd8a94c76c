"""Run tracking on rank 0: metrics.jsonl and samples.jsonl always, Weights & Biases when it can (never fatal).

W&B gets the resolved run config (config.json) as its config, every metric, a table of the samples taken
at each validation, and model artifacts (exports). Artifact files are staged, as W&B does before an
upload, under the run's own wandb/ folder (`WANDB_DATA_DIR`, unless set): a model-sized copy belongs with
the run, not in a home directory that may have a small quota.
"""

from __future__ import annotations

import contextlib
import json
import math
import netrc
import os
from pathlib import Path

from app.common.files import atomic_write
from app.common.logs import get_logger


def resolve_wandb_mode(flag: str | None) -> str:
    """--wandb-mode, else $WANDB_MODE, else online when an API key is configured, else offline.

    With no key we never go online: wandb would otherwise stop and prompt for one.
    """
    if flag:
        return flag
    env = os.environ.get("WANDB_MODE", "").lower()
    if env in ("online", "offline", "disabled"):
        return env
    if env == "dryrun":
        return "offline"
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


SAMPLES_FILE = "samples.jsonl"
RUN_ID_FILE = "wandb/run_id"  # the W&B run's id, so a resume continues it even with no checkpoint yet


def recorded_run_id(run_dir: Path) -> str | None:
    """The W&B run id an earlier start in `run_dir` recorded, or None."""
    path = run_dir / RUN_ID_FILE
    text = path.read_text().strip() if path.is_file() else ""
    return text if text.isalnum() else None


SAMPLE_FIELDS = ("prompt", "text", "stop")
SAMPLE_COLUMNS = ["step", "prompt", "text", "new_tokens", "stop"]


class Tracker:
    """Writes every logged dict to `<run>/metrics.jsonl` and, if enabled, to W&B."""

    def __init__(
        self,
        run_dir: Path,
        *,
        project: str,
        mode: str,
        name: str,
        config: dict,
        resume_id: str | None,
        rewind_to: int | None = None,
        system_metrics: bool = True,
    ):
        self.log = get_logger()
        self.jsonl = (run_dir / "metrics.jsonl").open("a", buffering=1)
        self.samples_path = run_dir / SAMPLES_FILE
        self.run = None
        self.mode = mode
        if mode == "disabled":
            return
        os.environ.setdefault("WANDB_SILENT", "true")
        os.environ.setdefault("WANDB_DATA_DIR", str(run_dir / "wandb"))
        try:
            import wandb

            self.run = self._init(
                wandb, run_dir, project, mode, name, config, resume_id, rewind_to, system_metrics
            )
        except Exception as e:  # a tracking outage must never stop training
            self.log.warning(f"W&B {mode} init failed ({e.__class__.__name__}: {e}); trying offline")
            if mode == "online":
                try:
                    import wandb

                    self.run = self._init(
                        wandb, run_dir, project, "offline", name, config, resume_id, rewind_to, system_metrics
                    )
                    self.mode = "offline"
                except Exception as e2:
                    self.log.warning(f"W&B disabled for this run ({e2.__class__.__name__}: {e2})")
        if self.run is not None:
            self.log.info(f"W&B {self.mode} run {self.run.id} in {run_dir / 'wandb'}")
            atomic_write(run_dir / RUN_ID_FILE, self.run.id + "\n")

    @staticmethod
    def _init(wandb, run_dir, project, mode, name, config, resume_id, rewind_to, system_metrics):
        # A resume behind what W&B already holds (an older checkpoint, or steps logged after the last
        # save) rewinds the W&B run to the checkpoint's step (`resume_from`, recorded offline as the run's
        # branch point and applied on sync), so the re-run steps replace the old ones as in metrics.jsonl;
        # with `resume="allow"` W&B would keep the old values and drop the re-run steps as non-monotonic.
        rewind = resume_id is not None and rewind_to is not None
        return wandb.init(
            project=project,
            name=name,
            dir=str(run_dir),
            mode=mode,
            config=config,
            id=None if rewind else resume_id,
            resume="allow" if resume_id and not rewind else None,
            resume_from=f"{resume_id}?_step={rewind_to}" if rewind else None,
            settings=wandb.Settings(
                init_timeout=60, console="off", save_code=False, x_disable_stats=not system_metrics
            ),
        )

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run is not None else None

    def log_metrics(self, metrics: dict, step: int) -> None:
        clean = {
            k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in metrics.items()
        }
        self.jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        if self.run is not None:
            try:
                self.run.log(metrics, step=step)
            except Exception as e:
                self.log.warning(
                    f"W&B log failed ({e.__class__.__name__}); continuing with metrics.jsonl only"
                )
                self.run = None

    def log_samples(self, rows: list[dict], step: int) -> None:
        """Sampled texts: appended to samples.jsonl, and one W&B table per validation (step, prompt, text)."""
        with self.samples_path.open("a", encoding="utf-8") as f:
            for r in rows:
                f.write(
                    json.dumps({"step": step, **{k: r[k] for k in SAMPLE_FIELDS}}, ensure_ascii=False) + "\n"
                )
        if self.run is None:
            return
        try:
            import wandb

            data = [[step, r["prompt"], r["text"], len(r["tokens"]), r["stop"]] for r in rows]
            self.run.log({"samples": wandb.Table(columns=SAMPLE_COLUMNS, data=data)}, step=step)
        except Exception as e:
            self.log.warning(
                f"W&B samples table failed ({e.__class__.__name__}: {e}); kept in {SAMPLES_FILE}"
            )

    def log_model(self, folder: Path, aliases: list[str], metadata: dict) -> bool:
        """`folder` (an export) as version of the run's model artifact "model-<run id>". Never fatal.

        The files are copied to W&B's staging folder before this returns, so `folder` may then be removed.
        """
        if self.run is None:
            return False
        try:
            import wandb

            art = wandb.Artifact(f"model-{self.run.id}", type="model", metadata=metadata)
            art.add_dir(str(folder))
            self.run.log_artifact(art, aliases=aliases)
            return True
        except Exception as e:
            self.log.warning(f"W&B model artifact failed ({e.__class__.__name__}: {e}); training goes on")
            return False

    def summary(self, values: dict) -> None:
        if self.run is not None:
            with contextlib.suppress(Exception):
                self.run.summary.update(values)

    def close(self) -> None:
        self.jsonl.close()
        if self.run is not None:
            offline_dir = Path(self.run.dir).parent if self.mode == "offline" else None  # .../offline-run-*
            try:
                self.run.finish()
            except Exception as e:
                self.log.warning(f"W&B finish failed ({e.__class__.__name__})")
                return
            if offline_dir is not None:
                self.log.info(f"W&B run saved offline; to upload it: wandb sync {offline_dir}")


def truncate_metrics(run_dir: Path, step: int) -> int:
    """On resume, drop metrics.jsonl and samples.jsonl records of steps after the checkpoint: the resumed
    run writes them again.

    A line that is not a JSON object (the half-written last line of a killed run) is dropped with a
    warning. Returns the highest step metrics.jsonl had recorded (0 for none), so W&B can be rewound to match.
    """
    truncate_jsonl(run_dir / SAMPLES_FILE, step)
    return truncate_jsonl(run_dir / "metrics.jsonl", step)


def truncate_jsonl(path: Path, step: int) -> int:
    """Keep the records of `path` up to `step`; returns the highest step it held (0 for none)."""
    if not path.exists():
        return 0
    keep, bad, last = [], [], 0
    for n, ln in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
            at = int(rec.get("step", 0))
        except (ValueError, TypeError, AttributeError):
            bad.append(n)
            continue
        last = max(last, at)
        if at <= step:
            keep.append(ln)
    if bad:
        get_logger().warning(
            f"{path}: dropped {len(bad)} unreadable line(s) (line {', '.join(map(str, bad[:5]))}; a run killed "
            f"mid-write leaves a partial last line)"
        )
    atomic_write(path, "".join(ln + "\n" for ln in keep))
    return last
