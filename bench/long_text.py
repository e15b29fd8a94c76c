"""One long text through `mlstm-classify`: its peak memory and time at two lengths, side by side. JSON line
last.

    PYTHONPATH=. python bench/long_text.py [--mb 0.25 1] [--workdir DIR] [--repo PATH]

The classifier is a probe of random weights on the `small` preset (H 256, 2 layers, random weights, byte
tokenizer: one token a byte), reading `final_cell` of its last layer; each input is one JSON Lines row whose
text is --mb megabytes of tinyshakespeare's lines. Each length runs `app/classify.py --features-out` in a
process of its own (one thread, `MLSTM_MATMUL=mm`), its peak resident memory read from the kernel
(`ru_maxrss` of the finished child, read by a wrapper of its own) and its wall time taken; the kernel is warmed (and built, if need be) by
a short run first. `--repo` runs another checkout's app/classify.py on the same classifier folder (a
before/after comparison). A text read in pieces with its state carried needs the memory of one piece
(`--batch-tokens`, 16,384), whatever its length: the ratio of the peaks is the figure to read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAKESPEARE = ROOT / "bench" / "corpora" / "tinyshakespeare.txt"


def classifier(out: Path) -> Path:
    """The `small` preset with random weights (bench/classify.py's export), kept as a probe classifier
    folder with a random head."""
    import numpy as np

    from app.checkpoints.loader import open_source
    from app.classifier.folder import write_classifier
    from app.classifier.head import Head
    from bench.classify import random_small_export

    src = open_source(random_small_export(out / "lm"))
    d, top = src.model_cfg.hidden_dim, src.model_cfg.num_layers - 1
    rng = np.random.default_rng(0)
    head = Head("probe", False, ["neg", "pos"], "final_cell", [top], np.zeros(d, np.float32),
                np.ones(d, np.float32), rng.normal(size=(1, d)), np.zeros(1), None, 0, [0, 1, 2])  # fmt: skip
    state = src.load_model().state_dict()
    return write_classifier(out / "classifier", src, src.tokenizer_meta, state, head, {})


def one_text(path: Path, nbytes: int) -> Path:
    lines = SHAKESPEARE.read_text(encoding="utf-8").split("\n")
    text, i = [], 0
    while sum(len(s) + 1 for s in text) < nbytes:
        text.append(lines[i % len(lines)])
        i += 1
    path.write_text(json.dumps({"text": " ".join(text)[:nbytes]}) + "\n", encoding="utf-8")
    return path


# a wrapper of one child: its own peak (ru_maxrss of its one waited child, KiB) on the last line
_WRAP = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stderr.write(p.stderr[-3000:] if p.returncode else '')\n"
    "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def run(repo: Path, clf: Path, src: Path, out: Path) -> dict:
    """app/classify.py of `repo` in a child process -> its wall seconds and peak resident memory."""
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1", MLSTM_MATMUL="mm", DS_ACCELERATOR="cpu")
    cmd = [sys.executable, str(repo / "app" / "classify.py"), "--classifier", str(clf), "--input", str(src),
           "--features-out", str(out)]  # fmt: skip
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _WRAP, *cmd], cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    code, kib = (int(v) for v in p.stdout.split()[-2:])
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    import numpy as np

    rows = np.load(out, mmap_mode="r").shape[0]  # 0: the text was refused as a bad row, not classified
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(kib / 1024), "classified": rows == 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, nargs="+", default=[0.25, 1.0])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--repo", default=str(ROOT), help="the checkout whose app/classify.py runs")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="long-text-"))
    work.mkdir(parents=True, exist_ok=True)
    clf = classifier(work)
    repo = Path(args.repo).resolve()
    run(repo, clf, one_text(work / "warm.jsonl", 1000), work / "warm.npy")  # the kernel loaded (or built)
    rows = {}
    for mb in sorted(args.mb):
        src = one_text(work / f"text_{mb:g}mb.jsonl", int(mb * 1_000_000))
        rows[f"{mb:g} MB"] = run(repo, clf, src, work / f"f_{mb:g}.npy")
        print(f"{mb:g} MB text: {rows[f'{mb:g} MB']}", flush=True)
    peaks = [r["peak_rss_mib"] for r in rows.values()]
    print(json.dumps({"bench": "long_text", "repo": str(repo), "texts": rows,
                      "peak_ratio_longest_to_shortest": round(peaks[-1] / peaks[0], 2)}))  # fmt: skip


if __name__ == "__main__":
    main()
