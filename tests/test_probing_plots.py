"""app/probing/plots.py: the neuron's figures are scaled to the values drawn and say what they show."""

from __future__ import annotations

import numpy as np
import pytest
from run_files import check_png

from app.probing.plots import FONT_SIZE, color_limits, heatmap, histogram, histogram_title


def test_the_colour_scale_follows_the_values_drawn():
    """A neuron between 0.6 and 0.9 spans the whole scale (a fixed [-1, 1] painted every cell one dark red);
    values on both sides of 0 keep 0 in the middle; an outlier does not wash the rest out."""
    rng = np.random.default_rng(0)
    lo, hi = color_limits([rng.uniform(0.6, 0.9, 300).astype(np.float32), np.asarray([np.nan, 0.75])])
    assert 0.6 <= lo < 0.62 and 0.88 < hi <= 0.9
    lo, hi = color_limits([np.linspace(-0.2, 0.5, 101)])
    assert lo == -hi and hi == pytest.approx(0.486, abs=1e-3)
    lo, hi = color_limits([np.r_[np.linspace(0.1, 0.2, 200), 50.0]])
    assert hi < 0.21
    lo, hi = color_limits([np.full(10, 0.7)])
    assert lo < 0.7 < hi and hi - lo < 0.01


def test_the_figures_are_drawn_with_their_titles(tmp_path):
    assert histogram_title("final_cell", 1, 37, 0.8125) == (
        "final_cell, layer 1, unit 37: alone it classifies 81.2% of the test texts"
    )
    rng = np.random.default_rng(1)
    histogram(tmp_path / "h.png", rng.normal(size=50), rng.integers(0, 2, 50), ["neg", "pos"], 37, "t")
    text = "A line of text\\nand a second one, long enough to wrap " * 3
    heatmap(tmp_path / "m.png", [(text, rng.uniform(0.6, 0.9, len(text)).astype(np.float32), "pos")], 37)
    check_png(tmp_path / "h.png")
    check_png(tmp_path / "m.png")
    assert FONT_SIZE >= 9  # letters read at the figure's size
