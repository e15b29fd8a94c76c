"""The core's matrix products, each routed to the kernel that measured fastest on THIS machine.

CPU float32 / bfloat16 `x @ w.T` has two candidate paths: `torch.mm` with a transposed view (MKL for
fp32, oneDNN for bf16) and oneDNN's linear (`torch.ops.mkldnn._linear_pointwise`). Which wins depends on
the CPU and the shape: on a Zen 5 box oneDNN won the per-step products of the large model 1.3-2x; on an
AVX2 EPYC, MKL won the input projection; at (16 x 256) @ (256 x 256) MKL won by ~1.5x on a Zen 4. So the
first product of each (kind, K, N, dtype) times every row bucket on every available path (a few ms,
rows capped so the big input projection is timed on a slice), the winner is cached for the process and
logged once at INFO. Kinds: "linear" (products made with torch ops) and "step" (the fused core's
per-step products, which also have its packed GEMM; app/model/fused_core.py registers those paths, and
float64 is measured too). Set MLSTM_MATMUL=<path> to force a path wherever a product has it (e.g. for
bitwise reproducibility across processes). CUDA, float64 "linear" and anything else go straight to
`F.linear` / `torch.mm`.

bf16 on CPU is worth it only where the hardware runs it natively (AVX512-BF16 / AMX); elsewhere oneDNN
emulates it several times slower than fp32. `bf16_is_native()` decides from oneDNN's report of native
bf16 and a timing of a bf16 product against fp32; the trainer warns when a DS JSON asks for bf16 on a
CPU where it is not native (app/parallel/precision.py).

Weight gradients (`grad_weight`) stay on `torch.mm` with a transposed view (MKL/oneDNN take the
transpose for free; oneDNN's linear op would copy it). Nothing here records autograd; the helpers are
called inside the custom autograd Functions.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

_ONEDNN_LINEAR = (
    getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
)
MEASURED_DTYPES = (torch.float32, torch.bfloat16)  # "linear" products; "step" ones also in float64
_ALL_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
# Rows timed for a product; above this the kernels' relative speed no longer moves much. A per-step
# product has B rows (the micro-batch), so its kind stops lower. A wide product stops sooner still: no timed
# product is over _TIMED_MACS multiply-adds (about 20 ms on one core), so the first product of a 4096-wide
# layer (K x N = 4096 x 16384) times up to 16 rows, not 1024 (each burst of those took over a second: the first
# generate of an imported 4096-wide model spent 5 minutes timing), and larger row counts take 16's choice.
_ROWS_CAP = {"linear": 1024, "step": 256}
_TIMED_MACS = 1 << 30

_choice: dict[tuple, dict[int, str]] = {}  # (kind, K, N, dtype) -> {rows bucket: path name}
_bf16_native: list[bool] = []


@dataclass(frozen=True)
class Path:
    """One way to compute x (M, K) @ w (N, K).T: `prepare(w)` once per weight (untimed: done once per
    sequence), then `run(x, prepared)` per product (timed). `dtypes`: the compute dtypes it takes."""

    run: Callable[[torch.Tensor, object], torch.Tensor]
    prepare: Callable[[torch.Tensor], object] = lambda w: w
    dtypes: tuple[torch.dtype, ...] = _ALL_DTYPES


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, w.t())


def _onednn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _ONEDNN_LINEAR(x, w, None, "none", [], "")


@functools.cache
def _onednn_dtypes() -> tuple[torch.dtype, ...]:
    """fp32, plus bf16 where oneDNN has bf16 kernels for this CPU: on an AVX2-only CPU (no AVX512-BF16 /
    AVX512-BW) `_linear_pointwise` raises "could not create a primitive descriptor" for bf16 operands, so
    bf16 products there run on torch.mm alone."""
    return (
        (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)
    )


# Kinds of product: "linear" (a product made by torch ops: the input projection, the Python core's
# per-step products) and "step" (a per-step product inside the fused core, which adds its packed GEMM:
# app/model/fused_core.py registers it when the extension builds).
KINDS = ("linear", "step")
_extra: dict[str, dict[str, Path]] = {k: {} for k in KINDS}


def register_paths(kind: str, extra: dict[str, Path]) -> None:
    """Replace the extra candidate paths of `kind` (on top of mm / onednn)."""
    _extra[kind] = dict(extra)


def paths(kind: str = "linear", dtype: torch.dtype = torch.float32) -> dict[str, Path]:
    """The CPU paths this build has for `kind` and compute dtype, by name."""
    out = {"mm": Path(_mm)}
    if _ONEDNN_LINEAR is not None:
        out["onednn"] = Path(_onednn, dtypes=_onednn_dtypes())
    out.update(_extra[kind])
    return {name: p for name, p in out.items() if dtype in p.dtypes}


def _rows_cap(kind: str, k: int, n: int) -> int:
    """The most rows timed for a (K, N) product: the kind's cap, lowered to keep it under _TIMED_MACS."""
    fits = max(1, _TIMED_MACS // max(1, k * n))
    return min(_ROWS_CAP[kind], 1 << (fits.bit_length() - 1))


def _rows_bucket(m: int, kind: str, k: int = 1, n: int = 1) -> int:
    """Rows rounded up to a power of two (capped): variable-length batches share one measurement."""
    return min(_rows_cap(kind, k, n), 1 << max(0, (m - 1).bit_length()))


def _time_paths(fns: dict[str, Path], x: torch.Tensor, w: torch.Tensor, rounds: int = 5) -> dict[str, float]:
    """Seconds per product of each path: best of `rounds` bursts (~0.5 ms each), the paths interleaved
    within every round so that load from other processes on a shared machine hits them alike. After
    two rounds a path over twice the best so far stops being timed (it cannot win; on a loaded box a
    multi-threaded path can take milliseconds per tiny product). Single-threaded, the clock is this
    thread's CPU time, which other processes on the machine do not inflate; with more threads it is the
    wall clock (CPU time would not credit the parallelism)."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    n, prep = {}, {}
    for name, p in fns.items():
        prep[name] = p.prepare(w)
        p.run(x, prep[name])  # warm-up: oneDNN creates its primitive here
        t0 = clock()
        p.run(x, prep[name])
        n[name] = max(1, min(50, int(5e-4 / max(clock() - t0, 1e-7))))
    best = dict.fromkeys(fns, float("inf"))
    racing = dict(fns)
    for r in range(rounds):
        if r >= 2:
            racing = {k: p for k, p in racing.items() if best[k] <= 2 * min(best.values())}
        for name, p in racing.items():
            t0 = clock()
            for _ in range(n[name]):
                p.run(x, prep[name])
            best[name] = min(best[name], (clock() - t0) / n[name])
    return best


def _operands(m: int, k: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # A private generator: timing must not shift the run's global random stream.
    g = torch.Generator().manual_seed(0)
    x = torch.empty(m, k).uniform_(-1, 1, generator=g).to(dtype)
    w = torch.empty(n, k).uniform_(-1, 1, generator=g).to(dtype)
    return x, w


def _row_buckets(kind: str, k: int = 1, n: int = 1) -> list[int]:
    return [1 << i for i in range(_rows_cap(kind, k, n).bit_length())]  # 1, 2, 4, ..., the cap


def choose(m: int, k: int, n: int, dtype: torch.dtype, kind: str = "linear") -> str:
    """Fastest CPU path name for (m, k) @ (n, k).T in `dtype`, measured once per process and
    (kind, K, N, dtype).

    The first product of a (kind, K, N, dtype) times every row bucket at once, so every later row count
    is already decided. A run's products all appear in its first step, so by its first checkpoint the
    table is complete; the checkpoint keeps it (export_choices) and a resumed run restores it
    (restore_choices) instead of measuring again: the same kernels, so the same rounding, so a
    bit-exact resume. A restored table naming a path this process lacks is measured again.
    """
    avail = paths(kind, dtype)
    forced = os.environ.get("MLSTM_MATMUL")
    if forced:  # a path the product lacks (onednn for float64, a packed GEMM for "linear") is measured
        if forced in avail:
            return forced
        known = {name for kd in KINDS for dt in _ALL_DTYPES for name in paths(kd, dt)}
        if forced not in known:
            raise ValueError(f"MLSTM_MATMUL={forced!r}: available paths are {sorted(known)}")
    key = (kind, k, n, dtype)
    table = _choice.get(key)
    if table is None or not set(table.values()) <= set(avail):
        table = {}
        for rows in _row_buckets(kind, k, n):
            if len(avail) == 1:
                table[rows] = next(iter(avail))
                continue
            x, w = _operands(rows, k, n, dtype)
            times = _time_paths(avail, x, w)
            table[rows] = min(times, key=times.get)
        log.info(
            "matmul %s (rows) @ (%d x %d).T %s: %s",
            kind, n, k, str(dtype).removeprefix("torch."), ", ".join(f"{r}: {p}" for r, p in table.items()),
        )  # fmt: skip
        _choice[key] = table
    return table.get(_rows_bucket(m, kind, k, n)) or table[max(table)]  # a restored table may stop elsewhere


def export_choices() -> list:
    """This process's kernel table, JSON-able: [[K, N, dtype, {rows: path}, kind], ...]."""
    return [
        [k, n, str(dt).removeprefix("torch."), {str(r): p for r, p in t.items()}, kind]
        for (kind, k, n, dt), t in _choice.items()
    ]


def restore_choices(saved: list) -> None:
    """Take a checkpoint's kernel table (entries without a kind predate the fused core's: "linear").
    Kept as saved; `choose` measures again only where a path is missing in this process."""
    for k, n, dt, table, *kind in saved:
        key = (kind[0] if kind else "linear", int(k), int(n), getattr(torch, dt))
        _choice[key] = {int(r): p for r, p in table.items()}


# glibc serves every allocation above its mmap ceiling (32 MiB on 64-bit) with fresh pages from the OS, so
# a product whose result is that large page-faults all of it on every call (measured: 41K faults, ~0.3 s,
# per input projection of the large layer). Given a caller's buffer, oneDNN's linear (which allocates its
# result) runs in row chunks with results below it instead, each copied into the buffer.
_FRESH_PAGES_BYTES = 32 << 20


def linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ w (N, K).T -> (..., N), no bias. `out` (2-D x only): a buffer to write into (the
    caller's own pool); use the returned tensor."""
    if x.device.type != "cpu" or x.dtype not in MEASURED_DTYPES:
        return F.linear(x, w)
    k = x.shape[-1]
    name = choose(x.numel() // max(k, 1), k, w.shape[0], x.dtype)
    if name == "onednn":
        if out is None or out.numel() * out.element_size() <= _FRESH_PAGES_BYTES:
            return _onednn(x, w)
        rows = max(1, (_FRESH_PAGES_BYTES // 2) // (w.shape[0] * out.element_size()))
        for r in range(0, x.shape[0], rows):
            out[r : r + rows].copy_(_onednn(x[r : r + rows], w))
        return out
    if x.dim() != 2:
        return F.linear(x, w)
    return _mm(x, w) if out is None else torch.mm(x, w.t(), out=out)


def grad_weight(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dy (N, O).T @ x (N, I) -> (O, I): the after-loop weight gradient, summed over all N tokens."""
    return torch.mm(dy.t(), x)


def bf16_is_native(size: int = 512) -> bool:
    """True when bf16 CPU products run natively (AVX512-BF16 / AMX): oneDNN reports bf16 support AND a
    bf16 product measures no slower than 1.5x the fp32 one.

    Emulated bf16 measured several times SLOWER than fp32 (7x on an AVX2 EPYC), native ~2x faster, so
    1.5x leaves room for timing noise on a shared machine either way. Measured once per process (tens
    of ms), logged once.
    """
    if not _bf16_native:
        supported = (
            bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) if _ONEDNN_LINEAR is not None else False
        )
        native = False
        if supported:
            t = {}
            for dt in (torch.float32, torch.bfloat16):
                x, w = _operands(size, size, size, dt)
                t[dt] = min(_time_paths(paths("linear", dt), x, w, rounds=3).values())
            native = t[torch.bfloat16] < 1.5 * t[torch.float32]
            log.info(
                "bf16 on this CPU: %s (bf16 %.0f us vs fp32 %.0f us for a %d^3 product)",
                "native" if native else "slow", t[torch.bfloat16] * 1e6, t[torch.float32] * 1e6, size,
            )  # fmt: skip
        else:
            log.info("bf16 on this CPU: emulated (oneDNN reports no native bf16)")
        _bf16_native.append(native)
    return _bf16_native[0]
