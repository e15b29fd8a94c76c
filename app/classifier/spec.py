"""Which features a classifier reads: the kinds and the --layer spelling. No torch here: the configs of
app/transfer.py and app/classify.py import it to check their flags."""

from __future__ import annotations

import typing
from typing import Literal

Feature = Literal["final_cell", "final_hidden", "mean_hidden", "max_hidden"]
FEATURES: tuple[str, ...] = typing.get_args(Feature)


def parse_layers(spec: str, num_layers: int) -> list[int]:
    """--layer: "-1" (the last), "0", "0,2" (side by side, in this order) or "all" -> 0-based indices."""
    if spec.strip() == "all":
        return list(range(num_layers))
    try:
        picked = [int(v) for v in spec.split(",")]
    except ValueError:
        raise ValueError(f"--layer must be an integer, a comma list of them or all, got {spec!r}") from None
    for i in picked:
        if not -num_layers <= i < num_layers:
            raise ValueError(
                f"--layer {spec}: the model has {num_layers} recurrent layers (0..{num_layers - 1}, or -1)"
            )
    out = [i % num_layers for i in picked]
    if len(set(out)) != len(out):
        raise ValueError(f"--layer {spec}: a layer is named twice")
    return out
