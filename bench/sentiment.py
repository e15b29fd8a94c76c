"""Transfer to binary sentence sentiment: an LM trained on the task's unlabelled training sentences, its
features through app/transfer.py, beside the n-gram baseline on the same splits. JSON line last.

    python bench/sentiment.py --mr DIR [--minutes 8] [--workdir DIR] [--layer -1] [--procs 2] [--port 29660]

DIR holds Pang & Lee's sentence polarity dataset v1.0 ("movie review" sentences, 5,331 positive and
5,331 negative: rt-polarity.pos and rt-polarity.neg, one sentence per line, as
https://www.cs.cornell.edu/people/pabo/movie-review-data/ ships them in rt-polaritydata.tar.gz; it is not
in this repository, whose tests and code need nothing outside it). Lines are read as UTF-8, or as
Windows-1252 where they are not (the original's encoding). The sentences are shuffled with a fixed seed and
split 80/10/10 into train, validation and test, balanced per class. Then:
1. the training sentences, without labels, one document per line, are prepared and trained on with the
   quickstart's commands and `--time-budget` minutes (bench/quality.py: the shipped CPU defaults, 2
   processes through the real `deepspeed` launcher);
2. `app/transfer.py` on the best checkpoint with its defaults: the L1 probe on frozen features (the
   validation split picks the feature kind and C), the LM fine-tuned with a linear head (the validation
   split picks the epoch, then probe or fine-tuned), and the bag-of-n-grams baseline on the same splits;
3. the control: `app/transfer.py --finetune-from-scratch`, the same fine-tuning from a fresh
   initialisation, so the gap to step 2's fine-tuned figure is what the LM's pretraining adds.
Reports the test accuracies (picked, probe, fine-tuned, from scratch, n-grams), the feature kind picked,
the validation accuracy of every kind, the LM's validation bits/byte and its training steps. The JSON
row's `test_accuracy` is the picked method's (before fine-tuning existed it was the probe's; that is
`probe_test_accuracy` now).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.quality import prepare, quickstart_commands, run, train, train_figures  # noqa: E402

SPLITS = (("train", 0.8), ("validation", 0.1), ("test", 0.1))


def read_lines(path: Path) -> list[str]:
    out = []
    for raw in path.read_bytes().splitlines():
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            line = raw.decode("cp1252", errors="replace")
        if line.strip():
            out.append(line.strip())
    return out


def make_splits(mr: Path, seed: int = 0) -> dict[str, list[dict]]:
    """-> rows per split (shuffled, balanced per class)."""
    rows: dict[str, list[dict]] = {}
    for label in ("pos", "neg"):
        path = mr / f"rt-polarity.{label}"
        if not path.is_file():
            sys.exit(f"--mr {mr}: {path.name} is missing (Pang & Lee's rt-polaritydata)")
        texts = read_lines(path)
        random.Random(f"{seed}-{label}").shuffle(texts)
        start = 0
        for i, (split, frac) in enumerate(SPLITS):
            end = len(texts) if i == len(SPLITS) - 1 else start + round(frac * len(texts))
            rows.setdefault(split, []).extend({"text": t, "label": label} for t in texts[start:end])
            start = end
    for split, items in rows.items():
        random.Random(f"{seed}-{split}").shuffle(items)
    return rows


def write_task(rows: dict[str, list[dict]], task: Path) -> None:
    """<split>.csv (text,label) and unlabelled.txt (the train sentences), into a new or same-task folder:
    a --workdir whose LM was trained on other sentences is refused before anything in it changes."""
    unlabelled = "".join(r["text"] + "\n" for r in rows["train"])
    digest = hashlib.sha256(unlabelled.encode()).hexdigest()
    stamp = task / "unlabelled.sha256"
    if stamp.exists() and stamp.read_text() != digest:
        sys.exit(f"--workdir {task.parent}: its LM was trained on other sentences; use a new --workdir")
    task.mkdir(parents=True, exist_ok=True)
    for split, items in rows.items():
        with (task / f"{split}.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=["text", "label"])
            w.writeheader()
            w.writerows(items)
    (task / "unlabelled.txt").write_text(unlabelled, encoding="utf-8")
    stamp.write_text(digest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mr", type=Path, required=True, help="folder with rt-polarity.pos and rt-polarity.neg")
    ap.add_argument("--minutes", type=float, default=8.0, help="LM training budget")
    ap.add_argument("--workdir", type=Path, default=None, help="keep data and runs here (default: temp)")
    ap.add_argument("--layer", default="-1", help="app/transfer.py --layer")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--port", type=int, default=29660)
    args = ap.parse_args()
    args.steps, args.train_args, args.ds_set, args.stages, args.threads = 0, "", [], 0, 0  # train()'s
    tmp = tempfile.TemporaryDirectory() if args.workdir is None else None
    work = Path(tmp.name) if tmp else args.workdir.resolve()
    task = work / "task"
    rows = make_splits(args.mr)
    write_task(rows, task)
    quick_prep, _ = quickstart_commands(args.minutes, 0)
    data = work / "prep"
    prepare(task / "unlabelled.txt", data, quick_prep, ["--doc-split", "line"])
    out = work / f"lm_{args.minutes:g}m"
    if not (out / "final_metrics.json").exists():
        train(data, out, args, args.minutes, args.port)
    lm = train_figures(out)
    probe = work / f"transfer_layer{args.layer}"
    splits = [f"--{s}={task / s}.csv" for s in ("train", "validation", "test")]
    cmd = [sys.executable, "app/transfer.py", "--checkpoint", str(out / "best"), *splits]
    run([*cmd, "--layer", args.layer, "--out", str(probe)], work / "transfer.log")
    res = json.loads((probe / "transfer.json").read_text())
    control = work / f"transfer_layer{args.layer}_scratch"
    lean = ["--features", "mean_hidden", "--heatmap-texts", "0"]  # the control's probe is not read
    run(
        [*cmd, "--layer", args.layer, "--out", str(control), *lean, "--finetune-from-scratch"],
        work / "control.log",
    )
    scratch = json.loads((control / "transfer.json").read_text())["finetune"]
    row = {
        "rows": {k: len(v) for k, v in rows.items()},
        "lm_minutes": args.minutes,
        "lm_steps": lm["steps"],
        "lm_val_bpb": lm["val_bpb"],
        "lm_tokens_per_s": lm["tokens_per_s"],
        "features": res["features"],
        "layer": res["layer"],
        "val_accuracy_by_features": res["val_accuracy_by_features"],
        "C": res["C"],
        "probe_test_accuracy": res["test_accuracy"],
        "finetune_test_accuracy": res["finetune"]["test_accuracy"],
        "finetune_val_accuracy_by_epoch": res["finetune"]["val_accuracy_by_epoch"],
        "scratch_test_accuracy": scratch["test_accuracy"],
        "scratch_val_accuracy_by_epoch": scratch["val_accuracy_by_epoch"],
        "picked": res["chosen"]["method"],
        "test_accuracy": res["chosen"]["test_accuracy"],
        "ngram_baseline": res["ngram_baseline"]["model"],
        "ngram_test_accuracy": res["ngram_baseline"]["test_accuracy"],
        "single_neuron_test_accuracy": res["single_neuron"]["test_accuracy"],
        "majority_class": res["majority_class_test_accuracy"],
        **({} if tmp else {"workdir": str(work)}),
    }
    print(
        f"picked {row['picked']}: test {row['test_accuracy']:.4f} | probe ({row['features']}, layer "
        f"{row['layer']}) {row['probe_test_accuracy']:.4f} | fine-tuned {row['finetune_test_accuracy']:.4f}, "
        f"from scratch {row['scratch_test_accuracy']:.4f} | "
        f"{row['ngram_baseline']}: {row['ngram_test_accuracy']:.4f} | LM {row['lm_steps']} steps, "
        f"val {row['lm_val_bpb']:.3f} bits/byte",
        flush=True,
    )
    print(json.dumps(row))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
