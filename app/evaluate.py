"""Evaluate any checkpoint (or export) exactly, with any parallel layout, or as one plain process.

    python app/evaluate.py --checkpoint runs/big --data data/mine --split test --text notes.txt
    deepspeed --num_gpus 4 app/evaluate.py --checkpoint runs/big --data data/mine --pipeline-stages 2

Split: loss (nats/token), perplexity and bits per byte over every real token of the split, each counted
once (pads excluded, the uneven last batch included): the same numbers whatever layout trained the
checkpoint and whatever layout evaluates it (world = P stages x world/P data-parallel replicas).

--text FILE...: each file is one document the model never saw, tokenized with the checkpoint's own
tokenizer, EOS appended, cut into --text-chunk-len pieces each read from a fresh state after BOS.
bits/byte = (summed cross-entropy in nats, EOS included) / ln 2 / (the file's size in bytes), printed
beside what gzip -9, bzip2 -9 and xz -9 achieve on the same bytes (8 * compressed size / size).

Results: a small table on stdout and a JSON file (--out; default <run>/eval/<tag>.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script by the deepspeed launcher: import the repo, not app/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import json
import math
from dataclasses import dataclass, field

from app.common.cli import add_dataclass_flags, collect_flags
from app.common.errors import UserError, exit_on_user_error
from data_prep.format import SPLITS


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    checkpoint: str = ""
    """A run directory (its latest complete checkpoint), its checkpoints/ folder, a step_XXXXXXXX folder, or
    an export folder."""
    data: str | None = None
    """Prepared data directory (python -m data_prep) whose --split is evaluated; needs the checkpoint's
    tokenizer."""
    split: str = "test"
    """Split of --data to evaluate: train, validation or test."""
    text: list[str] = field(default_factory=list)
    """Raw UTF-8 text files to evaluate (bits/byte beside gzip/bzip2/xz)."""
    text_chunk_len: int = 256
    """--text files are read in pieces of this many tokens, each from a fresh state after BOS."""
    pipeline_stages: int = 1
    """Pipeline stages P for the evaluation (world size / P data-parallel replicas); any P works with any
    checkpoint."""
    micro_batch: int = 8
    """Sequences per micro-batch."""
    partition_method: str = "cost"
    """How layers are split into stages when P > 1 (as in training)."""
    out: str | None = None
    """JSON result file (default: <run>/eval/<tag>.json for a checkpoint, <export>/eval.json)."""
    verbose: bool = False
    """Let DeepSpeed log at INFO."""

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("--checkpoint is required (a run directory, checkpoint or export folder)")
        if self.data is None and not self.text:
            raise ValueError("nothing to evaluate: give --data DIR (with --split) and/or --text FILE...")
        if self.split not in SPLITS:
            raise ValueError(f"--split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        for name in ("text_chunk_len", "pipeline_stages", "micro_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


def parse_args(argv: list[str] | None) -> EvalConfig:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # set by the launcher
    add_dataclass_flags(p, EvalConfig, skip=("text",))
    p.add_argument(
        "--text",
        nargs="+",
        default=[],
        dest="text_files",
        metavar="FILE",
        help="Raw UTF-8 text files to evaluate.",
    )
    ns = p.parse_args(argv)
    try:
        return EvalConfig(**collect_flags(ns, EvalConfig), text=list(ns.text_files))
    except ValueError as e:
        raise UserError(str(e)) from None


def read_texts(paths: list[str]) -> list[tuple[str, bytes, str]]:
    out = []
    for name in paths:
        p = Path(name)
        try:
            raw = p.read_bytes()
            text = raw.decode("utf-8")
        except OSError as e:
            raise UserError(f"--text {p}: cannot read ({e.strerror or e})") from None
        except UnicodeDecodeError as e:
            raise UserError(f"--text {p}: not UTF-8 text (byte {e.start}: {e.reason})") from None
        if not raw:
            raise UserError(f"--text {p}: the file is empty")
        out.append((name, raw, text))
    return out


def check_data_tokenizer(data, src) -> None:
    mine, theirs = src.tokenizer_meta, data.meta["tokenizer"]
    keys = ("type", "vocab_size", "pad_id", "bos_id", "eos_id")
    diff = [f"{k} {theirs.get(k)!r} vs {mine.get(k)!r}" for k in keys if theirs.get(k) != mine.get(k)]
    both = src.tokenizer_path is not None and data.tokenizer_path is not None
    if not diff and both and src.tokenizer_path.read_bytes() != data.tokenizer_path.read_bytes():
        diff.append("tokenizer.model files differ")
    if diff:
        raise UserError(
            f"--data {data.path}: tokenized differently from the checkpoint ({'; '.join(diff)}); "
            "evaluate data prepared with the checkpoint's tokenizer"
        )


def text_store(tokenizer, text: str, chunk: int):
    """One document -> a TokenStore of --text-chunk-len pieces (the data_prep row format)."""
    import datasets
    import numpy as np

    from app.training.batching import TokenStore

    ids = np.asarray([*tokenizer.encode(text), tokenizer.eos_id], dtype=np.int32)
    pieces = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
    ds = datasets.Dataset.from_dict(
        {
            "input_ids": [p.tolist() for p in pieces],
            "length": [len(p) for p in pieces],
            "num_bytes": [int(tokenizer.token_bytes[p].sum()) for p in pieces],
            "bucket": [0] * len(pieces),
        }
    )
    return TokenStore(ds)


def default_out(src) -> Path:
    if src.kind == "export":
        return src.path / "eval.json"
    run = src.path.parent.parent if src.path.parent.name == "checkpoints" else src.path.parent
    return run / "eval" / f"{src.path.name}.json"


def fmt_table(rows: list[dict]) -> str:
    cols = ["", "tokens", "bytes", "loss", "ppl", "bits/byte", "gzip -9", "bzip2 -9", "xz -9"]

    def cell(r: dict, c: str) -> str:
        if c == "":
            return r["name"]
        v = r.get(c)
        if v is None:
            return "-"
        return f"{v:,}" if isinstance(v, int) else f"{v:.2f}" if c == "ppl" else f"{v:.4f}"

    table = [cols] + [[cell(r, c) for c in cols] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    return "\n".join(
        "  ".join(s.ljust(w) if i == 0 else s.rjust(w) for i, (s, w) in enumerate(zip(line, widths)))
        for line in table
    )


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    from app.common.logs import setup_logging

    log = setup_logging(cfg.verbose)
    from app.checkpoints.loader import open_source

    # Everything that can be wrong with the request fails here, before any process group exists.
    src = open_source(cfg.checkpoint)
    tokenizer = src.tokenizer()
    data = None
    if cfg.data is not None:
        from data_prep.format import PreparedDataError, load_prepared

        try:
            data = load_prepared(cfg.data)
        except PreparedDataError as e:
            raise UserError(f"--data: {e}") from None
        check_data_tokenizer(data, src)
    texts = read_texts(cfg.text)
    full = src.state_dict()
    num_specs = src.model_cfg.num_layers + 2
    if cfg.pipeline_stages > num_specs:
        raise UserError(
            f"--pipeline-stages {cfg.pipeline_stages}: the model has only {num_specs} layers "
            f"(embedding, {src.model_cfg.num_layers} recurrent, head)"
        )

    import torch.distributed as dist

    from app.checkpoints.consolidate import to_module_state
    from app.parallel.engine import Engine
    from app.parallel.layout import Layout
    from app.parallel.runtime import init_distributed, set_threads
    from app.training.batching import BucketSchedule, TokenStore
    from app.training.compressors import compressed_bits_per_byte
    from app.training.evaluation import EvalResult, evaluate

    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    set_threads()
    P = cfg.pipeline_stages
    if world % P:
        raise UserError(f"--pipeline-stages {P} does not divide the world size {world}")
    dp = world // P
    accum = 2 * P if P > 1 else 1  # enough micro-batches in flight to keep every stage busy
    layout = Layout(
        world_size=world,
        stages=P,
        data_parallel=dp,
        micro_batch=cfg.micro_batch,
        grad_accum=accum,
        zero_stage=0,
        precision="fp32",
    )
    ds_config = {
        "train_batch_size": layout.train_batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "steps_per_print": 10**9,
        "zero_optimization": {"stage": 0},
    }
    engine = Engine(
        src.model_cfg, layout, ds_config, seed=0, partition_method=cfg.partition_method, inference=True
    )
    engine.module.load_state_dict(to_module_state(full, engine.module), strict=True)
    del full
    bos, pad = tokenizer.bos_id, tokenizer.pad_id

    def run(store: TokenStore, bounds: list[int]) -> EvalResult:
        sched = BucketSchedule(
            store,
            bounds,
            micro_batch=cfg.micro_batch,
            grad_accum=accum,
            data_parallel=dp,
            seed=0,
            shuffle=False,
        )
        return evaluate(engine, sched, store, bos, pad)

    rows: list[dict] = []
    result: dict = {
        "checkpoint": str(src.path),
        "kind": src.kind,
        "step": src.step,
        "trained_layout": src.trained_layout,
        "evaluated_layout": {"world_size": world, "stages": P, "data_parallel": dp, "precision": "fp32"},
    }
    if data is not None:
        store = TokenStore(data.split(cfg.split))
        if len(store) == 0:
            raise UserError(f"--data {data.path}: the {cfg.split} split is empty")
        res = run(store, data.meta["buckets"])
        result["data"] = str(data.path)
        result["split"] = cfg.split
        result.update(res.as_dict(cfg.split))
        rows.append(_row(f"{cfg.split} split", res))
    result["texts"] = []
    for name, raw, text in texts:
        res = run(text_store(tokenizer, text, cfg.text_chunk_len), [cfg.text_chunk_len])
        res = EvalResult(res.nats, res.tokens, len(raw))  # the file's bytes, what the compressors see
        ref = compressed_bits_per_byte(raw)
        row = {**_row(name, res), **ref}
        rows.append(row)
        result["texts"].append({"file": name, **{k: v for k, v in row.items() if k != "name"}})
    result["text_chunk_len"] = cfg.text_chunk_len
    if rank == 0:
        out = Path(cfg.out) if cfg.out else default_out(src)
        lay = src.trained_layout
        trained = f"P={lay['stages']} x DP={lay['data_parallel']}" if lay else "?"
        print(f"{src.describe()}\nevaluated with P={P} x DP={dp} (fp32)\n{fmt_table(rows)}", flush=True)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1))
        except OSError as e:
            raise UserError(f"--out {out}: cannot write ({e.strerror or e})") from None
        log.info(f"results (trained {trained}) written to {out}")
    for r in rows:
        if not math.isfinite(r["loss"]):
            raise RuntimeError(f"{r['name']}: loss is not finite ({r['loss']})")
    dist.barrier()
    return 0


def _row(name: str, res) -> dict:
    return {
        "name": name,
        "tokens": res.tokens,
        "bytes": res.num_bytes,
        "loss": res.loss,
        "ppl": res.perplexity,
        "bits/byte": res.bits_per_byte,
    }


if __name__ == "__main__":
    sys.exit(main())
