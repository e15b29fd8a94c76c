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


def histogram(path: Path, values: np.ndarray, y: np.ndarray, names: list[str], neuron: int) -> None:
    """values (N,) of one neuron, y (N,) class indices."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    bins = np.histogram_bin_edges(values, bins=40)
    for k, name in enumerate(names):
        ax.hist(values[y == k], bins=bins, alpha=0.55, label=f"{name} ({int((y == k).sum())})")
    ax.set_xlabel(f"neuron {neuron}")
    ax.set_ylabel("test texts")
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


def heatmap(path: Path, texts: list[tuple[str, np.ndarray, str]], neuron: int) -> None:
    """texts: (text, per-character values, label name). Colour scale shared, centred on 0."""
    plt = _pyplot()
    grids = [(_grid(t, v), name) for t, v, name in texts]
    heights = [max(1, len(g[0][0])) for g in grids]
    lim = max(float(np.nanmax(np.abs(g[0][1]))) if g[0][1].size else 1.0 for g in grids) or 1.0
    fig, axes = plt.subplots(
        len(grids), 1, figsize=(12, 0.28 * sum(heights) + 0.6 * len(grids)), squeeze=False
    )
    fig.subplots_adjust(hspace=0.6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # glyphs missing from the default font are drawn as boxes
        for ax, ((lines, vals), name) in zip(axes[:, 0], grids):
            img = ax.imshow(vals, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
            for r, line in enumerate(lines):
                for c, ch in enumerate(line):
                    ax.text(c, r, ch, ha="center", va="center", fontsize=7, family="monospace")
            ax.set_title(f"label: {name}", fontsize=9, loc="left")
            ax.set_xticks([])
            ax.set_yticks([])
        fig.colorbar(img, ax=axes[:, 0].tolist(), shrink=0.6, label=f"neuron {neuron}")
        fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
