"""The two figures of the sentiment-neuron paper, with matplotlib (Agg: no display needed).

- a histogram of the top neuron's value on the test texts, one colour per class;
- the top neuron's value after each character of a few test texts, as coloured cells behind the text.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

WRAP = 72  # characters per heatmap line
MAX_CHARS = 720  # per text drawn


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def histogram_title(kind: str, layer: int, unit: int, accuracy: float, balanced: bool = False) -> str:
    """What the histogram shows: the feature kind, where the neuron is, what it achieves alone (`balanced`:
    the mean of its accuracy on the texts with and without the label)."""
    if balanced:
        return (
            f"{kind}, layer {layer}, unit {unit}: alone, balanced accuracy {accuracy:.1%} on the test texts"
        )
    return f"{kind}, layer {layer}, unit {unit}: alone it classifies {accuracy:.1%} of the test texts"


def histogram(
    path: Path, values: np.ndarray, y: np.ndarray, names: list[str], neuron: int, title: str
) -> None:
    """values (N,) of one neuron, y (N,) class indices."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    bins = np.histogram_bin_edges(values, bins=40)
    for k, name in enumerate(names):
        ax.hist(values[y == k], bins=bins, alpha=0.55, label=f"{name} ({int((y == k).sum())})")
    ax.set_xlabel(f"neuron {neuron}")
    ax.set_ylabel("test texts")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def char_values(tokenizer, ids: np.ndarray, trace: np.ndarray) -> tuple[str, np.ndarray]:
    """Spread per-token values (trace[t] after token ids[t]; ids[0] is BOS) over the characters each
    token decodes to, by decoding growing prefixes (a token may end inside a character: it then shares
    the character with the next one)."""
    text, vals, done = "", [], 0
    for t in range(1, len(ids)):
        text = tokenizer.decode(ids[1 : t + 1].tolist())
        vals.extend([trace[t]] * (len(text) - done))
        done = len(text)
        if done >= MAX_CHARS:
            break
    return text[:MAX_CHARS], np.asarray(vals[:MAX_CHARS], dtype=np.float32)


def _grid(text: str, vals: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Lay characters out in lines of WRAP (newlines break lines) -> (lines, values (rows, WRAP), NaN = blank)."""
    lines, rows, cur, cur_v = [], [], "", []
    for ch, v in zip(text, vals):
        if ch != "\n":
            cur += ch if ch.isprintable() else " "
            cur_v.append(v)
        if ch == "\n" or len(cur) == WRAP:
            lines.append(cur)
            rows.append(cur_v + [np.nan] * (WRAP - len(cur_v)))
            cur, cur_v = "", []
    if cur:
        lines.append(cur)
        rows.append(cur_v + [np.nan] * (WRAP - len(cur_v)))
    return lines, np.asarray(rows, dtype=np.float32).reshape(-1, WRAP)


def color_limits(values: list[np.ndarray]) -> tuple[float, float]:
    """The colour scale of the values drawn: from their low end to their high end (2nd and 98th
    percentiles, so one outlier does not wash the rest out), centred on 0 where they straddle it so red
    and blue keep their sign; a neuron that moves between 0.6 and 0.9 shows that whole range."""
    flat = np.concatenate([v[np.isfinite(v)] for v in values] or [np.zeros(0)])
    if flat.size == 0:
        return -1.0, 1.0
    lo, hi = (float(x) for x in np.percentile(flat, [2, 98]))
    if lo < 0 < hi:
        lim = max(-lo, hi)
        return -lim, lim
    if hi - lo < 1e-6:  # a constant trace: a small band around it
        return lo - 0.5e-6 - 1e-3 * abs(lo), hi + 0.5e-6 + 1e-3 * abs(hi)
    return lo, hi


CELL_W, CELL_H, TRACE_H = 0.17, 0.32, 0.9  # inches: a monospace letter at FONT_SIZE fits a cell
FONT_SIZE = 10


def heatmap(path: Path, texts: list[tuple[str, np.ndarray, str]], neuron: int) -> None:
    """texts: (text, per-character values, label name). For each text, the neuron's value along it (a
    trace, as sentiment-discovery's visualize draws it) over the text itself, one cell per character
    coloured by the value, its letter drawn in black or white, whichever reads on that colour. One colour
    scale for all, set by the values drawn (`color_limits`)."""
    plt = _pyplot()
    from matplotlib.colors import Normalize

    grids = [(_grid(t, v), v, name) for t, v, name in texts]
    vmin, vmax = color_limits([v for _, v, _ in grids])
    norm, cmap = Normalize(vmin, vmax), plt.get_cmap("RdBu_r")
    heights = [r for (lines, _), _, _ in grids for r in (TRACE_H, CELL_H * max(1, len(lines)))]
    fig, axes = plt.subplots(
        len(heights), 1, figsize=(CELL_W * WRAP + 1.5, sum(heights) + 0.5 * len(grids) + 0.4),
        gridspec_kw={"height_ratios": heights, "hspace": 0.45}, squeeze=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # glyphs missing from the default font are drawn as boxes
        for i, ((lines, vals), trace, name) in enumerate(grids):
            top, ax = axes[2 * i, 0], axes[2 * i + 1, 0]
            top.plot(np.arange(len(trace)), trace, lw=1.0, color="0.25")
            top.set_xlim(-0.5, max(1, len(trace)) - 0.5)
            top.set_title(f"label: {name}", fontsize=FONT_SIZE, loc="left")
            top.tick_params(labelsize=8, labelbottom=False)
            top.grid(alpha=0.3)
            img = ax.imshow(vals, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
            for r, line in enumerate(lines):
                for c, ch in enumerate(line):
                    dark = sum(cmap(norm(vals[r, c]))[:3]) < 1.2  # a dark cell: a white letter
                    ax.text(c, r, ch, ha="center", va="center", fontsize=FONT_SIZE, family="monospace",
                            color="white" if dark else "black")  # fmt: skip
            ax.set_xticks([])
            ax.set_yticks([])
        fig.colorbar(img, ax=axes[:, 0].tolist(), shrink=0.6, label=f"neuron {neuron}")
        fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
