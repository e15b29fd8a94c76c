"""Build labelled transfer tasks from text every Python install has (no download).

    python bench/transfer_task.py --out data/transfer_tasks

- doctype (binary, CSV): a ~400-character window of CPython's pydoc help topics ("prose") or of a
  standard-library source file ("code"). Easy: a sanity check of the pipeline.
- package (4 classes, JSONL): a ~400-character window of Python source from asyncio, email, unittest or
  xml. Harder: the label is which library the code belongs to, read from vocabulary and style only.
Windows start at line boundaries. Train/test are split BY FILE (topic), so no test window shares a file
with a training window; classes are balanced by capping windows per class. Prints the counts as a JSON
line last.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sysconfig
from pathlib import Path

WINDOW = 400
PER_FILE = 6
PACKAGES = ("asyncio", "email", "unittest", "xml")


def windows(text: str, limit: int = PER_FILE) -> list[str]:
    out, lines, cur = [], text.splitlines(keepends=True), ""
    for line in lines:
        cur += line
        if len(cur) >= WINDOW:
            if cur.strip():
                out.append(cur[:WINDOW])
            cur = ""
            if len(out) >= limit:
                break
    return out


def is_test(name: str) -> bool:
    """A stable ~30% of files go to test."""
    return hashlib.blake2b(name.encode()).digest()[0] < 77


def split_docs(docs: list[tuple[str, str]], label: str, cap: int, per_file: int = PER_FILE) -> dict:
    rows = {"train": [], "test": []}
    for name, text in docs:
        part = "test" if is_test(name) else "train"
        rows[part].extend({"text": w, "label": label} for w in windows(text, per_file))
    return {"train": rows["train"][:cap], "test": rows["test"][: cap // 2]}


def stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_docs(folder: Path) -> list[tuple[str, str]]:
    files = sorted(p for p in folder.rglob("*.py") if "test" not in p.relative_to(folder).parts[:-1])
    return [(str(p.relative_to(stdlib())), p.read_text(encoding="utf-8", errors="replace")) for p in files]


def interleave(groups: list[list[dict]]) -> list[dict]:
    out = []
    for i in range(max(len(g) for g in groups)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data/transfer_tasks")
    p.add_argument("--cap", type=int, default=400, help="training windows per class (test: half)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from pydoc_data.topics import topics

    prose = split_docs(sorted(topics.items()), "prose", args.cap)
    root = stdlib()
    code_files = [d for d in source_docs(root) if d[0].count("/") == 0]  # top-level modules
    code = split_docs(code_files, "code", args.cap)
    counts = {}
    for part in ("train", "test"):
        n = min(len(prose[part]), len(code[part]))  # balanced
        rows = interleave([prose[part][:n], code[part][:n]])
        with (out / f"doctype_{part}.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["text", "label"])
            w.writeheader()
            w.writerows(rows)
        counts[f"doctype_{part}"] = len(rows)
    per_pkg = [split_docs(source_docs(root / pkg), pkg, args.cap, per_file=40) for pkg in PACKAGES]
    for part in ("train", "test"):
        n = min(len(s[part]) for s in per_pkg)  # balanced
        rows = interleave([s[part][:n] for s in per_pkg])
        (out / f"package_{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        counts[f"package_{part}"] = len(rows)
    print(json.dumps({"out": str(out), **counts}))


if __name__ == "__main__":
    main()
