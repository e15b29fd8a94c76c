"""Time to quality: held-out bits per byte reached in a wall-clock budget, beside gzip/bzip2/xz. JSON line last.

    python bench/quality.py [--budgets 3,10] [--corpora embedded,botchan] [--workdir DIR]
                            [--dynamic] [--procs 2] [--prep-args="..."] [--train-args="..."] [--steps N]

For each corpus the last 10% of its raw text (as bytes, cut at a line start) is held out; the first 90% is
prepared and trained on with exactly the commands launch/quickstart.sh runs (read from its DRY_RUN=1
listing, so the benchmark measures the shipped CPU defaults: data_prep's flags, ds_configs/cpu_pp2_zero1.json
on 2 processes through the real `deepspeed` launcher, 2 pipeline stages, the model preset) with
`--time-budget` minutes. The held-out bytes are then scored as raw text by `app/evaluate.py --text` and by
`gzip -9`, `bzip2 -9`, `xz -9`. Reported per (corpus, budget): held-out bits/byte (also as one stream, and
with evaluate.py's neural cache: no weight changes; its tokens/s too), the compressors on the
same bytes, tokens/s and MFU (median of the steps after the first 3, from metrics.jsonl), steps, training
seconds, and whether the target is met (below `gzip -9` for budgets under 10 minutes, below `bzip2 -9`
from 10 minutes). `--dynamic` adds evaluate.py's dynamic evaluation (state carried through the text, the
weights adapting as it is read, like the compressors adapt).

Corpora:
- embedded: the corpus `python -m data_prep` uses without --input (CPython's pydoc topics then stdlib
  sources, 4 MB), its documents concatenated in order; the documents before the cut are written as one
  file each (data_prep's default one-document-per-file), the tail is the held-out text.
- botchan: tests/fixtures/corpora/botchan.txt (Natsume Soseki, English translation, Project
  Gutenberg), the novel between Gutenberg's START and END lines (the licence after it is not the novel),
  newlines normalised as data_prep normalises them, BOM dropped; the first 90% is one training file.
- shakespeare: bench/corpora/tinyshakespeare.txt (1.1 MB of Shakespeare's plays, char-rnn's and
  nanoGPT's shakespeare_char text), cut and prepared as botchan is.
- log: a generated CSV access log, 1 MB (`log_text`), cut and prepared as botchan is.

Tuning (bench/README.md): `--steps N` trains N steps instead of a time budget (equal work across configs on
a shared machine); `--prep-args` / `--train-args` add data_prep / training flags (shell-quoted strings);
`--procs 1 --stages 1` trains the same math in one process (the pipeline does not change the losses).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BOTCHAN = ROOT / "tests" / "fixtures" / "corpora" / "botchan.txt"
SHAKESPEARE = ROOT / "bench" / "corpora" / "tinyshakespeare.txt"
HELD_OUT = 0.10
CORPORA = ("embedded", "botchan", "shakespeare", "log")
LOG_BYTES = 1_000_000


def log_text(n_bytes: int = LOG_BYTES, seed: int = 0) -> str:
    """A generated CSV access log (neither prose nor code): timestamp, host, method, path, status, bytes,
    latency, with the skewed repetition real logs have. Seeded, so every run scores the same bytes."""
    import random

    rng = random.Random(seed)
    paths = ["/api/items", "/api/users", "/static/app.js", "/login", "/api/orders", "/health"]
    lines, size, t = ["timestamp,host,method,path,status,bytes,latency_ms\n"], 0, 1_760_000_000
    while size < n_bytes:
        t += rng.choice((0, 0, 1, 1, 2, 7))
        hh, mm, ss = (t // 3600) % 24, (t // 60) % 60, t % 60
        path = rng.choices(paths, weights=(30, 12, 8, 5, 9, 36))[0]
        path += f"/{rng.randrange(1, 5000)}" if path in ("/api/items", "/api/orders") else ""
        status = rng.choices((200, 304, 404, 500), weights=(85, 8, 6, 1))[0]
        line = (f"2025-10-{9 + t // 86400 % 20:02d}T{hh:02d}:{mm:02d}:{ss:02d}Z,web-{rng.randrange(1, 7)},"
                f"{rng.choices(('GET', 'POST'), weights=(8, 2))[0]},{path},{status},"
                f"{rng.randrange(120, 9000) if status == 200 else 0},{int(rng.lognormvariate(3, 0.8))}\n")  # fmt: skip
        lines.append(line)
        size += len(line)
    return "".join(lines)


def cut_at_line(text: str, frac: float) -> int:
    """Character index of the first line start at or after `frac` of the text's UTF-8 bytes."""
    target = int(len(text.encode("utf-8")) * frac)
    i = len(text.encode("utf-8")[:target].decode("utf-8", errors="ignore"))  # bytes -> characters
    j = text.find("\n", max(0, i - 1))
    return len(text) if j < 0 else j + 1


def embedded_documents() -> list[str]:
    """The embedded default corpus's documents, in data_prep's order, read as data_prep reads them."""
    from data_prep.config import PrepConfig
    from data_prep.default_corpus import default_corpus

    max_mb = PrepConfig.__dataclass_fields__["default_max_mb"].default
    corpus = default_corpus(max_mb)
    docs = [text for _, text in corpus.topics]
    for path in corpus.files:
        raw = path.read_bytes().decode("utf-8", errors="replace")
        docs.append(raw.replace("\r\n", "\n").replace("\r", "\n"))
    return [d for d in docs if d.strip()]


def novel_text(path: Path) -> str:
    """A Gutenberg text between its START and END lines, newlines normalised, BOM dropped."""
    text = path.read_bytes().decode("utf-8").lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    start = next((i + 1 for i, ln in enumerate(lines) if ln.startswith("*** START OF")), 0)
    end = next((i for i, ln in enumerate(lines) if ln.startswith("*** END OF")), len(lines))
    return "\n".join(lines[start:end]).strip("\n") + "\n"


def materialize(corpus: str, where: Path) -> tuple[Path, Path]:
    """-> (data_prep input, held-out text file): the first 90% and the last 10% of the corpus."""
    where.mkdir(parents=True, exist_ok=True)
    held = where / "heldout.txt"
    if held.exists():  # written by an earlier run in this --workdir (same corpus, same cut)
        return (where / "train" if corpus == "embedded" else where / "train.txt"), held
    if corpus != "embedded":
        text = (
            log_text()
            if corpus == "log"
            else novel_text({"botchan": BOTCHAN, "shakespeare": SHAKESPEARE}[corpus])
        )
        cut = cut_at_line(text, 1.0 - HELD_OUT)
        train = where / "train.txt"
        train.write_text(text[:cut], encoding="utf-8")
        held.write_text(text[cut:], encoding="utf-8")
        return train, held
    docs = embedded_documents()
    whole = "".join(docs)
    cut = cut_at_line(whole, 1.0 - HELD_OUT)
    train_dir = where / "train"
    train_dir.mkdir(exist_ok=True)
    pos = 0
    for i, doc in enumerate(docs):
        if pos >= cut:
            break
        piece = doc[: cut - pos]  # the document the cut falls in keeps its head
        (train_dir / f"{i:05d}.txt").write_text(piece, encoding="utf-8")
        pos += len(doc)
    held.write_text(whole[cut:], encoding="utf-8")
    return train_dir, held


def run(cmd: list[str], log: Path, env: dict | None = None) -> None:
    with open(log, "w") as f:
        f.write("+ " + shlex.join(cmd) + "\n")
        f.flush()
        p = subprocess.run(
            cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=f, stderr=subprocess.STDOUT
        )
    if p.returncode:
        tail = log.read_text().splitlines()[-15:]
        raise RuntimeError(f"failed ({p.returncode}): {shlex.join(cmd)}\n" + "\n".join(tail))


def quickstart_commands(minutes: float | None, steps: int) -> tuple[list[str], list[str]]:
    """(data_prep, training) argument lists exactly as launch/quickstart.sh runs them (its DRY_RUN=1
    listing), with DATA and OUT left as the placeholders __DATA__ and __OUT__."""
    env = {k: v for k, v in os.environ.items() if k not in ("STEPS", "MINUTES")}
    env |= {"DRY_RUN": "1", "DATA": "__DATA__", "OUT": "__OUT__"}
    env |= {"STEPS": str(steps)} if steps else {"MINUTES": f"{minutes:g}"}
    p = subprocess.run(["bash", "launch/quickstart.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [shlex.split(ln[2:]) for ln in p.stderr.splitlines() if ln.startswith("+ ")]
    prep = next((c for c in lines if c[0] == "mlstm-prep" or c[1:3] == ["-m", "data_prep"]), None)
    train = next((c for c in lines if c[0] == "deepspeed"), None)
    if p.returncode or prep is None or train is None:
        sys.exit(f"launch/quickstart.sh with DRY_RUN=1 did not list its commands:\n{p.stderr[-2000:]}")
    return prep[1 if prep[0] == "mlstm-prep" else 3 :], train[1:]  # without "mlstm-prep" / "deepspeed"


def fill(cmd: list[str], **values: str) -> list[str]:
    return [values.get(a.strip("_").lower(), a) if a.startswith("__") else a for a in cmd]


def prepare(inp: Path, out: Path, quickstart_prep: list[str], prep_args: list[str]) -> None:
    """data_prep as the quickstart runs it, on `inp` (a later flag in `prep_args` wins: tuning)."""
    if (out / "meta.json").exists():
        return
    cmd = [sys.executable, "-m", "data_prep", *fill(quickstart_prep, data=str(out)), "--input", str(inp)]
    run([*cmd, "--quiet", *prep_args], out.parent / f"{out.name}.prep.log")


def ds_config(shipped: str, overrides: list[str], where: Path) -> str:
    """A copy of the quickstart's DeepSpeed JSON with `key.sub=value` overrides (tuning)."""
    cfg = json.loads((ROOT / shipped).read_text())
    for item in overrides:
        key, _, raw = item.partition("=")
        *parents, leaf = key.split(".")
        node = cfg
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = json.loads(raw)
    path = where / f"ds_{hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:8]}.json"
    path.write_text(json.dumps(cfg, indent=1))
    return str(path)


def train(data: Path, out: Path, args, budget: float | None, port: int, carry: bool = False) -> float:
    """The quickstart's training command on `data` (tuning flags after it win); -> its wall seconds."""
    _, launcher = quickstart_commands(budget, args.steps)
    script = launcher.index("app/train.py")  # the launcher's own options before it (--log_level, --num_gpus)
    opts = dict(zip(launcher[:script:2], launcher[1:script:2], strict=True))
    assert "--num_gpus" in opts, launcher
    rest = fill(launcher[script:], data=str(data), out=str(out))
    cmd = [
        str(Path(sys.executable).parent / "deepspeed"), *(a for k, v in opts.items() if k != "--num_gpus" for a in (k, v)),
        "--num_gpus", str(args.procs), "--master_port", str(port), *rest, "--wandb-mode", "disabled", "--progress", "false", *shlex.split(args.train_args),
    ]  # fmt: skip
    if args.ds_set:
        shipped = rest[rest.index("--deepspeed_config") + 1]
        cmd += ["--deepspeed_config", ds_config(shipped, args.ds_set, out.parent)]
    if args.stages:
        cmd += ["--pipeline-stages", str(args.stages)]
    if carry:
        cmd += ["--carry-state"]
    env = {"WANDB_SILENT": "true"} | ({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})
    t0 = time.perf_counter()
    run(cmd, out.parent / f"{out.name}.train.log", env)
    return time.perf_counter() - t0


def score(run_dir: Path, held: Path, port: int, dynamic: bool) -> dict:
    """bits/byte of the held-out text through app/evaluate.py --text --cache, with the compressors' and the
    neural cache's figures (and, with `dynamic`, the state carried through the text and dynamic evaluation)."""
    out = run_dir / "heldout_eval.json"
    cmd = [
        sys.executable,
        "app/evaluate.py",
        "--checkpoint",
        str(run_dir / "best"),  # as the quickstart evaluates: the lowest validation loss
        "--text",
        str(held),
        "--out",
        str(out),
        "--cache",  # seconds, beside the minutes of --dynamic
    ]
    cmd += ["--dynamic"] if dynamic else []
    run(cmd, run_dir.parent / f"{run_dir.name}.eval.log", {"MASTER_PORT": str(port)})
    return json.loads(out.read_text())["texts"][0]


def train_figures(run_dir: Path) -> dict:
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    steps = [r for r in recs if "train/tokens_per_s" in r]
    warm = steps[3:] or steps  # the first steps include one-off work (kernel timing, allocations)
    final = json.loads((run_dir / "final_metrics.json").read_text())
    med = lambda k: statistics.median(r[k] for r in warm) if warm else None  # noqa: E731
    return {
        "steps": final.get("step"),
        "train_seconds": final.get("train_seconds"),
        "stopped_by": final.get("stopped_by"),
        "tokens_per_s": med("train/tokens_per_s"),
        "mfu": med("train/mfu"),
        "train_bpb_last": steps[-1]["train/bpb"] if steps else None,
        "val_bpb": final.get("val/bpb"),
        "val_loss": final.get("val/loss"),
        "best_checkpoint": (final.get("best_checkpoint") or {}).get("tag"),  # what score() evaluates
    }


def target_for(budget: float | None) -> str:
    return "bzip2 -9" if budget is not None and budget >= 10 else "gzip -9"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="10", help="comma list of training budgets in minutes")
    ap.add_argument(
        "--minutes", type=float, default=None, help="one training budget in minutes (replaces --budgets)"
    )
    ap.add_argument(
        "--carry",
        default="off,on",
        help="comma list: train with --carry-state off and/or on (same budget each)",
    )
    ap.add_argument("--corpora", default=",".join(CORPORA), help=f"comma list of: {', '.join(CORPORA)}")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="keep data and runs here (default: a temp dir)"
    )
    ap.add_argument("--procs", type=int, default=2, help="processes (the deepspeed launcher's --num_gpus)")
    ap.add_argument("--stages", type=int, default=0, help="pipeline stages (0: the quickstart's)")
    ap.add_argument(
        "--threads", type=int, default=0, help="OMP_NUM_THREADS per process (0: the app splits the cores)"
    )
    ap.add_argument("--prep-args", default="", help="extra data_prep flags (tuning)")
    ap.add_argument("--train-args", default="", help="extra training flags or model.<field>=V (tuning)")
    ap.add_argument(
        "--ds-set", action="append", default=[], metavar="KEY=JSON", help="override a DS JSON key (tuning)"
    )
    ap.add_argument("--no-score", action="store_true", help="train only (throughput probes)")
    ap.add_argument(
        "--dynamic",
        action="store_true",
        help="also score with evaluate.py --dynamic (state carried through the text; weights adapted)",
    )
    ap.add_argument(
        "--steps", type=int, default=0, help="train this many steps instead of --budgets (tuning)"
    )
    ap.add_argument("--tag", default="", help="name suffix of the runs (tuning: one workdir, many configs)")
    ap.add_argument("--port", type=int, default=29650)
    args = ap.parse_args()
    args.corpus_list = [c for c in args.corpora.split(",") if c]
    for c in args.corpus_list:
        if c not in CORPORA:
            ap.error(f"--corpora: {c!r} is not one of {', '.join(CORPORA)}")
    try:
        budgets: list[float | None] = [None] if args.steps else [float(b) for b in args.budgets.split(",")]
        if args.minutes is not None and not args.steps:
            budgets = [args.minutes]
    except ValueError:
        ap.error(f"--budgets: expected minutes separated by commas, got {args.budgets!r}")
    args.budget_list = budgets
    args.carries = [c == "on" for c in args.carry.split(",") if c]
    if not args.carries or any(c not in ("off", "on") for c in args.carry.split(",") if c):
        ap.error(f"--carry: expected off, on or off,on, got {args.carry!r}")
    if "botchan" in args.corpus_list and not BOTCHAN.is_file():
        ap.error(f"--corpora botchan: {BOTCHAN} is missing")
    return args


def measure(args, corpus: str, data: Path, held: Path, budget: float | None, carry: bool, meta: dict) -> dict:
    """One (corpus, budget, carry) point: train on `data` (prepared: `meta`), read the run's figures, score
    the held-out text (unless --no-score) against the target; its line printed as it ends."""
    base = data.parent
    name = (f"steps{args.steps}" if budget is None else f"budget{budget:g}m") + ("-carry" if carry else "")
    name += args.tag
    out = base / name
    wall = train(data, out, args, budget, args.port, carry)
    row = {
        "corpus": corpus,
        "budget_min": budget,
        "carry_state": carry,
        **train_figures(out),
        "launch_wall_s": round(wall, 1),
        "tokenizer": f"{meta['tokenizer']['type']} {meta['tokenizer']['vocab_size']}",
        "bytes_per_token": meta["splits"]["train"]["bytes"] / meta["splits"]["train"]["tokens"],
    }
    if args.no_score:
        print(f"{corpus:9s} {name:12s} {row['steps']} steps, {row['tokens_per_s']:.0f} tok/s", flush=True)
        return row
    row |= held_out_figures(score(out, held, args.port + 1, args.dynamic), budget, args.dynamic)
    print(
        f"{corpus:9s} {name:12s} held-out {row['bits_per_byte']:.3f} bits/byte "
        f"(stream {row['stream_bits_per_byte']:.3f}, cache {row['cache_bits_per_byte']:.3f}) | gzip {row['gzip -9']:.3f} "
        f"bzip2 {row['bzip2 -9']:.3f} xz {row['xz -9']:.3f} | {row['steps']} steps, "
        f"{row['tokens_per_s']:.0f} tok/s, mfu {row['mfu']:.3f} | target {row['target']}: "
        f"{'met' if row['target_met'] else 'MISSED'}"
        + (
            f" | dynamic {row['dynamic_bpb']:.3f}: {'met' if row['target_met_dynamic'] else 'MISSED'}"
            if args.dynamic
            else ""
        ),
        flush=True,
    )
    return row


def held_out_figures(ev: dict, budget: float | None, dynamic: bool) -> dict:
    """evaluate.py's figures of the held-out text, beside the compressors', and whether the target is met."""
    row = {
        "heldout_bytes": ev["bytes"],
        "bits_per_byte": ev["bits/byte"],
        "stream_bits_per_byte": ev.get("stream bits/byte"),
        "cache_bits_per_byte": ev["cache"],
        "cache_tokens_per_s": ev["cache_tokens_per_s"],
        "gzip -9": ev["gzip -9"],
        "bzip2 -9": ev["bzip2 -9"],
        "xz -9": ev["xz -9"],
    }
    if dynamic:
        row |= {"static_carried_bpb": ev["static carried"], "dynamic_bpb": ev["dynamic"]}
    tgt = target_for(budget)
    row["target"] = f"below {tgt}"
    row["target_met"] = row["bits_per_byte"] < row[tgt]
    if dynamic:
        row["target_met_dynamic"] = row["dynamic_bpb"] < row[tgt]
    return row


def main() -> None:
    args = parse_args()

    import tempfile

    from app.model.config import PRESETS  # noqa: F401  (the app imports; fails early if the tree is broken)

    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory()
        work = Path(tmp.name)
    else:
        work = args.workdir.resolve()
    prep_args = shlex.split(args.prep_args)
    quick_prep, _ = quickstart_commands(args.budget_list[0], args.steps)
    # one prepared directory per data_prep command (a workdir can hold several tuning variants)
    prep_key = "prep_" + hashlib.sha256(shlex.join([*quick_prep, *prep_args]).encode()).hexdigest()[:8]
    plan = [(b, c) for b in args.budget_list for c in args.carries]
    results = []
    for corpus in args.corpus_list:
        inp, held = materialize(corpus, work / corpus)
        data = work / corpus / prep_key
        prepare(inp, data, quick_prep, prep_args)
        meta = json.loads((data / "meta.json").read_text())
        results += [measure(args, corpus, data, held, budget, carry, meta) for budget, carry in plan]
    load = os.getloadavg()
    print(json.dumps({"results": results, "loadavg_end": [round(x, 2) for x in load], "workdir": str(work)}))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
