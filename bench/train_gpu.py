"""Training throughput on ONE GPU, through the real entry point. JSON line last.

    python bench/train_gpu.py [--runs small,medium,large_b128,large_b256] [--steps 40] [--save]
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
`--phase-split RUN`: one training step of RUN's model and micro-batch split into its phases in this process
(embedding and recurrent layers, head and loss, backward, AdamW), timed with CUDA events, bf16 autocast as the
bf16 configs train: where a step's time goes (`phase_split`).
`--save` appends the JSON line to bench/results/train_gpu-<device>-<date>.json (with the git commit).
A run that fails is reported with the last lines of its log, never a crash of the benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, text=True)
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
        "first_step_s": first, "seconds": time.perf_counter() - t0, "notes": sorted(set(notes)),
    }  # fmt: skip


def phase_split(name: str, seq_len: int, reps: int = 5) -> dict:
    """One training step of RUN's model at its micro-batch, phase by phase (CUDA events, no sync between them):
    forward through the recurrent layers, head and loss, backward, the optimizer; median ms over `reps` steps."""
    import torch

    from app.model.config import PRESETS, ModelConfig
    from app.model.lm import LanguageModel
    from app.model.loss import token_loss

    preset, tok, batch = RUNS[name]
    vocab = 259 if tok == "byte" else 4096
    model = LanguageModel(ModelConfig(vocab_size=vocab, **PRESETS[preset])).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq_len), device="cuda", generator=g)
    labels = (torch.randint(0, vocab, (batch, seq_len), device="cuda", generator=g),
              torch.ones(1, device="cuda") / (batch * seq_len))  # fmt: skip
    names = ("layers", "head_loss", "backward", "optimizer")
    times: dict[str, list[float]] = {n: [] for n in names}
    for step in range(3 + reps):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
        ev[0].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = model.embedding(ids)
            for layer in model.recurrent:
                h = layer(h)
            ev[1].record()
            loss = token_loss(model.head(h), labels)
        ev[2].record()
        loss.backward()
        ev[3].record()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ev[4].record()
        ev[4].synchronize()
        if step >= 3:
            for i, n in enumerate(names):
                times[n].append(ev[i].elapsed_time(ev[i + 1]))
    ms = {n: round(statistics.median(v), 3) for n, v in times.items()}
    total = sum(ms.values())
    return {"run": name, "micro_batch": batch, "seq_len": seq_len, "ms": ms,
            "share": {n: round(v / total, 3) for n, v in ms.items()}, "step_ms": round(total, 3)}  # fmt: skip


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
    ap.add_argument("--phase-split", default="", metavar="RUN", help="time one step of RUN phase by phase")
    ap.add_argument("--save", action="store_true", help="append the JSON line to bench/results/")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = ap.parse_args()
    runs = args.runs.split(",")
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        sys.exit(f"error: --runs: unknown {unknown}; choose from {list(RUNS)}")
    if args.dry_run:
        print(json.dumps({"runs": {r: RUNS[r] for r in runs}, "steps": args.steps, "skip": args.skip}))
        return
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    result: dict = {"bench": "train_gpu", "torch": torch.__version__, "steps": args.steps, "runs": {}}
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
    if args.phase_split:
        try:
            result["phase_split"] = phase_split(args.phase_split, args.seq_len)
        except Exception as e:  # a failed split is reported, never a crash of the benchmark
            result["phase_split"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        print("phase split", result["phase_split"], flush=True)
    print(json.dumps(result))
    if args.save:
        print("saved to", save(result, "train_gpu", device))


if __name__ == "__main__":
    main()
