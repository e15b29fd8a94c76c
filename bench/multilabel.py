"""Multi-label transfer on a synthetic multi-label set made from a public corpus: per-label F1 with each
label's threshold, macro F1 and Jaccard, the one-vs-rest n-gram baseline beside them, and mlstm-classify on
the test split scoring what transfer.json reports. JSON line last.

    PYTHONPATH=. python bench/multilabel.py [--minutes 5 | --checkpoint RUN] [--speeches 6000] [--workdir DIR]

The set: speeches of bench/corpora/tinyshakespeare.txt (a speaker's lines, the name left out; bench/classify.py
reads them), each labelled by what it holds, as emotion sets label tweets by what they express:
question ("?"), exclaim ("!"), royal (king, queen, crown, majesty, throne), love (love, heart, sweet, kiss),
death (death, die(s), dead, kill(ed), grave, blood, slain), verse (two or more lines, each beginning with a
capital: Shakespeare's verse, against prose). The first 70% of --speeches train, the next 15% validate,
the last 15% test (in the plays' order, so test speeches come from later scenes). The LM is --checkpoint,
or one trained --minutes on the training speeches (unlabelled) with the quickstart's commands (2 processes
through the deepspeed launcher). Then `app/transfer.py --label-field labels` (one-vs-rest L1 probes, each
label's C and threshold chosen on validation; the feature kind picked by validation macro F1; fine-tuning
with a sigmoid head for --finetune-epochs) and `app/classify.py` with the classifier it kept on the test
split.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.classify import speeches  # noqa: E402
from bench.quality import prepare, quickstart_commands, run, train, train_figures  # noqa: E402

WORDS = {
    "royal": r"\b(king|queen|crown|majesty|throne)s?\b",
    "love": r"\b(love|loves|loved|heart|hearts|sweet|kiss)\b",
    "death": r"\b(death|die|dies|dead|kill|killed|grave|blood|slain)\b",
}


def labels_of(speech: str) -> list[str]:
    lines = speech.splitlines()
    out = [name for name, sign in (("question", "?"), ("exclaim", "!")) if sign in speech]
    out += [name for name, pat in WORDS.items() if re.search(pat, speech, flags=re.I)]
    if len(lines) >= 2 and all(ln.lstrip()[:1].isupper() for ln in lines):
        out.append("verse")
    return sorted(out)


def write_splits(texts: list[str], task: Path) -> dict[str, Path]:
    task.mkdir(parents=True, exist_ok=True)
    n = len(texts)
    cuts = {
        "train": (0, int(0.7 * n)),
        "validation": (int(0.7 * n), int(0.85 * n)),
        "test": (int(0.85 * n), n),
    }
    paths = {}
    for name, (a, b) in cuts.items():
        paths[name] = task / f"{name}.jsonl"
        paths[name].write_text(
            "".join(json.dumps({"text": t, "labels": labels_of(t)}) + "\n" for t in texts[a:b])
        )
    (task / "unlabelled.txt").write_text(
        "".join(t.replace("\n", " ") + "\n" for t in texts[: cuts["train"][1]])
    )
    return paths


def language_model(args, work: Path, task: Path) -> tuple[str, dict | None]:
    if args.checkpoint:
        return args.checkpoint, None
    args.steps, args.train_args, args.ds_set, args.stages, args.threads = 0, "", [], 0, 0  # train()'s
    quick_prep, _ = quickstart_commands(args.minutes, 0)
    data = work / "prep"
    prepare(task / "unlabelled.txt", data, quick_prep, ["--doc-split", "line"])
    out = work / f"lm_{args.minutes:g}m"
    if not (out / "final_metrics.json").exists():
        train(data, out, args, args.minutes, args.port)
    return str(out / "best"), train_figures(out)


def classify_macro_f1(res: dict, test: Path, work: Path) -> float:
    """app/classify.py on the test split with the kept classifier -> its macro F1 on the gold labels."""
    import numpy as np

    from app.probing.scores import multilabel_scores

    out = work / "test_labels.jsonl"
    cmd = [sys.executable, "app/classify.py", "--classifier", res["classifier"], "--input", str(test)]
    run([*cmd, "--output", str(out), "--keep-fields", "labels"], work / "classify.log")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    names = res["labels"]
    Y = np.asarray([[int(n in r["labels"]) for n in names] for r in rows])
    P = np.asarray([[int(n in r["predicted"]) for n in names] for r in rows])
    return multilabel_scores(Y, P, names)["macro_f1"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="an LM (run or export) instead of training one")
    ap.add_argument("--minutes", type=float, default=5.0, help="LM training budget")
    ap.add_argument("--speeches", type=int, default=6000)
    ap.add_argument("--finetune-epochs", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=None, help="keep data and runs here (default: temp)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--port", type=int, default=29680)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory() if args.workdir is None else None
    work = Path(tmp.name) if tmp else args.workdir.resolve()
    paths = write_splits(speeches()[: args.speeches], work / "task")
    lm, lm_figures = language_model(args, work, work / "task")
    out = work / "transfer"
    cmd = [
        sys.executable,
        "app/transfer.py",
        "--checkpoint",
        lm,
        "--label-field",
        "labels",
        "--out",
        str(out),
    ]
    cmd += [f"--{name}={path}" for name, path in paths.items()]
    run([*cmd, "--finetune-epochs", str(args.finetune_epochs)], work / "transfer.log")
    res = json.loads((out / "transfer.json").read_text())
    base, ft, chosen = res["ngram_baseline"], res["finetune"], res["chosen"]
    row = {
        "lm": lm_figures or res["checkpoint"],
        "rows": res["rows"],
        "label_counts": res["label_counts"],
        "features": res["features"],
        "probe": {
            "thresholds": res["thresholds"],
            "C_by_label": res["C_by_label"],
            "test_f1_by_label": res["test_f1_by_label"],
            "test_macro_f1": res["test_macro_f1"],
            "test_micro_f1": res["test_micro_f1"],
            "test_jaccard": res["test_jaccard"],
        },
        "ngram_baseline": {
            k: base[k] for k in ("thresholds", "test_f1_by_label", "test_macro_f1", "test_jaccard")
        },
        "finetune": ft
        and {k: ft[k] for k in ("thresholds", "test_macro_f1", "val_macro_f1_by_epoch", "best_epoch")},
        "chosen": chosen,
        "classify_test_macro_f1": classify_macro_f1(res, paths["test"], work),
        **({} if tmp else {"workdir": str(work)}),
    }
    row["classify_equals_transfer"] = row["classify_test_macro_f1"] == chosen["test_macro_f1"]
    per = ", ".join(f"{n} {v:.3f} (t {res['thresholds'][n]:.2f})" for n, v in res["test_f1_by_label"].items())
    print(
        f"probe ({res['features']}): test macro F1 {res['test_macro_f1']:.4f}, Jaccard {res['test_jaccard']:.4f}: {per}\n"
        f"n-gram baseline: macro F1 {base['test_macro_f1']:.4f}, Jaccard {base['test_jaccard']:.4f}\n"
        f"picked {chosen['method']}: test macro F1 {chosen['test_macro_f1']:.4f}; mlstm-classify on the test split: "
        f"{row['classify_test_macro_f1']:.4f}",
        flush=True,
    )
    print(json.dumps(row))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
