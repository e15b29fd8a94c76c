"""bench/README.md's GPU tables, made from the JSON lines GPU runs committed to bench/results/ (never typed by hand).

    python bench/gpu_tables.py                  # rewrite the marked section of bench/README.md
    python bench/gpu_tables.py --check          # exit 1 when the section is not what the lines give
    python bench/gpu_tables.py --add OUT/results.jsonl   # file a GPU session's lines, then rewrite

Each line of bench/results/<bench>-<device>-<date>.json is one run of a benchmark on one device, carrying the
device, the commit, the UTC time and (from bench/results.py, since these tables) torch, Triton, CUDA and the
driver. The section between MARK_BEGIN and MARK_END in bench/README.md is this script's output: one table per
benchmark (the layer, training, the step's phases, the optimizer, GPU memory), a row or column per run, each
run named by its device, commit and date. A line marked `transcribed` holds figures copied from a run's typed
table because its raw lines were lost; its label says so (†). tests/test_bench_gpu_tables.py checks that the
committed section is this script's output. `--add` files each line of a session's results (gpu_session.sh
writes them to OUT/results.jsonl) under its bench, device and date, skipping a line already filed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
README = ROOT / "bench" / "README.md"
MARK_BEGIN = (
    "<!-- gpu-tables: begin (made by `python bench/gpu_tables.py` from bench/results/*.json; do not edit) -->"
)
MARK_END = "<!-- gpu-tables: end -->"
BENCHES = ("mlstm_layer", "train_gpu", "gpu_optimizer", "memory", "gpu_tiles", "wgrad_overlap")


def lines(folder: Path = RESULTS) -> dict[str, list[dict]]:
    """bench -> its GPU runs' lines, oldest first (CPU runs and files that are not JSON lines left out)."""
    out: dict[str, list[dict]] = {b: [] for b in BENCHES}
    for path in sorted(folder.glob("*.json")):
        bench = next((b for b in BENCHES if path.name.startswith(b + "-")), None)
        if bench is None or "-cpu-" in path.name:
            continue
        dated = re.search(r"(\d{4}-\d{2}-\d{2})", path.name)
        for ln in path.read_text().splitlines():
            if ln.strip():
                rec = json.loads(ln)
                if dated and not rec.get("utc"):
                    rec.setdefault("date", dated.group(1))  # the file's date where the line has no time
                if rec.get("device") != "cpu":
                    out[bench].append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: (_date(r), r.get("utc", "")))
    return out


def _date(r: dict) -> str:
    return (r.get("utc") or r.get("date") or "")[:10]


def label(r: dict) -> str:
    """A run's name in the tables: device, commit, date; the software where the line records it."""
    device = r.get("machine") if r.get("device") == "cuda" else r.get("device")
    commit = str(r.get("git_commit") or r.get("commit") or "unknown").split(" ")[0][:7]
    soft = ", ".join(f"{k} {r[k]}" for k in ("torch", "triton", "driver") if r.get(k))
    mark = " †" if r.get("transcribed") else ""
    return f"{device}, {commit}, {_date(r)}" + (f" ({soft})" if soft else "") + mark


def _n(v, digits: int = 0) -> str:
    if isinstance(v, str):  # a transcribed figure, as the typed table gave it
        return v
    if not isinstance(v, (int, float)) or v != v:
        return "-"
    return f"{v:,.{digits}f}"


def _layer_run(r: dict) -> list[str]:
    sizes = [s for s in ("small", "large", "field") if isinstance(r.get(s), dict)]
    head = "| | " + " | ".join(f"B{r[s]['B']} H{r[s]['H']}" for s in sizes) + " |"
    rows = [head, "|---|" + "---|" * len(sizes)]

    def row(name: str, fn) -> None:
        rows.append(f"| {name} | " + " | ".join(fn(r[s]) for s in sizes) + " |")

    tok = lambda x, k: x.get("tokens_per_s", {}).get(k)  # noqa: E731
    row("Triton core bf16 (`auto`), tokens/s", lambda x: _n(tok(x, "auto_bf16") or tok(x, "fused_bf16")))
    row("... per FLOP vs cuDNN `nn.LSTM` bf16", lambda x: _n(x.get("auto_vs_torch_lstm_per_flop_bf16")
                                                               or x.get("vs_torch_lstm_per_flop_bf16"), 3))  # fmt: skip
    row("loops forced, bf16: step / cublas / persistent", lambda x: " / ".join(
        _n((x.get("loops_bf16_tokens_per_s") or {}).get(k)) for k in ("step", "cublas", "persistent")))  # fmt: skip
    row("old host wait off / on: `auto`; persistent", lambda x: "; ".join(
        " / ".join(_n(v.get(w)) for w in ("off", "on"))
        for v in (x.get("host_wait_ab_bf16") or {}).values()) or "-")  # fmt: skip
    row("the tuner's bf16 choice, forward / backward", lambda x: _choice(x.get("chosen")))
    row("cuDNN `nn.LSTM` bf16, tokens/s", lambda x: _n(tok(x, "torch_lstm_bf16")))
    row(
        "`auto` fp32 vs the Python core fp32",
        lambda x: _n(x.get("auto_vs_python_fp32") or x.get("vs_python"), 2),
    )
    row("from a carried state, fp32, vs the Python core's", lambda x: _n(x.get("carried_vs_python"), 2))
    row("roofline: of the bound", lambda x: _n((x.get("roofline_auto_bf16") or {}).get("of_bound"), 3)
        if isinstance(x.get("roofline_auto_bf16"), dict) else "-")  # fmt: skip
    return rows


def _choice(chosen) -> str:
    if isinstance(chosen, str):
        return chosen
    c = (chosen or {}).get("bfloat16")
    return f"{c.get('fwd')} / {c.get('bwd')}" if c else "-"


def layer(recs: list[dict]) -> list[str]:
    out = ["#### The layer (`mlstm_layer.py --device cuda`): a training step of one layer, T = 128", ""]
    for r in recs:
        out += [f"**{label(r)}**", "", *_layer_run(r), ""]
    return out


def training(recs: list[dict]) -> list[str]:
    out = ["#### Training (`train_gpu.py`): one GPU, ZeRO-2 bf16, median tokens/s after the first steps", "",
           "| run | model, batch | tokens/s (MFU) | launch to first step, s | its phases, s | slowest step / median | the tuner's choice |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        for name, x in r.get("runs", {}).items():
            if not isinstance(x, dict) or x.get("status", "ok") != "ok":
                continue
            phases = (x.get("first_step_phases") or {}).get("phases") or {}
            out.append(
                f"| {label(r)} | {name} | {_n(x.get('tokens_per_s'))} ({_n(100 * (x.get('mfu') or float('nan')), 1)}%) "
                f"| {_n(x.get('first_step_s'), 1)} | {', '.join(f'{k} {v:.1f}' for k, v in phases.items()) or '-'} "
                f"| {_n(x.get('slowest_step_vs_median'), 2)} | {'; '.join(x.get('chosen') or []) or '-'} |"
            )
    return [*out, ""]


def phases(recs: list[dict]) -> list[str]:
    out = ["#### A training step's phases (`train_gpu.py --phase-split`), ms: a plain loop / under DeepSpeed", "",
           "| run | model, batch | forward | loss | backward | optimizer | loss read | step | DeepSpeed's extra |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        split = r.get("phase_split")
        if isinstance(split, dict) and "ms" in split:  # the older, plain-only split of one run
            split = {split.get("run", "?"): {"plain": split}}
        for name, x in (split or {}).items():
            if not isinstance(x, dict):
                continue
            a, b = x.get("plain", {}), x.get("deepspeed", {})
            cells = [f"{_n(a.get('ms', {}).get(p), 1)} / {_n(b.get('ms', {}).get(p), 1)}"
                     for p in ("forward", "loss", "backward", "optimizer", "loss read")]  # fmt: skip
            step = f"{_n(a.get('step_ms'), 1)} / {_n(b.get('step_ms'), 1)}"
            out.append(
                f"| {label(r)} | {name} | {' | '.join(cells)} | {step} | {_n(x.get('deepspeed_extra_step_ms'), 1)} |"
            )
    return [*out, ""]


def optimizer(recs: list[dict]) -> list[str]:
    out = ["#### The optimizer step (`gpu_optimizer.py`), ms", "",
           "| run | parameters | torch fused AdamW | DeepSpeed FusedAdam | torch foreach AdamW |", "|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        ms = r.get("step_ms", {})
        out.append(f"| {label(r)} | {_n(r.get('params'))} | {_n(ms.get('torch_fused_adamw'), 3)} | "
                   f"{_n(ms.get('deepspeed_fused_adam'), 3)} | {_n(ms.get('torch_foreach_adamw'), 3)} |")  # fmt: skip
    return [*out, ""]


def memory(recs: list[dict]) -> list[str]:
    out = ["#### GPU memory (`memory.py --device cuda`): estimate against torch's CUDA allocator, MiB", "",
           "| run | core | work | sizes | estimate | first run | estimate / first | again | estimate / again |",
           "|---|---|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    from memory import NOT_SIZES  # bench/memory.py: the row's fields that are not its sizes

    for r in recs:
        for x in r.get("rows", []):
            sizes = ", ".join(f"{k} {v}" for k, v in x.items() if k not in NOT_SIZES)
            again = x.get("again")
            out.append(
                f"| {label(r)} | {r.get('core', 'auto')} | {x['work']} | {sizes} | {_n(x['estimate'] / 2**20)} | "
                f"{_n(x['measured'] / 2**20)} | {_n(x.get('ratio'), 2)} | {_n(again / 2**20 if again else None)} | "
                f"{_n(x['estimate'] / again if again else None, 2)} |"
            )
    return [*out, ""]


def tuner(recs: list[dict]) -> list[str]:
    out = ["#### The tuner's ranking at the 4096-wide training shapes (`gpu_tiles.py`), ms for its steps: whole op "
           "/ loop alone / traffic model", "",
           "| run | shape | chosen: forward; backward | each candidate (or why left out) | today's tiles over the l2 ones |",
           "|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        for x in r.get("shapes", []):
            t = x.get("times_ms", {})
            cands = sorted({k.split("/", 1)[1] for k in t if k.startswith(("fwd/", "bwd/"))})
            each = "; ".join(
                f"{c}: " + ", ".join(f"{d} {t.get(f'{d}/{c}', '-')} / {t.get(f'loop/{d}/{c}', '-')} / "
                                     f"{t.get(f'model/{d}/{c}', '-')}" for d in ("fwd", "bwd") if f"{d}/{c}" in t)
                for c in cands
            )  # fmt: skip
            chosen = f"{(x.get('fwd') or ['-'])[0]}; {(x.get('bwd') or ['-'])[0]}"
            ratio = ", ".join(f"{k} {v}" for k, v in (x.get("old_over_new") or {}).items()) or "-"
            out.append(
                f"| {label(r)} | B{x['B']} H{x['H']} ({x.get('steps', '?')} steps) | {chosen} | {each} | {ratio} |"
            )
    return [*out, ""]


def overlap(recs: list[dict]) -> list[str]:
    out = ["#### The weight gradients overlapped with the time loop (`wgrad_overlap.py`): a layer's step, ms", "",
           "| run | shape (T) | ms by MLSTM_WGRAD_OVERLAP chunks | speed-up against none | gradients' largest difference |",
           "|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        for shape, x in r.get("shapes", {}).items():
            if not isinstance(x, dict):
                out.append(f"| {label(r)} | {shape} | {x} | | |")
                continue
            ms = ", ".join(f"{k}: {v}" for k, v in x["ms"].items())
            up = ", ".join(f"{k}: {v}" for k, v in x["vs_no_overlap"].items())
            diff = max(x["grad_rel_diff"].values())
            out.append(f"| {label(r)} | {shape} ({x['T']}) | {ms} | {up} | {diff:.1e} |")
    return [*out, ""]


def section(folder: Path = RESULTS) -> str:
    """The README's GPU tables, from the lines in `folder`."""
    recs = lines(folder)
    body = [*layer(recs["mlstm_layer"]), *training(recs["train_gpu"]), *phases(recs["train_gpu"]),
            *optimizer(recs["gpu_optimizer"]), *memory(recs["memory"]), *tuner(recs["gpu_tiles"]),
            *overlap(recs["wgrad_overlap"])]  # fmt: skip
    note = ("† transcribed from the run's typed table (bench/README.md at e707b76): its raw JSON lines were never "
            "committed and are lost.")  # fmt: skip
    if any(r.get("transcribed") for rs in recs.values() for r in rs):
        body.append(note)
    return "\n".join([MARK_BEGIN, "", *body, "", MARK_END])


def rewrite(readme: Path = README, folder: Path = RESULTS) -> bool:
    """Put `section()` between the marks of `readme`; whether it changed."""
    text = readme.read_text()
    pattern = re.compile(re.escape(MARK_BEGIN) + ".*?" + re.escape(MARK_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"error: {readme}: no section marked {MARK_BEGIN!r} ... {MARK_END!r}")
    new = pattern.sub(lambda _: section(folder), text)
    if new != text:
        readme.write_text(new)
    return new != text


def add(path: Path, folder: Path = RESULTS) -> list[Path]:
    """File each JSON line of a session's `path` under bench/results/<bench>-<device>-<date>.json (a line
    already there is not filed twice) -> the files written to."""
    written = []
    for ln in path.read_text().splitlines():
        if not ln.strip().startswith("{"):
            continue
        rec = json.loads(ln)
        bench = rec.get("bench") or ("memory" if "rows" in rec else None)
        if bench not in BENCHES:
            raise SystemExit(f"error: {path}: a line of no bench this script files: {ln[:120]}")
        device = rec.get("machine") if rec.get("device") == "cuda" else rec.get("device")
        slug = re.sub(r"[^A-Za-z0-9]+", "-", device or "unknown").strip("-").lower()
        dest = folder / f"{bench}-{slug}-{_date(rec) or 'undated'}.json"
        have = dest.read_text().splitlines() if dest.exists() else []
        if json.dumps(rec) not in have and ln.strip() not in have:
            with dest.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            written.append(dest)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when bench/README.md's section is stale")
    ap.add_argument("--add", type=Path, metavar="JSONL", help="file a GPU session's lines first")
    args = ap.parse_args(argv)
    if args.add:
        for p in add(args.add):
            print("filed in", p.relative_to(ROOT))
    if args.check:
        text = README.read_text()
        if section() not in text:
            print("bench/README.md's GPU tables are stale: run `python bench/gpu_tables.py`", file=sys.stderr)
            return 1
        return 0
    print("rewrote" if rewrite() else "unchanged", README.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
