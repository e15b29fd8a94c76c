"""Training throughput on ONE GPU, through the real entry point. JSON line last.

    python bench/train_gpu.py [--runs small,medium,large_b128,large_b256] [--steps 40] [--save]
        [--phase-split large_b128,large_b256 [--profile]]
        [--data-spm DIR --data-byte DIR]   # prepared data to reuse
    python bench/train.py --device cuda ...   # the same (bench/train.py hands over to this script)

Each run is `deepspeed --num_gpus 1 app/train.py --deepspeed_config ds_configs/gpu_bf16_zero2.json
--pipeline-stages 1` on the embedded default corpus (data_prep's defaults): `small` and `medium` with the
SentencePiece tokenizer at their micro-batch, `large_b128` / `large_b256` the `large` preset (4096 wide, one
layer: the size of OpenAI's sentiment-neuron mLSTM) with the byte tokenizer at B = 128 / 256, where tokens/s
is bytes/s. Figures: the median of the per-step tokens/s and MFU in metrics.jsonl over every step after
the first `--skip` (compilation, graph capture, allocator warm-up), MFU against the datasheet dense bf16
peak (app/training/peak_flops.py), and the run log's lines naming the core (with the GPU loops the tuner
chose and their times), the optimizer and the peak. `first_step_s`: launch to the first step's record
(start-up, compilation and tuning included); `slowest_step_vs_median`: the slowest step after the first over
the median (what a bucket length first met mid-run costs).
`chosen`: the loops the tuner chose for each shape the run met (its log's "mLSTM core on ..." lines).
`first_step_phases`: the run log's first-step line (app/common/phase_clock.py), launch (this script's Popen)
-> imports -> plan -> DeepSpeed initialised -> data ready -> first forward -> first step, seconds each.
`--phase-split RUN[,RUN]`: one training step of each RUN's model and micro-batch split into its phases in this
process, as a plain loop (bf16 autocast, torch's fused AdamW) and under the app's DeepSpeed engine (ZeRO-2 bf16,
as the runs train) side by side, with DeepSpeed's extra ms per phase, its own timers and (`--profile`) the
step's costliest kernels: where a step's time goes, and DeepSpeed's on top (bench/step_phases.py; `phase_split`).
`--device cpu --phase-split debug --runs ""`: the same at a tiny size on the CPU (its test).
`--save` appends the JSON line to bench/results/train_gpu-<device>-<date>.json (with the git commit).
A run that fails is reported with the last lines of its log, never a crash of the benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import save  # bench/results.py (this script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
RUNS = {  # name: (preset, tokenizer, micro-batch)
    "small": ("small", "spm", 64),
    "small_warm": (
        "small",
        "spm",
        64,
    ),  # run after `small`: its loop choices and kernels cached (first_step_s)
    "medium": ("medium", "spm", 64),
    "large_b128": ("large", "byte", 128),
    "large_b256": ("large", "byte", 256),
}
SPLITS = {**RUNS, "debug": ("debug", "byte", 4)}  # --phase-split's: a run's model and batch, or a tiny one


def prep(out: Path, tokenizer: str, seq_len: int) -> None:
    extra = ["--tokenizer", "byte"] if tokenizer == "byte" else []
    cmd = [
        sys.executable,
        "-m",
        "data_prep",
        "--out",
        str(out),
        "--max-seq-len",
        str(seq_len),
        "--quiet",
        *extra,
    ]
    subprocess.run(cmd, cwd=ROOT, check=True)


def _first_step_s(proc: subprocess.Popen, metrics: Path, t0: float, timeout_s: float) -> float | None:
    """Seconds from launch until the first training step's record reaches metrics.jsonl (polled), or None."""
    while proc.poll() is None and time.perf_counter() - t0 < timeout_s:
        if metrics.exists() and "train/tokens_per_s" in metrics.read_text():
            return time.perf_counter() - t0
        time.sleep(0.2)
    return None


def _first_step_phases(log: str) -> dict | None:
    """The run log's first-step line (app/common/phase_clock.py): launch -> imports -> plan -> DeepSpeed
    initialised -> data ready -> first forward -> first step, seconds each."""
    sys.path.insert(0, str(ROOT))
    from app.common.phase_clock import parse

    return parse(log)


def train(name: str, data: Path, out: Path, steps: int, skip: int, timeout_s: float) -> dict:
    preset, _, batch = RUNS[name]
    cmd = [
        str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "1", str(ROOT / "app" / "train.py"),
        "--deepspeed_config", str(ROOT / "ds_configs" / "gpu_bf16_zero2.json"), "--pipeline-stages", "1",
        "--data", str(data), "--model-config", preset, "--micro-batch", str(batch), "--grad-accum", "1",
        "--max-steps", str(steps), "--warmup-steps", "5", "--out", str(out), "--eval-every", "0",
        "--save-every", "0", "--eval-max-batches", "2", "--test-eval", "false", "--samples", "0",
        "--plots", "false", "--wandb-mode", "disabled", "--log-every", "5",
    ]  # fmt: skip
    t0 = time.perf_counter()
    log_path = out.parent / f"{name}.log"
    env = {**os.environ, "MLSTM_LAUNCH_T0": repr(time.time())}  # the run's first-step line counts from here
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, text=True, env=env)
        first = _first_step_s(proc, out / "metrics.jsonl", t0, timeout_s)
        try:
            rc = proc.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    log = log_path.read_text(errors="replace")
    if rc != 0:
        return {"status": "failed", "rc": rc, "log_tail": log[-1500:]}
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    tps_all = [r["train/tokens_per_s"] for r in recs if "train/tokens_per_s" in r]
    tps, mfu = tps_all[skip:], [r["train/mfu"] for r in recs if "train/mfu" in r][skip:]
    notes = [
        ln.split("INFO ", 1)[-1]
        for ln in log.splitlines()
        if any(k in ln for k in ("mLSTM core", "optimizer:", "MFU against"))
    ]
    med = statistics.median(tps) if tps else None
    chosen = sorted({ln.split("mLSTM core on ", 1)[1].split(" (ms at", 1)[0] for ln in log.splitlines()
                     if "mLSTM core on cuda" in ln and " B" in ln})  # fmt: skip
    return {
        "chosen": chosen,
        "status": "ok", "preset": preset, "micro_batch": batch, "steps_timed": len(tps),
        "tokens_per_s": med, "mfu": statistics.median(mfu) if mfu else None,
        # a new bucket length, first met mid-run, costs what: the slowest step after the first against the median
        "slowest_step_vs_median": min(tps_all[1:]) / med if med and len(tps_all) > 1 else None,
        "first_step_s": first, "first_step_phases": _first_step_phases(log),
        "seconds": time.perf_counter() - t0, "notes": sorted(set(notes)),
    }  # fmt: skip


def phase_split(names: list[str], seq_len: int, device: str, profile: bool) -> dict:
    """Each RUN's training step at its model and micro-batch split into phases, in this process, as a plain
    loop and under the DeepSpeed engine side by side (bench/step_phases.py), so DeepSpeed's extra time per
    step is named by phase. A split that fails is reported, never a crash of the benchmark."""
    import step_phases  # bench/step_phases.py

    out = {}
    for name in names:
        preset, tok, batch = SPLITS[name]
        try:
            out[name] = step_phases.split(preset, 259 if tok == "byte" else 4096, batch, seq_len, device,
                                          profile=profile)  # fmt: skip
        except Exception as e:
            out[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        print("phase split", name, json.dumps(out[name])[:600], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=",".join(RUNS), help="comma list of: " + ",".join(RUNS))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=10, help="first steps left out of the medians")
    ap.add_argument("--seq-len", type=int, default=256, help="data_prep --max-seq-len")
    ap.add_argument("--data-spm", type=Path, help="prepared SentencePiece data to reuse (else prepared here)")
    ap.add_argument("--data-byte", type=Path, help="prepared byte-level data to reuse (else prepared here)")
    ap.add_argument("--timeout-s", type=float, default=300, help="a run still going after this is stopped")
    ap.add_argument("--keep", type=Path, help="run here (logs, metrics) instead of a temporary folder")
    ap.add_argument(
        "--phase-split",
        default="",
        metavar="RUN[,RUN]",
        help="time one step of each RUN phase by phase, plain and under DeepSpeed: " + ",".join(SPLITS),
    )
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where --phase-split runs")
    ap.add_argument("--profile", action="store_true", help="--phase-split: the DeepSpeed step's top kernels")
    ap.add_argument("--save", action="store_true", help="append the JSON line to bench/results/")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = ap.parse_args()
    runs = [r for r in args.runs.split(",") if r]
    splits = [r for r in args.phase_split.split(",") if r]
    unknown = [r for r in runs if r not in RUNS] + [r for r in splits if r not in SPLITS]
    if unknown:
        sys.exit(f"error: --runs / --phase-split: unknown {unknown}; choose from {list(SPLITS)}")
    if args.dry_run:
        print(json.dumps({"runs": {r: RUNS[r] for r in runs}, "steps": args.steps, "skip": args.skip}))
        return
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    result: dict = {"bench": "train_gpu", "torch": torch.__version__, "steps": args.steps, "runs": {}}
    if args.device == "cuda" and splits and not torch.cuda.is_available():
        sys.exit("error: --phase-split on cuda: torch sees no CUDA device here (--device cpu)")
    with (
        tempfile.TemporaryDirectory() if args.keep is None else contextlib.nullcontext(str(args.keep)) as tmp
    ):
        Path(tmp).mkdir(parents=True, exist_ok=True)
        data: dict[str, Path] = {k: v for k, v in (("spm", args.data_spm), ("byte", args.data_byte)) if v}
        for name in runs:
            tok = RUNS[name][1]
            if tok not in data:
                data[tok] = Path(tmp) / f"data_{tok}"
                prep(data[tok], tok, args.seq_len)
            r = train(name, data[tok], Path(tmp) / name, args.steps, args.skip, args.timeout_s)
            result["runs"][name] = r
            print(name, json.dumps(r)[:400], flush=True)
            if RUNS[name][1] == "byte" and r.get("tokens_per_s"):
                r["bytes_per_s"] = r["tokens_per_s"]  # one token per byte
    if splits:
        result["phase_split"] = phase_split(splits, args.seq_len, args.device, args.profile)
    print(json.dumps(result))
    if args.save:
        print("saved to", save(result, "train_gpu", device))


if __name__ == "__main__":
    main()
