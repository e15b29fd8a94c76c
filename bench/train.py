"""End-to-end training throughput on CPU, measured side by side in one run. JSON line last.

    python bench/train.py [--steps 6] [--rounds 2] [--threads 1] [--model '{"embed_dim": 256, ...}']
    python bench/train.py --device cuda [bench/train_gpu.py's flags]   # one GPU: small/medium/large presets
                          [--core fused,python] [--runs ds_p1,plain,ds_p2]

1. DeepSpeed, P = 1, one process         (`deepspeed app/train.py ... --pipeline-stages 1`)
2. a minimal plain-PyTorch loop          (same model, data order, micro-batches, AdamW, clipping; in process)
3. DeepSpeed, P = 2 on two processes     (`deepspeed app/train.py ... --pipeline-stages 2`)
All with the same threads per process. With several `--core`s (the mLSTM time loop: fused C++ or the
Python loop) run 1 is repeated per core and `fused_vs_python` = fused / python DS P=1 tokens/s; runs 2
and 3 use the first core. `--runs` picks which runs to make (`pipeline_*` / `vs_plain_torch` need
them). The runs are repeated `--rounds` times, interleaved, so
machine noise hits all of them alike; tokens/s is the median over every step after each run's first.
`--runs bound` (with `--core fused,python`) runs the plain loop with each core in this process and times
the fused core's time loops (bench/loop_clock.py): `fused_vs_python_bound` is the fused / python ratio the
step would reach if those loops took no time (everything else is shared), the ceiling of any core.
vs_plain_torch = DS P=1 / plain, pipeline_speedup = P=2 / P=1 beside the bubble-limited ideal
P * M / (M + P - 1) for M micro-batches, and MFU against the measured fp32 matmul peak.

The model has 4 equal recurrent layers (embed = hidden), so the two stages carry the same recurrent
work ([embedding, 2 layers] | [2 layers, head]) and the bubble formula is the right ideal. With an odd
layer count the split is unequal ([embedding, 2 layers] | [1 layer, head] for 3 layers of 256/512, stage
times 571 vs 346 ms per micro-batch measured) and that imbalance, not DeepSpeed, caps the speed-up: that
model measured 1.52x (0.85 of the bubble-only ideal).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = {"embed_dim": 512, "hidden_dim": 512, "num_layers": 4}


def prep(out: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "data_prep", "--out", str(out), "--vocab-size", "2000", "--max-seq-len", "128",
         "--default-max-mb", "2", "--quiet"],
        cwd=ROOT, check=True,
    )  # fmt: skip


def ds_run(
    nprocs: int, stages: int, data: Path, cfg: Path, model: Path, out: Path, steps: int, threads: int
) -> list[float]:
    """tokens/s of every step after the first"""
    cmd = [
        str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", str(nprocs), "--master_port", str(29700 + stages),
        str(ROOT / "app" / "train.py"), "--deepspeed_config", str(cfg), "--data", str(data), "--out", str(out),
        "--pipeline-stages", str(stages), "--model-config", str(model), "--max-steps", str(steps),
        "--eval-every", "0", "--save-every", "0", "--sanity-eval-batches", "0", "--test-eval", "false",
        "--progress", "false", "--wandb-mode", "disabled", "--warmup-steps", "2",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"deepspeed run failed:\n{p.stderr[-4000:]}")
    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    tps = [r["train/tokens_per_s"] for r in recs if "train/tokens_per_s" in r]
    return tps[1:]


def plain_run(data: Path, model: dict, ds_cfg: dict, steps: int, threads: int) -> list[float]:
    import torch

    torch.set_num_threads(threads)
    return _plain_run(data, model, ds_cfg, steps)[0]


def bound_run(data: Path, model: dict, ds_cfg: dict, steps: int, threads: int) -> tuple[list, list]:
    """The plain loop with the fused core, timing its time loops: (tokens/s of each step, tokens/s of the
    same steps without the time spent inside the loops), steps after the first."""
    import torch
    from loop_clock import timing_fused_loop  # bench/loop_clock.py

    torch.set_num_threads(threads)
    with timing_fused_loop() as clock:
        if clock is None:
            raise RuntimeError("the fused core is unavailable")
        return _plain_run(data, {**model, "core": "fused"}, ds_cfg, steps, clock)


def _plain_run(data: Path, model: dict, ds_cfg: dict, steps: int, clock=None) -> tuple[list, list]:
    """The same training step written directly in PyTorch, no DeepSpeed. With a LoopClock, also the
    tokens/s each step would have with its time loops taking no time."""
    import torch

    from app.batching.buckets import BucketSchedule, TokenStore, collate
    from app.model.config import ModelConfig
    from app.model.loss import token_loss
    from app.parallel.pipeline import build_sequential
    from app.training.schedule import lr_multiplier
    from data_prep.format import load_prepared

    data_ = load_prepared(data)
    tok = data_.meta["tokenizer"]
    store = TokenStore(data_.split("train"))
    mb, ga = ds_cfg["train_micro_batch_size_per_gpu"], ds_cfg["gradient_accumulation_steps"]
    sched = BucketSchedule(
        store, data_.meta["buckets"], micro_batch=mb, grad_accum=ga, data_parallel=1, seed=1234
    )
    model = build_sequential(ModelConfig(vocab_size=tok["vocab_size"], **model), base_seed=1234)
    p = ds_cfg["optimizer"]["params"]
    opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=p["betas"], eps=p["eps"], weight_decay=0.0)
    lr_fn = lambda s: lr_multiplier(s, warmup=2, total=steps, decay="cosine", min_ratio=0.1)  # noqa: E731
    sched_lr = torch.optim.lr_scheduler.LambdaLR(opt, lr_fn)
    plan = sched.epoch(0)
    tps, outside = [], []
    for step in range(steps):
        mbs = plan[step]
        tokens = sum(m.tokens for m in mbs)
        batches = [collate(store, m, tok["bos_id"], tok["pad_id"]) for m in mbs]
        if clock is not None:
            clock.reset()
        t0 = time.perf_counter()
        scale = torch.tensor([ga / tokens])
        for x, y in batches:
            (token_loss(model(x), (y, scale)) / ga).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), ds_cfg["gradient_clipping"])
        opt.step()
        sched_lr.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        tps.append(tokens / dt)
        if clock is not None:
            outside.append(tokens / (dt - clock.seconds))
    return tps[1:], outside[1:]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved repetitions of the three runs")
    ap.add_argument(
        "--model", type=json.loads, default=MODEL, help=f"ModelConfig fields as JSON (default {MODEL})"
    )
    ap.add_argument("--threads", type=int, default=1, help="threads per process (2 processes run for P = 2)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=8, help="M, the micro-batches per step")
    ap.add_argument(
        "--core", default="auto", help="comma list of mLSTM cores to compare: auto, fused, python"
    )
    ap.add_argument("--runs", default="ds_p1,plain,ds_p2", help="comma list of: ds_p1, plain, ds_p2, bound")
    args = ap.parse_args()
    args.cores, args.runs = args.core.split(","), args.runs.split(",")
    for c in args.cores:
        if c not in ("auto", "fused", "python"):
            ap.error(f"--core: {c!r} is not one of auto, fused, python")
    for r in args.runs:
        if r not in MEASUREMENTS:
            ap.error(f"--runs: {r!r} is not one of ds_p1, plain, ds_p2, bound")
    if "bound" in args.runs and not {"fused", "python"} <= set(args.cores):
        ap.error("--runs bound compares the cores: give --core fused,python")
    return args


@dataclass
class Bench:
    """What every measurement shares: the flags, the prepared data and configs in `tmp`, and the samples
    (tokens/s of every step after each run's first) gathered so far under each measurement's name."""

    args: argparse.Namespace
    tmp: Path
    ds_cfg: dict
    samples: dict[str, list[float]]
    unavailable: dict[str, str] = field(default_factory=dict)  # a core this machine cannot run (no compiler)

    @property
    def cores(self) -> list[str]:
        return self.args.cores

    def model(self, core: str) -> dict:
        return {**self.args.model, "core": core}

    def deepspeed(self, nprocs: int, stages: int, rnd: int, core: str) -> list[float]:
        out = self.tmp / f"run{stages}_{core}_{rnd}"
        files = (self.tmp / "data", self.tmp / "ds.json", self.tmp / f"model_{core}.json", out)
        return ds_run(nprocs, stages, *files, self.args.steps, self.args.threads)

    def plain(self, core: str) -> list[float]:
        return plain_run(self.tmp / "data", self.model(core), self.ds_cfg, self.args.steps, self.args.threads)


def set_up(args: argparse.Namespace, tmp: Path) -> Bench:
    """Prepared data, the DeepSpeed JSON at --micro-batch / --grad-accum, one model JSON per core."""
    prep(tmp / "data")
    ds_cfg = json.loads((ROOT / "ds_configs" / "cpu_pp2_zero1.json").read_text())
    ds_cfg["train_micro_batch_size_per_gpu"] = args.micro_batch
    ds_cfg["gradient_accumulation_steps"] = args.grad_accum
    (tmp / "ds.json").write_text(json.dumps(ds_cfg))
    bench = Bench(args, tmp, ds_cfg, {f"ds_p1_{c}": [] for c in args.cores} | {"plain": [], "ds_p2": []})
    bench.samples |= {"bound_fused": [], "bound_outside": [], "bound_python": []}
    for c in args.cores:
        (tmp / f"model_{c}.json").write_text(json.dumps(bench.model(c)))
    return bench


def measure_ds_p1(bench: Bench, rnd: int) -> None:
    """1. DeepSpeed, P = 1, one process, with each core (one the machine cannot run is reported)."""
    for c in bench.cores:
        if c in bench.unavailable:
            continue
        try:
            bench.samples[f"ds_p1_{c}"] += bench.deepspeed(1, 1, rnd, c)
        except RuntimeError as e:
            if len(bench.cores) == 1:
                sys.exit(str(e))
            bench.unavailable[c] = str(e).strip().splitlines()[-1][:300]


def measure_plain(bench: Bench, rnd: int) -> None:
    """2. The plain-PyTorch loop, first core."""
    bench.samples["plain"] += bench.plain(bench.cores[0])


def measure_ds_p2(bench: Bench, rnd: int) -> None:
    """3. DeepSpeed, P = 2 on two processes, first core."""
    bench.samples["ds_p2"] += bench.deepspeed(2, 2, rnd, bench.cores[0])


def measure_bound(bench: Bench, rnd: int) -> None:
    """The plain loop with the fused core, its time loops timed, then with the python core."""
    if "fused" in bench.unavailable:
        return
    args = bench.args
    try:
        f, o = bound_run(bench.tmp / "data", args.model, bench.ds_cfg, args.steps, args.threads)
    except RuntimeError as e:  # no compiler here: reported, not a crash
        bench.unavailable["fused"] = str(e).strip().splitlines()[-1][:300]
        return
    bench.samples["bound_fused"] += f
    bench.samples["bound_outside"] += o
    bench.samples["bound_python"] += bench.plain("python")


# in this order within a round; the rounds interleave them, so machine noise hits all alike
MEASUREMENTS = {
    "ds_p1": measure_ds_p1,
    "plain": measure_plain,
    "ds_p2": measure_ds_p2,
    "bound": measure_bound,
}


def main() -> None:
    if "--device" in sys.argv:  # `--device cuda`: the one-GPU benchmark (bench/train_gpu.py), its own flags
        i = sys.argv.index("--device")
        if sys.argv[i + 1 : i + 2] == ["cuda"]:
            del sys.argv[i : i + 2]
            sys.path.insert(0, str(Path(__file__).parent))
            import train_gpu

            return train_gpu.main()
        del sys.argv[i : i + 2]  # --device cpu: this benchmark
    args = parse_args()
    plan = [name for name in MEASUREMENTS if name in args.runs]

    import torch

    from app.training.peak_flops import measure_matmul_peak

    with tempfile.TemporaryDirectory() as tmp:
        bench = set_up(args, Path(tmp))
        for rnd in range(args.rounds):
            for name in plan:
                try:
                    MEASUREMENTS[name](bench, rnd)
                except RuntimeError as e:  # runs 2 and 3 use the first core: without it nothing compares
                    sys.exit(f"--core {bench.cores[0]}: {e}")
        vocab = json.loads((bench.tmp / "data" / "meta.json").read_text())["tokenizer"]["vocab_size"]
        # The split the P = 2 run used (--partition-method time: measured layer times) and its balance.
        run2 = bench.tmp / f"run2_{bench.cores[0]}_0" / "config.json"
        resolved = json.loads(run2.read_text()) if run2.exists() else None
    torch.set_num_threads(args.threads)
    peak = measure_matmul_peak(torch.float32, torch.device("cpu"), seconds=1.0)
    print(json.dumps(report(bench, vocab, resolved, peak)))


def report(bench: Bench, vocab: int, resolved: dict | None, peak: float) -> dict:
    """The medians and the ratios between them; MFU against `peak`, the measured fp32 matmul rate."""
    from app.model.config import ModelConfig, flops_per_token

    args, cores, samples, unavailable = bench.args, bench.cores, bench.samples, bench.unavailable
    med = {k: statistics.median(v) if v else None for k, v in samples.items()}
    ds_p1, plain, ds_p2 = med[f"ds_p1_{cores[0]}"], med["plain"], med["ds_p2"]
    fpt = flops_per_token(ModelConfig(vocab_size=vocab, **args.model))
    P, M = 2, args.grad_accum
    ideal = P * M / (M + P - 1)

    def r(v: float | None, nd: int = 3) -> float | str:
        return round(v, nd) if v is not None else "not run"

    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b is not None else None

    result = {
        "model": args.model,
        "vocab": vocab,
        "cores": cores,
        "threads_per_process": args.threads,
        "micro_batch": args.micro_batch,
        "micro_batches_M": M,
        "rounds": args.rounds,
    }
    if resolved is not None:
        parts, costs = resolved["partition"], resolved["layer_costs"]
        stage_costs = [sum(costs[a:b]) for a, b in itertools.pairwise(parts)]
        result["stage_layers"] = [list(range(a, b)) for a, b in itertools.pairwise(parts)]
        result["stage_time_balance"] = round(min(stage_costs) / max(stage_costs), 3)
    for c in cores:
        result[f"tokens_per_s_ds_p1_{c}"] = (
            f"unavailable: {unavailable[c]}" if c in unavailable else r(med[f"ds_p1_{c}"], 1)
        )
    if (
        samples.get("ds_p1_fused")
        and samples.get("ds_p1_python")
        and not set(unavailable) & {"fused", "python"}
    ):
        result["fused_vs_python"] = r(div(med["ds_p1_fused"], med["ds_p1_python"]))
        # every step's ratio range, for the spread on a shared machine
        f, p = samples["ds_p1_fused"], samples["ds_p1_python"]
        result["fused_vs_python_min_max"] = [r(min(f) / max(p)), r(max(f) / min(p))]
    if "bound" in args.runs and "fused" in unavailable:
        result["fused_vs_python_bound"] = f"unavailable: {unavailable['fused']}"
    elif samples.get("bound_fused"):
        # The plain loop, in this process: fused / python there, and at most what it could be with the
        # time loops taking no time (everything else in the step is shared by the two cores).
        result["plain_fused_vs_python"] = r(div(med["bound_fused"], med["bound_python"]))
        result["fused_vs_python_bound"] = r(div(med["bound_outside"], med["bound_python"]))
        result["plain_loop_share_fused"] = r(1 - div(med["bound_fused"], med["bound_outside"]))
    speedup = div(ds_p2, ds_p1)
    result |= {
        "tokens_per_s_ds_p1": r(ds_p1, 1),
        "tokens_per_s_plain_torch": r(plain, 1),
        "tokens_per_s_ds_p2": r(ds_p2, 1),
        "vs_plain_torch": r(div(ds_p1, plain)),
        "pipeline_speedup": r(speedup),
        "pipeline_ideal": round(ideal, 3),
        "pipeline_bubble": round((P - 1) / (M + P - 1), 3),
        "pipeline_vs_ideal": r(div(speedup, ideal)),
        "matmul_peak_gflops_per_thread_set": round(peak / 1e9, 1),
        "mfu_ds_p1": r(div(fpt * ds_p1, peak) if ds_p1 else None),
        "mfu_ds_p2": r(div(fpt * ds_p2, 2 * peak) if ds_p2 else None),
    }
    return result


if __name__ == "__main__":
    main()
