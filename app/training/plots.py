"""Pictures of a run from its metrics.jsonl (matplotlib, Agg: no display), with or without W&B.

- `plot_run(run_dir)`: <run>/plots/ loss.png and bpb.png (train and validation, vs step and vs tokens),
  lr.png, throughput.png (tokens/s and MFU). Rank 0 rewrites them at each validation and at the end.
- `plot_runs(run_dirs, out)`: several runs compared in one figure (`app/plot.py`): bits per byte against
  the bytes of text seen and against the wall clock (a SentencePiece run and a byte run compare there,
  where nats per token would make the byte run look twice as good), the gradient norm, the learning rate,
  the throughput, and the wall clock itself.

Train curves are drawn raw (faint) under a moving average; validation points are the periodic and final
evaluations ("val/..."). The figure API (`matplotlib.figure.Figure`) is used, not pyplot: no global
figure registry, nothing kept alive between calls.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.common.errors import UserError
from app.common.files import atomic_write
from app.common.logs import get_logger

PLOTS_DIR = "plots"
DPI = 90


@dataclass(slots=True)
class Curves:
    """One run's metrics as step-sorted arrays; a step logged twice (a resumed run) keeps its last record."""

    name: str
    train: dict[str, np.ndarray] = field(default_factory=dict)  # "step", "tokens", "train/loss", ...
    val: dict[str, np.ndarray] = field(default_factory=dict)  # "step", "tokens", "val/loss", "val/bpb"


def read_metrics(path: Path) -> tuple[list[dict], int]:
    """-> (records, unreadable lines). A half-written last line (a killed run) is not an error."""
    records, bad = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            rec["step"] = int(rec["step"])
            records.append(rec)
        except (ValueError, TypeError, KeyError):
            bad += 1
    return records, bad


def _number(v: object) -> float:
    """metrics.jsonl writes non-finite floats as strings ("nan", "inf")."""
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def curves(name: str, records: list[dict]) -> Curves:
    by_step: dict[str, dict[int, dict]] = {"train": {}, "val": {}}
    for rec in records:
        for kind in by_step:
            if f"{kind}/loss" in rec:
                by_step[kind].setdefault(rec["step"], {}).update(rec)
    out = Curves(name)
    train = [by_step["train"][s] for s in sorted(by_step["train"])]
    keys = ("train/loss", "train/bpb", "train/lr", "train/tokens_per_s", "train/mfu", "train/grad_norm")
    out.train = {k: np.asarray([_number(r.get(k)) for r in train]) for k in keys}
    out.train["step"] = np.asarray([r["step"] for r in train], dtype=np.int64)
    out.train["tokens"] = np.asarray([_number(r.get("train/tokens")) for r in train])
    out.train["bytes"], out.train["seconds"] = _bytes_and_seconds(train, out.train)
    val = [by_step["val"][s] for s in sorted(by_step["val"])]
    out.val = {k: np.asarray([_number(r.get(k)) for r in val]) for k in ("val/loss", "val/bpb")}
    out.val["step"] = np.asarray([r["step"] for r in val], dtype=np.int64)
    # a validation at step s has seen the tokens (bytes, seconds) of steps 1..s
    for x in ("tokens", "bytes", "seconds"):
        at = dict(zip(out.train["step"].tolist(), out.train[x].tolist()))
        out.val[x] = np.asarray([at.get(s, math.nan) for s in out.val["step"].tolist()])
    return out


def _bytes_and_seconds(train: list[dict], t: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The bytes of text seen and the training seconds at each step: as recorded (train/bytes,
    train/elapsed_s), or, in a run that did not record them, from each step's figures (its bytes are
    loss x tokens / ln 2 / bits-per-byte; its seconds, tokens over tokens/s: the steps' own time)."""
    recorded = (
        [_number(r.get("train/bytes")) for r in train],
        [_number(r.get("train/elapsed_s")) for r in train],
    )
    if train and all(math.isfinite(b) for b in recorded[0] + recorded[1]):
        return np.asarray(recorded[0]), np.asarray(recorded[1])
    step_tokens = np.diff(t["tokens"], prepend=0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        step_bytes = t["train/loss"] * step_tokens / math.log(2) / t["train/bpb"]
        step_seconds = step_tokens / t["train/tokens_per_s"]
    return np.nancumsum(step_bytes), np.nancumsum(step_seconds)


def smooth(y: np.ndarray) -> np.ndarray:
    """Trailing moving average over ~2% of the points (at least 1): the trend under a noisy curve."""
    w = max(1, len(y) // 50)
    if w == 1:
        return y
    c = np.cumsum(np.insert(np.nan_to_num(y), 0, 0.0))
    out = np.empty_like(y, dtype=np.float64)
    out[w - 1 :] = (c[w:] - c[:-w]) / w
    out[: w - 1] = c[1:w] / np.arange(1, w)
    return out


def _figure(panels: int, rows: int = 1):
    import matplotlib

    matplotlib.use("Agg")  # before anything draws: no display is needed or wanted
    from matplotlib.figure import Figure

    cols = -(-panels // rows)
    fig = Figure(figsize=(5.0 * cols, 3.4 * rows))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    return fig, axes


def _save(fig, path: Path) -> None:
    import io

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    atomic_write(path, buf.getvalue())  # a reader (or W&B, or a browser) never sees half a PNG


def _style(ax, xlabel: str, ylabel: str, log_x: bool = False) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if log_x:
        ax.set_xscale("log")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _train_val(ax, c: Curves, metric: str, x: str, color: str | None = None, label: str = "") -> None:
    """Train `metric` (raw, faint, under its moving average) and validation points, against `x`."""
    tx, ty = c.train[x], c.train[f"train/{metric}"]
    if len(tx):
        line = ax.plot(tx, ty, lw=0.6, alpha=0.3, color=color)[0]
        color = line.get_color()
        ax.plot(tx, smooth(ty), lw=1.4, color=color, label=f"{label}train".strip())
    if len(c.val["step"]):
        ax.plot(c.val[x], c.val[f"val/{metric}"], "o-", ms=4, lw=1, color=color, alpha=0.9,
                label=f"{label}validation".strip(), markerfacecolor="white")  # fmt: skip


UNITS = {"loss": "loss (nats/token)", "bpb": "bits/byte"}


def plot_run(run_dir: Path) -> list[Path]:
    """(Re)write <run>/plots/*.png from <run>/metrics.jsonl; returns the files written."""
    path = Path(run_dir) / "metrics.jsonl"
    records, _ = read_metrics(path) if path.exists() else ([], 0)
    c = curves(Path(run_dir).name, records)
    if not len(c.train["step"]) and not len(c.val["step"]):
        return []
    out = Path(run_dir) / PLOTS_DIR
    out.mkdir(exist_ok=True)
    written = []
    for metric in ("loss", "bpb"):
        fig, (by_step, by_tokens) = _figure(2)
        _train_val(by_step, c, metric, "step")
        _style(by_step, "step", UNITS[metric])
        _train_val(by_tokens, c, metric, "tokens")
        _style(by_tokens, "tokens seen", UNITS[metric])
        fig.suptitle(f"{c.name}: {UNITS[metric]}", fontsize=10)
        _save(fig, out / f"{metric}.png")
        written.append(out / f"{metric}.png")
    fig, (ax,) = _figure(1)
    ax.plot(c.train["step"], c.train["train/lr"], lw=1.2)
    _style(ax, "step", "learning rate")
    fig.suptitle(f"{c.name}: learning rate", fontsize=10)
    _save(fig, out / "lr.png")
    fig, (tps, mfu) = _figure(2)
    tps.plot(c.train["step"], c.train["train/tokens_per_s"], lw=0.6, alpha=0.3)
    tps.plot(c.train["step"], smooth(c.train["train/tokens_per_s"]), lw=1.4, color="C0")
    _style(tps, "step", "tokens/s (global batch)")
    mfu.plot(c.train["step"], 100 * smooth(c.train["train/mfu"]), lw=1.4, color="C1")
    _style(mfu, "step", "MFU % (of the peak in the run log)")
    fig.suptitle(f"{c.name}: throughput", fontsize=10)
    _save(fig, out / "throughput.png")
    return [*written, out / "lr.png", out / "throughput.png"]


def _run_curves(run: str) -> Curves:
    """RUN: a run directory or its metrics.jsonl."""
    p = Path(run)
    path = p / "metrics.jsonl" if p.is_dir() else p
    if not path.is_file():
        raise UserError(f"{run}: no metrics.jsonl (expected a run directory or a metrics.jsonl file)")
    records, bad = read_metrics(path)
    if bad:
        get_logger().warning(f"{path}: skipped {bad} unreadable line(s)")
    c = curves(p.name if p.is_dir() else p.parent.name, records)
    if not len(c.train["step"]) and not len(c.val["step"]):
        raise UserError(f"{path}: no training or validation records")
    return c


def _compare(ax, c: Curves, x: str, scale: float, color: str, label: str) -> None:
    """Bits per byte against `x` (train: moving average; validation: points), x divided by `scale`."""
    if len(c.train["step"]):
        ax.plot(c.train[x] / scale, smooth(c.train["train/bpb"]), lw=1.0, alpha=0.6, color=color)
    if len(c.val["step"]):
        ax.plot(c.val[x] / scale, c.val["val/bpb"], "o-", ms=4, lw=1.4, color=color, label=label)


def plot_runs(runs: list[str], out: Path) -> list[Curves]:
    """Runs compared in one figure: bits per byte (a line: train, moving average; points: validation)
    against the MB of text seen and against the wall clock; gradient norm, learning rate and tokens/s
    against steps; the wall clock against steps."""
    all_curves = [_run_curves(r) for r in runs]
    names = [c.name for c in all_curves]
    fig, axes = _figure(6, rows=2)
    by_bytes, by_time, gnorm, lr, tps, clock = axes
    for i, c in enumerate(all_curves):
        color, label = f"C{i % 10}", c.name if names.count(c.name) == 1 else f"{c.name} ({runs[i]})"
        _compare(by_bytes, c, "bytes", 1e6, color, label)
        _compare(by_time, c, "seconds", 60.0, color, label)
        if len(c.train["step"]):
            s = c.train["step"]
            gnorm.plot(s, smooth(c.train["train/grad_norm"]), lw=1.2, color=color, label=label)
            lr.plot(s, c.train["train/lr"], lw=1.2, color=color, label=label)
            tps.plot(s, smooth(c.train["train/tokens_per_s"]), lw=1.2, color=color, label=label)
            clock.plot(s, c.train["seconds"] / 60.0, lw=1.2, color=color, label=label)
    _style(by_bytes, "MB of text seen", "bits/byte (line: train, points: validation)")
    _style(by_time, "training time (min)", "bits/byte (line: train, points: validation)")
    _style(gnorm, "step", "gradient norm (moving average)")
    _style(lr, "step", "learning rate")
    _style(tps, "step", "tokens/s (moving average)")
    _style(clock, "step", "training time (min)")
    fig.suptitle(
        f"{' vs '.join(dict.fromkeys(names))}: bits per byte against the text seen and the wall clock",
        fontsize=11,
    )
    try:
        _save(fig, out)
    except OSError as e:
        raise UserError(f"--out {out}: cannot write ({e.strerror or e})") from None
    return all_curves
