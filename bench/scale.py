"""Data prep at scale: corpora of growing size, generated on disk, prepared by the real CLI; JSON line last.

    python bench/scale.py [--sizes 0.25,1,4] [--num-proc 2] [--one-worker-size 1] [--tokenizer sentencepiece]

Each corpus is the embedded default corpus (CPython docs and stdlib sources, ~32 MB) repeated with
per-copy variation (a header line per document naming the copy, so every document is new): half of
it as one big JSON Lines file, half as many ~1 MB text files. Each is prepared with ``--num-proc``
workers (the ``--one-worker-size`` one also with 1 worker) by ``python -m data_prep`` in a child
process, while the peak memory of its whole process tree is sampled from /proc (the RSS sum, which
counts pages shared by the forked workers once per process, and the PSS sum, which counts them once). Corpora
and outputs are deleted afterwards. On the largest prepared set the trainer's start-up is timed in a
fresh process: ``load_prepared``, ``TokenStore`` and one epoch plan of ``app.batching.buckets.BucketSchedule``.

``cpu_s`` is the CPU time of the whole process tree; ``cpu_1w_vs_nw`` compares it between 1 and N
workers (the work added by parallelism), which still means something when other jobs share the cores.

Targets (issue 10): peak RSS at the largest size <= 1.2x that at the smallest and <= 2 GiB; MB/s at
the largest >= 0.9x that at the smallest; encode stage with 2 workers >= 1.6x 1 worker; trainer
start-up <= 15 s and <= 1 GiB beyond the imports. Timings on a shared machine are noisy: compare
figures of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FILE_MB = 1.0  # size of each generated text file


def make_corpus(root: Path, gb: float) -> int:
    """Write ~gb GB: half one JSONL file, half ~1 MB text files. Returns bytes of document text."""
    from data_prep.default_corpus import default_corpus

    corpus = default_corpus(1000.0)
    docs = [t for _, t in corpus.topics]
    docs += [p.read_text(encoding="utf-8", errors="replace") for p in corpus.files]
    docs = [d for d in docs if d.strip() and "\x00" not in d]
    target = int(gb * 1e9)
    root.mkdir(parents=True)
    (root / "files").mkdir()
    written = copy = n_files = 0
    buf: list[str] = []
    buf_bytes = 0
    with open(root / "big.jsonl", "w", encoding="utf-8") as big:
        while written < target:
            for i, doc in enumerate(docs):
                text = f"# copy {copy} document {i}\n{doc}"
                size = len(text.encode("utf-8"))
                if written < target // 2:
                    big.write(json.dumps({"text": text}) + "\n")
                else:
                    buf.append(text)
                    buf_bytes += size
                    if buf_bytes >= FILE_MB * 1e6:
                        (root / "files" / f"{n_files:06d}.txt").write_text("\n\n".join(buf), encoding="utf-8")
                        n_files += 1
                        buf, buf_bytes = [], 0
                written += size
                if written >= target:
                    break
            copy += 1
    if buf:
        (root / "files" / f"{n_files:06d}.txt").write_text("\n\n".join(buf), encoding="utf-8")
    return written


def _tree_memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) bytes of ``pid`` and all its descendants. PSS shares each page among the processes
    mapping it, so forked workers' copy-on-write pages count once (the RSS sum counts them per process)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    rss = pss = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, pss


def run_measured(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``; wall time, peak tree RSS (sampled every 0.2 s), exit code and stderr."""
    import resource

    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = peak_pss = 0
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, peak_pss
        while not done.is_set():
            rss, pss = _tree_memory(proc.pid)
            peak, peak_pss = max(peak, rss), max(peak_pss, pss)
            loads.append(os.getloadavg()[0])
            time.sleep(0.2)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    done.set()
    t.join()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (
        cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    )  # the whole tree (workers are waited for)
    return {
        "rc": proc.returncode,
        "s": time.perf_counter() - t0,
        "cpu_s": cpu,
        "load_max": max(loads, default=os.getloadavg()[0]),  # 1-min load average seen during the run
        "peak_rss": peak,
        "peak_pss": peak_pss,
        "stdout": out,
        "stderr": err,
    }


def prep(corpus: Path, out: Path, num_proc: int, args) -> dict:
    cmd = [sys.executable, "-m", "data_prep", "--input", str(corpus), "--out", str(out),
           "--num-proc", str(num_proc), "--tokenizer", args.tokenizer, "--vocab-size", str(args.vocab_size)]  # fmt: skip
    r = run_measured(cmd)
    if r["rc"] != 0:
        raise RuntimeError(f"data_prep failed ({r['rc']}): {r['stderr'][-2000:]}")
    scan = re.search(r"scanned \d+ records \(\d+ MB kept\) in ([\d.]+) s", r["stderr"])
    enc = re.search(r"encoded in ([\d.]+) s \(CPU ([\d.]+) s, ([\d.]+) s of it in the main", r["stderr"])
    meta = json.loads((out / "meta.json").read_text())
    text_bytes = sum(s["bytes"] for s in meta["splits"].values())
    out_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    encode_s = float(enc.group(1)) if enc else float("nan")
    return {
        "workers": num_proc,
        "text_mb": round(text_bytes / 1e6, 1),
        "seconds": round(r["s"], 1),
        "cpu_s": round(r["cpu_s"], 1),
        "mb_per_s": round(text_bytes / 1e6 / r["s"], 2),
        "scan_s": float(scan.group(1)) if scan else None,
        "encode_s": encode_s,
        "encode_cpu_s": float(enc.group(2)) if enc else None,  # workers included
        "encode_main_cpu_s": float(enc.group(3)) if enc else None,  # the serial part: reading, appending
        "encode_mb_per_s": round(text_bytes / 1e6 / encode_s, 2),
        "load_max": round(r["load_max"], 2),
        "peak_rss_mb": round(r["peak_rss"] / 2**20, 1),
        "peak_pss_mb": round(r["peak_pss"] / 2**20, 1),
        "out_mb": round(out_bytes / 1e6, 1),
        "examples": sum(s["examples"] for s in meta["splits"].values()),
        "padding_efficiency": meta["padding_efficiency"],
    }


STARTUP = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
import numpy as np, torch  # noqa: F401  (the trainer has these loaded before it opens data)
import datasets  # noqa: F401
from data_prep.format import load_prepared
try:
    from app.batching.buckets import BucketSchedule, TokenStore
except Exception as exc:
    print(json.dumps({"error": f"app.batching.buckets: {exc}"})); sys.exit(0)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
base = rss()
t0 = time.perf_counter()
data = load_prepared(sys.argv[1])
store = TokenStore(data.split("train"))
t_open = time.perf_counter() - t0
sched = BucketSchedule(store, data.meta["buckets"], micro_batch=16, grad_accum=1, data_parallel=1, seed=0)
plan = sched.epoch(0)
t_all = time.perf_counter() - t0
print(json.dumps({"examples": len(store), "open_s": round(t_open, 2), "startup_s": round(t_all, 2),
                  "rss_beyond_imports_mb": round((rss() - base) / 2**20, 1), "steps": len(plan)}))
"""


def trainer_startup(prepared: Path) -> dict:
    r = run_measured([sys.executable, "-c", STARTUP, str(prepared), str(ROOT)])
    if r["rc"] != 0:
        return {"error": r["stderr"].strip().splitlines()[-1] if r["stderr"].strip() else f"exit {r['rc']}"}
    return json.loads(r["stdout"].strip().splitlines()[-1])


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="0.25,1,4", help="corpus sizes in GB, comma-separated")
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument(
        "--one-worker-size",
        type=float,
        default=None,
        help="size also run with 1 worker (default: the middle one)",
    )
    p.add_argument("--tokenizer", default="sentencepiece", choices=("sentencepiece", "byte"))
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument(
        "--workdir", type=Path, default=None, help="where corpora and outputs go (default: a temp dir)"
    )
    p.add_argument(
        "--speedup-rounds",
        type=int,
        default=1,
        help="1-worker vs N-worker runs of the --one-worker-size corpus, interleaved (median reported)",
    )
    args = p.parse_args()
    args.size_list = [float(x) for x in args.sizes.split(",")]
    sizes = args.size_list
    args.one = args.one_worker_size if args.one_worker_size is not None else sizes[len(sizes) // 2]
    return args


def worker_plan(gb: float, args: argparse.Namespace) -> list[tuple[int, int]]:
    """(workers, round) runs of the corpus of `gb`: --num-proc workers, and at --one-worker-size also one
    worker, interleaved so slow phases of a shared machine hit both."""
    if gb != args.one or args.num_proc == 1:
        return [(args.num_proc, 0)]
    return [
        pair
        for r in range(args.speedup_rounds)
        for pair in ([(args.num_proc, r), (1, r)] if r % 2 == 0 else [(1, r), (args.num_proc, r)])
    ]


def disk_shortfall(gb: float, args: argparse.Namespace, work: Path) -> dict | None:
    """A size the disk in `work` cannot hold (the corpus and one output at a time: the output is at most
    1.5x the text with SentencePiece, 4.5x with bytes): its entry, printed; None when it fits."""
    need = gb * 1e9 * (1 + (4.5 if args.tokenizer == "byte" else 1.5)) + 1e9
    free = shutil.disk_usage(work).free
    if free >= need:
        return None
    short = {"size_gb": gb, "unavailable": f"needs ~{need / 1e9:.0f} GB free in {work}, has {free / 1e9:.0f}"}
    print(json.dumps(short), file=sys.stderr, flush=True)
    return short


def measure_size(gb: float, args: argparse.Namespace, work: Path, runs: list[dict]) -> dict | None:
    """Generate the corpus of `gb` and prepare it per `worker_plan` (a run each appended to `runs`); corpus
    and outputs deleted after -> the trainer's start-up figures when this is the largest size, else None."""
    corpus = work / f"corpus-{gb}"
    t0 = time.perf_counter()
    made = make_corpus(corpus, gb)
    print(f"generated {made / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    startup = None
    for workers, rnd in worker_plan(gb, args):
        out = work / f"out-{gb}-{workers}"
        r = {"size_gb": gb, "round": rnd, **prep(corpus, out, workers, args)}
        runs.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
        if gb == args.size_list[-1] and workers == args.num_proc and rnd == 0:
            startup = trainer_startup(out)
            print(json.dumps({"trainer_startup": startup}), file=sys.stderr, flush=True)
        shutil.rmtree(out)
    shutil.rmtree(corpus)
    return startup


def main() -> None:
    args = parse_args()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=args.workdir))
    runs: list[dict] = []
    skipped: list[dict] = []
    startup: dict = {}
    try:
        for gb in args.size_list:
            if (short := disk_shortfall(gb, args, work)) is not None:
                skipped.append(short)
            elif (timed := measure_size(gb, args, work, runs)) is not None:
                startup = timed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary(args, runs, skipped, startup)))


def summary(args: argparse.Namespace, runs: list[dict], skipped: list[dict], startup: dict) -> dict:
    """Smallest vs largest size, 1 vs N workers, against the targets (or the sizes that could not run)."""
    main_runs = [r for r in runs if r["workers"] == args.num_proc and r["round"] == 0]
    if not main_runs:
        return {"unavailable": skipped}
    one = args.one
    small, large = main_runs[0], main_runs[-1]
    result: dict = {
        "tokenizer": args.tokenizer,
        "cpus": os.cpu_count(),
        "runs": runs,
        "unavailable": skipped,
        "trainer_startup": startup,
        "rss_large_vs_small": round(large["peak_rss_mb"] / small["peak_rss_mb"], 3),
        "mbps_large_vs_small": round(large["mb_per_s"] / small["mb_per_s"], 3),
        "peak_rss_max_mb": max(r["peak_rss_mb"] for r in runs),
        "pss_large_vs_small": round(large["peak_pss_mb"] / small["peak_pss_mb"], 3),
        "peak_pss_max_mb": max(r["peak_pss_mb"] for r in runs),
    }
    pairs = [
        (next(r for r in runs if r["size_gb"] == one and r["round"] == k and r["workers"] == 1),
         next(r for r in runs if r["size_gb"] == one and r["round"] == k and r["workers"] == args.num_proc))
        for k in sorted({r["round"] for r in runs if r["size_gb"] == one and r["workers"] == 1})
    ]  # fmt: skip
    if pairs:
        speedups = [a["encode_s"] / b["encode_s"] for a, b in pairs]
        result["encode_speedup_workers"] = round(statistics.median(speedups), 3)
        result["encode_speedup_rounds"] = [round(x, 3) for x in speedups]
        # CPU seconds with 1 vs N workers: the work parallelism adds. On a machine shared with other jobs
        # (where wall-clock speedups cannot show: with autogroup scheduling a process tree gets about the
        # same share of the CPUs whatever its number of processes) this still means something
        result["cpu_1w_vs_nw"] = round(statistics.median([a["cpu_s"] / b["cpu_s"] for a, b in pairs]), 3)
        if all(a["encode_cpu_s"] and b["encode_cpu_s"] for a, b in pairs):
            result["encode_cpu_1w_vs_nw"] = round(
                statistics.median([a["encode_cpu_s"] / b["encode_cpu_s"] for a, b in pairs]), 3
            )
    result["targets"] = {
        "rss_large_le_1.2x_small": result["rss_large_vs_small"] <= 1.2,
        "rss_le_2GiB": result["peak_rss_max_mb"] <= 2048,
        "mbps_large_ge_0.9x_small": result["mbps_large_vs_small"] >= 0.9,
        "encode_2w_ge_1.6x_1w": result["encode_speedup_workers"] >= 1.6 if pairs else None,
        "startup_le_15s": startup.get("startup_s", 1e9) <= 15 if "error" not in startup else None,
        "startup_rss_le_1GiB": startup.get("rss_beyond_imports_mb", 1e9) <= 1024
        if "error" not in startup
        else None,
    }
    return result


if __name__ == "__main__":
    main()
