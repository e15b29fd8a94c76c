"""Classify throughput: `app/classify.py` with 2 processes (the deepspeed launcher, CPU) against
`app/transfer.py`'s featurising of the same texts, the `small` preset. JSON line last.

    PYTHONPATH=. python bench/classify.py [--checkpoint RUN_OR_EXPORT] [--texts 4000] [--workdir DIR]

The texts are speeches of bench/corpora/tinyshakespeare.txt (a speaker's lines, the name left out), the
first --texts of them, labelled "question" when they hold a "?" (the label only gives transfer a task; the
speed does not depend on it). The model is --checkpoint, or the `small` preset with random weights and the
byte tokenizer, written as an export (speed does not depend on the weights). Then:
1. `app/transfer.py --features final_cell --finetune-epochs 0` on the texts (train: the first 80%, test: the
   rest): its transfer.json gives the featurising speed (texts/s, tokens/s) over all of them, one process,
   every core;
2. `app/classify.py` on all the texts with the classifier step 1 kept, through `deepspeed --num_gpus 2`
   (DS_ACCELERATOR=cpu, one thread a process) and as one plain process: texts/s and bytes/s from its
   closing line (reading, tokenizing, featurising, the head and the part files all counted), and its
   accuracy on the test rows beside the one transfer.json reports.
The target: classify with 2 processes at >= 0.8x transfer's featurising speed. Both are measured in one run,
one after the other: quote the ratio with the command and the machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAKESPEARE = ROOT / "bench" / "corpora" / "tinyshakespeare.txt"


def speeches(path: Path = SHAKESPEARE) -> list[str]:
    """Each speech's lines (without the "NAME:" line before them), in order."""
    out, cur = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if re.fullmatch(r"[A-Z][A-Za-z ]*:", line.strip()):
            if cur:
                out.append("\n".join(cur))
            cur = []
        elif line.strip():
            cur.append(line)
    if cur:
        out.append("\n".join(cur))
    return out


def random_small_export(out: Path) -> Path:
    """The `small` preset with random weights and the byte tokenizer, as an export folder."""
    import torch

    from app.checkpoints.export_format import write_export
    from app.checkpoints.hf_format import hf_config, hf_files
    from app.model.config import PRESETS, ModelConfig
    from app.model.lm import LanguageModel
    from data_prep.tokenizer import ByteTokenizer

    if (out / "config.json").is_file():
        return out
    tok = ByteTokenizer().meta()
    cfg = ModelConfig(vocab_size=tok["vocab_size"], **PRESETS["small"])
    torch.manual_seed(0)
    sd = LanguageModel(cfg).state_dict()
    config = {"model_config": cfg.to_dict(), "tokenizer": tok, "step": None, **hf_config(cfg, tok)}
    write_export(out, sd, config, None, hf_files(tok))
    return out


def write_csv(path: Path, texts: list[str]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows([t, "question" if "?" in t else "other"] for t in texts)
    return path


def run(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} ...: exit {p.returncode}\n{(p.stdout + p.stderr)[-3000:]}")
    print(f"{' '.join(map(str, cmd[:3]))} ...: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return p


def classify_speed(stdout: str) -> dict:
    """texts/s and bytes/s from app/classify.py's closing line."""
    m = re.search(r"this run ([\d,]+) texts in ([\d.]+) s, ([\d,.]+) texts/s, ([\d,]+) bytes/s", stdout)
    if m is None:
        sys.exit(f"no speed in app/classify.py's output:\n{stdout[-2000:]}")
    texts, secs, tps, bps = m.groups()
    return {
        "texts": int(texts.replace(",", "")),
        "seconds": float(secs),
        "texts_per_s": float(tps.replace(",", "")),
        "bytes_per_s": float(bps.replace(",", "")),
    }


def labels(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as f:
        return [r["predicted"] for r in csv.DictReader(f)]


def test_accuracy(labels_csv: Path, texts: list[str], cut: int) -> float:
    """The accuracy of app/classify.py's labels on the test rows (the texts after `cut`), by their row."""
    with labels_csv.open(newline="", encoding="utf-8") as f:
        predicted = {int(r["row"]): r["predicted"] for r in csv.DictReader(f)}
    gold = ["question" if "?" in t else "other" for t in texts]
    return sum(predicted[i + 1] == gold[i] for i in range(cut, len(texts))) / (len(texts) - cut)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="a run or export (default: a random `small` export)")
    ap.add_argument("--texts", type=int, default=4000, help="speeches classified")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the files here (default: temp)")
    ap.add_argument("--port", type=int, default=29671)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory() if args.workdir is None else None
    work = Path(tmp.name) if tmp else args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = args.checkpoint or str(random_small_export(work / "small_export"))
    texts = speeches()[: args.texts]
    cut = int(0.8 * len(texts))
    train, test, every = (
        write_csv(work / f"{n}.csv", t)
        for n, t in (("train", texts[:cut]), ("test", texts[cut:]), ("all", texts))
    )
    out = work / "transfer"
    run([sys.executable, "app/transfer.py", "--checkpoint", model, "--train", str(train), "--test", str(test),
         "--out", str(out), "--features", "final_cell", "--finetune-epochs", "0", "--heatmap-texts", "0"])  # fmt: skip
    res = json.loads((out / "transfer.json").read_text())
    feat = res["featurize"]
    if not feat["seconds"]:
        sys.exit(f"{out}: transfer read its features from the cache; use a fresh --workdir")
    clf = res["classifier"]
    base = ["--classifier", clf, "--input", str(every)]
    ds = [str(Path(sys.executable).parent / "deepspeed"), "--log_level", "error", "--num_gpus", "2"]
    two = run([*ds, "--master_port", str(args.port), "app/classify.py", *base, "--output", str(work / "two.csv")],
              {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})  # fmt: skip
    one = run([sys.executable, "app/classify.py", *base, "--output", str(work / "one.csv")])
    nbytes = sum(len(t.encode()) for t in texts)
    row = {
        "model": res["checkpoint"],
        "hidden_dim": res["hidden_dim"],
        "texts": len(texts),
        "bytes": nbytes,
        "transfer_featurize": {
            "texts_per_s": feat["texts_per_s"],
            "bytes_per_s": nbytes / feat["seconds"],
            "tokens_per_s": feat["tokens_per_s"],
            "seconds": feat["seconds"],
        },
        "classify_2_processes": classify_speed(two.stdout),
        "classify_1_process": classify_speed(one.stdout),
        # bytes equal only where every process computes alike (threads, matmul kernels: docs/classify.md); the
        # 1 process here has every core's threads and times its own kernels, so compare the labels too
        "same_bytes_1_and_2_processes": (work / "one.csv").read_bytes() == (work / "two.csv").read_bytes(),
        "same_labels_1_and_2_processes": labels(work / "one.csv") == labels(work / "two.csv"),
        "test_accuracy_transfer": res["chosen"]["test_accuracy"],
        "test_accuracy_classify": test_accuracy(work / "two.csv", texts, cut),
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    row["ratio_2_processes"] = row["classify_2_processes"]["texts_per_s"] / feat["texts_per_s"]
    print(
        f"{len(texts):,} texts ({nbytes:,} bytes): transfer featurises {feat['texts_per_s']:,.1f} texts/s; "
        f"classify with 2 processes {row['classify_2_processes']['texts_per_s']:,.1f} texts/s "
        f"({row['classify_2_processes']['bytes_per_s']:,.0f} bytes/s, {row['ratio_2_processes']:.2f}x), "
        f"1 process {row['classify_1_process']['texts_per_s']:,.1f} texts/s",
        flush=True,
    )
    print(json.dumps(row))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
