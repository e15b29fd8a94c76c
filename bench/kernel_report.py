"""Registers, spills, shared memory and warpgroup-MMA use of every GPU kernel configuration the tuner can choose,
built by Triton's real compiler for a GPU architecture with no GPU present. JSON line last.

    python bench/kernel_report.py                      # sm_90 (H100/H200), sm_89 (L40S/4090/L4), sm_80 (A100)
    python bench/kernel_report.py --arch 90 --jobs 2   # one architecture, two compiler processes
    python bench/kernel_report.py --save               # and write bench/results/kernel_report.json (REPORT)

What it builds: for each GPU of DEVICES (its SM count and L2 decide the tiles), each preset's hidden width, each
batch bucket and each dtype the core takes in training (bf16, fp16, fp32 with and without tf32), the candidate
loops of app/model/gpu_tuning.py (`candidates_for`, the tiles of app/model/gpu_tiles.py) and every kind of
launch each makes (`Loop.launches`: a phase of a step, or the persistent loop's whole sequence), with the
arguments the loop passes (`Loop.kernel_args`: None where a pointer is unused) and the constexprs it sets
(`Loop.consts`). Builds with equal inputs are made once. Per build: registers, stack bytes (spills: the kernels
have no local arrays, so any stack is spilled registers; cuobjdump -res-usage), shared memory (Triton's
dynamic allocation), each product's M and whether it lowered to Hopper's warpgroup MMA (`ttng.warp_group_dot`
in the TTGIR, against `tt.dot`), and whether its K loop was software-pipelined.

`--save` writes every build to REPORT, with the hash of the kernels' source and the Triton release; a later
`--save` rebuilds only the configurations REPORT lacks for the same source and release (a tile-table change
costs its new builds, a kernel change everything: ~1400 builds, about an hour on 2 cores). The whole set is too
slow for the test suite: tests/test_bench_kernel_report.py checks that REPORT covers exactly the configurations
the tuner can choose today, from today's kernel source, with no spill anywhere and, on sm_90, every product with
M >= 64 (16-bit operands or tf32) on the warpgroup MMA; and it rebuilds the most register-hungry ones for real.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "bench" / "results" / "kernel_report.json"
# The GPUs users train on, by architecture: (name, SMs, L2 bytes), as torch.cuda.get_device_properties reports.
DEVICES = {
    90: [("H100 SXM", 132, 50 * MIB), ("H100 PCIe", 114, 50 * MIB), ("H200", 132, 60 * MIB)],
    89: [("L40S", 142, 96 * MIB), ("RTX 4090", 128, 72 * MIB), ("L4", 58, 48 * MIB)],
    80: [("A100", 108, 40 * MIB)],
}
BUCKETS = (16, 32, 64, 128, 256)  # gpu_tuning.batch_bucket's, up to B256 (larger ones take B256's tiles)
DTYPES = {"bf16": (torch.bfloat16, False), "fp16": (torch.float16, False), "fp32": (torch.float32, False),
          "tf32": (torch.float32, True)}  # fmt: skip
_TY = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}
# the kernels' buffers in the compute dtype (the products' operands); every other tensor is fp32
_OPERANDS = {"hs", "w_mh", "w_m", "ms", "dr", "w_mh_t", "w_m_t", "dp", "p_r", "p_g", "p_h"}
_BUFFERS = ("hs", "cs", "w_mh", "w_m", "pm", "pg", "rs", "ms", "gates", "tcs", "dr", "w_mh_t", "w_m_t", "dy", "dc",
            "dp", "z", "dh", "part", "p_r", "p_g", "p_h")  # fmt: skip


def widths() -> list[int]:
    from app.model.config import PRESETS

    return sorted({p["hidden_dim"] for p in PRESETS.values()})


def _signature(loop, launch, dtype: torch.dtype) -> tuple[dict, dict]:
    """(signature, None-valued constexprs) of `launch` as `loop` makes it: its own argument dict, each tensor
    named by its type."""
    from app.model import gpu_loops

    # the K slices' buffer only where the loop has one (gpu_loops.Loop.scratch): elsewhere `part` is None
    buffers = [n for n in _BUFFERS if n != "part" or loop.tiles.split_parts() > 1]
    marks = {n: _TY[dtype] if n in _OPERANDS else "*fp32" for n in buffers}
    args = loop.kernel_args(marks, launch.fwd)
    if launch.sync:
        args["bar"] = "*i32"
    kernel = gpu_loops._k().mlstm_fwd if launch.fwd else gpu_loops._k().mlstm_bwd
    sig, nones = {}, {}
    for n in kernel.arg_names:
        if n in args:
            sig[n] = "constexpr" if args[n] is None else args[n]
            if args[n] is None:
                nones[n] = None
        else:
            sig[n] = "i32"  # t0, t1, T, B, H
    return sig, nones


def _launches(arch: int, sms: int, l2: int, B: int, H: int, dname: str):
    """(use, configuration) of every launch the tuner's candidates make for one shape and dtype."""
    from app.model.gpu_tuning import candidates_for

    dtype, tf32 = DTYPES[dname]
    torch.backends.cuda.matmul.allow_tf32 = tf32  # the switch the kernels' precision follows
    try:
        for loop in candidates_for(B, H, dtype, sms, l2, arch):
            for launch in loop.launches():
                d = "fwd" if launch.fwd else "bwd"
                if d not in loop.directions:
                    continue
                c = loop.consts(dtype, launch)
                opts = {
                    k: c.pop(k) for k in ("num_warps", "num_stages", "enable_fp_fusion", "maxnreg") if k in c
                }
                c["ACC"] = str(c["ACC"])  # picklable; rebuilt in the worker
                sig, nones = _signature(loop, launch, dtype)
                entry = dict(kernel=f"mlstm_{d}", sig=sig, consts=c, nones=nones, opts=opts, arch=arch,
                             operand=_TY[dtype])  # fmt: skip
                use = f"B{B} H{H} {dname} {loop.label} {d} phases {launch.phases}{' persistent' if launch.sync else ''}"
                yield use, entry
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def configurations(arch: int, only_widths: list[int] | None = None) -> dict:
    """key -> configuration (kernel, signature, constexprs, options, and the (device, B, H, dtype, loop, launch)
    that use it), for every GPU of `arch` in DEVICES."""
    out: dict = {}
    for device, sms, l2 in DEVICES[arch]:
        for H in only_widths or widths():
            for B in BUCKETS:
                for dname in DTYPES:
                    for use, entry in _launches(arch, sms, l2, B, H, dname):
                        entry["key"] = config_key(entry)
                        out.setdefault(entry["key"], dict(entry, uses=[]))["uses"].append(f"{device} {use}")
    return out


def _tool(name: str) -> str:
    """Triton's own copy of a CUDA tool, else the one on PATH."""
    import shutil

    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return str(bundled) if bundled.exists() else (shutil.which(name) or name)


def _dots(ttgir: str) -> list[dict]:
    """Each product of the build: its M, N and whether it is a warpgroup MMA."""
    out = []
    for line in ttgir.splitlines():
        wg = " ttng.warp_group_dot " in line
        if wg or " tt.dot " in line:
            m = re.search(r"-> tensor<(\d+)x(\d+)x", line)
            if m:
                out.append(dict(M=int(m.group(1)), N=int(m.group(2)), wgmma=wg))
    return out


def build(entry: dict) -> dict:
    """Compile one configuration for its architecture; its resources."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from app.model import triton_kernels

    kernel = getattr(triton_kernels, entry["kernel"])
    consts = dict(entry["consts"], ACC=tl.float64 if "64" in entry["consts"]["ACC"] else tl.float32)
    consts.update(entry["nones"])
    names = kernel.arg_names
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if entry["sig"][n].startswith("*") or n == "H"}  # fmt: skip
    src = ASTSource(fn=kernel, signature=entry["sig"], constexprs=consts, attrs=attrs)
    t0 = time.perf_counter()
    cc = triton.compile(src, target=GPUTarget("cuda", entry["arch"], 32), options=dict(entry["opts"]))
    seconds = time.perf_counter() - t0
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cc.asm["cubin"])
    try:
        usage = subprocess.run(
            [_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True
        ).stdout
    finally:
        os.unlink(f.name)
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    ttgir = cc.asm["ttgir"]
    return dict(
        key=entry["key"], kernel=entry["kernel"], arch=entry["arch"], consts=entry["consts"], opts=entry["opts"],
        operand=entry["operand"], uses=entry["uses"], registers=int(m.group(1)) if m else None, spill_bytes=int(m.group(2)) if m else None,
        shared_bytes=cc.metadata.shared, dots=_dots(ttgir), pipelined="async_copy_global_to_local" in ttgir,
        seconds=round(seconds, 2),
    )  # fmt: skip


def problems(builds: list[dict]) -> dict:
    """The spills anywhere, and the sm_90 products of M >= 64 with 16-bit or tf32 operands not on wgmma."""
    spills = [b for b in builds if b["spill_bytes"]]
    no_wgmma = [
        b for b in builds
        if b["arch"] == 90 and b.get("tensor_cores") and any(d["M"] >= 64 and not d["wgmma"] for d in b["dots"])
    ]  # fmt: skip
    return {"spills": spills, "wgmma_missing": no_wgmma}


HOT = ("H4096", ("B128", "B256"))  # the large preset's training shapes, where the GPU time goes


def hot_products(builds: list[dict]) -> dict:
    """The tensor-core products of the sm_90 builds the tuner's candidates launch at the hot shapes (HOT, 16-bit
    operands), per candidate label and in all: [products, of them M >= 64, of them warpgroup MMAs]; a build
    shared by two candidates counts for each, and once in all."""
    out: dict = {}
    for b in builds:
        if b["arch"] != 90 or not b.get("tensor_cores"):
            continue
        labels = set()
        for use in b["uses"]:
            words = use.split()
            if HOT[0] in words and any(w in words for w in HOT[1]) and ("bf16" in words or "fp16" in words):
                labels.add(words[words.index(HOT[0]) + 2])  # "... B128 H4096 bf16 <label> fwd ..."
        for key in [*labels, "all"] if labels else []:
            n = out.setdefault(key, [0, 0, 0])
            n[0] += len(b["dots"])
            n[1] += sum(d["M"] >= 64 for d in b["dots"])
            n[2] += sum(d["M"] >= 64 and d["wgmma"] for d in b["dots"])
    return out


def source_hash() -> str:
    """What a build's resources depend on besides its configuration: the kernels' source."""
    import hashlib

    files = ("triton_kernels.py", "triton_parts.py")
    return hashlib.sha256(b"".join((ROOT / "app" / "model" / f).read_bytes() for f in files)).hexdigest()[:16]


def config_key(entry: dict) -> str:
    return json.dumps(
        [entry["arch"], entry["kernel"], entry["sig"], entry["consts"], entry["opts"]], sort_keys=True
    )


def reusable(path: Path) -> dict:
    """key -> build of a saved report made from this source by this Triton release, else {}."""
    import triton

    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if old.get("source") != source_hash() or old.get("triton") != triton.__version__:
        return {}
    return {b["key"]: b for b in old.get("builds", [])}


def run(archs: list[int], jobs: int, only_widths: list[int] | None = None, reuse: dict | None = None,
        save_to: Path | None = None) -> list[dict]:  # fmt: skip
    """Every configuration of `archs` built (or taken from `reuse`); with `save_to`, the report is rewritten
    every 25 builds, so a run stopped early leaves what it built for the next to reuse."""
    entries = []
    for arch in archs:
        entries += configurations(arch, only_widths).values()
    reuse = dict(reuse or {})
    todo = [e for e in entries if e["key"] not in reuse]
    print(
        f"{len(entries)} distinct builds for sm_{', sm_'.join(map(str, archs))}; {len(todo)} to build",
        flush=True,
    )
    with ProcessPoolExecutor(max(1, jobs)) as ex:
        for i, b in enumerate(ex.map(build, todo), 1):
            b["tensor_cores"] = _tensor_cores(b)
            reuse[b["key"]] = b
            if i % 25 == 0 or i == len(todo):
                print(f"  built {i}/{len(todo)}", flush=True)
                if save_to is not None:
                    _save(save_to, archs, list(reuse.values()))
    return [dict(reuse[e["key"]], uses=e["uses"]) for e in entries]


def _save(path: Path, archs: list[int], builds: list[dict]) -> None:
    import triton

    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"source": source_hash(), "triton": triton.__version__, "archs": archs,
                               "builds": builds}, indent=0))  # fmt: skip
    os.replace(tmp, path)


def _tensor_cores(b: dict) -> bool:
    """Whether the build's products take the tensor cores: 16-bit operands (a *bf16/*fp16 weight) or tf32."""
    return b["consts"]["USE_DOT"] and (
        b["consts"]["PREC"] == "tf32" or b.get("operand") in ("*bf16", "*fp16")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="90,89,80", help="comma list of compute capabilities: 90, 89, 80")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes")
    ap.add_argument("--widths", default="", help="hidden widths (default: the presets')")
    ap.add_argument("--save", action="store_true", help=f"write every build to {REPORT.relative_to(ROOT)}")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    archs = [int(a) for a in args.arch.split(",")]
    only = [int(w) for w in args.widths.split(",") if w] or None
    t0 = time.perf_counter()
    builds = run(
        archs, args.jobs, only, reusable(REPORT) if args.save else None, REPORT if args.save else None
    )
    for b in builds:
        print(f"sm_{b['arch']} {b['kernel']} phases {b['consts']['PHASES']} {'sync' if b['consts']['SYNC'] else ''} "
              f"dot {b['consts']['USE_DOT']} {b['consts']['PREC']} tiles {_tiles(b)} warps {b['opts']['num_warps']}: "
              f"{b['registers']} regs, {b['spill_bytes']} B spilled, {b['shared_bytes']} B shared, "
              f"products {[(d['M'], d['N'], 'wgmma' if d['wgmma'] else 'mma') for d in b['dots']]}")  # fmt: skip
    bad = problems(builds)
    import triton

    if args.save:
        _save(REPORT, archs, builds)
    print(json.dumps({
        "bench": "kernel_report", "triton": triton.__version__, "archs": archs, "builds": len(builds),
        "spilling": len(bad["spills"]), "wgmma_missing": len(bad["wgmma_missing"]),
        "max_registers": max((b["registers"] or 0) for b in builds),
        "max_shared_bytes": max(b["shared_bytes"] for b in builds),
        "seconds": round(time.perf_counter() - t0, 1),
        "hot_products": hot_products(builds),  # at H4096 B128/B256 on sm_90: [products, M >= 64, wgmma]
        "spill_uses": [u for b in bad["spills"] for u in b["uses"][:1]],
        "wgmma_missing_uses": [u for b in bad["wgmma_missing"] for u in b["uses"][:1]],
    }))  # fmt: skip


def _tiles(b: dict) -> str:
    c = b["consts"]
    if b["kernel"] == "mlstm_fwd":
        return f"r {c['BU_R']}x{c['BB_R']} g 4x{c['BU_G']}x{c['BB_G']}"
    return f"h {c['BU_H']}x{c['BB_H']} m {c['BU_M']}x{c['BB_M']} split {c['SPLIT']}"


if __name__ == "__main__":
    main()
