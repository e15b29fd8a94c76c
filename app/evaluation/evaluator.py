"""Evaluate a checkpoint or export: a --split of prepared data and/or raw --text files, any layout.

`Evaluator` opens and checks every input before a process group exists (a bad request fails in a
second), then builds an inference engine in the requested layout, through the same layout checks as
training, and reports exact numbers per source.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

import numpy as np
import torch.distributed as dist

from app.batching.buckets import BucketSchedule, TokenStore, bucket_counts
from app.batching.run_data import open_prepared
from app.checkpoints.consolidate import to_module_state
from app.checkpoints.loader import Source, open_source
from app.checkpoints.run_info import eval_result_path
from app.common import outputs
from app.common.devices import rank_device
from app.common.errors import UserError
from app.common.logs import Progress, get_logger, heartbeat
from app.common.text import without_bom
from app.evaluation.bounds import Inputs, cap_lengths, check_evaluation_fits
from app.evaluation.cache import CACHE_COLUMNS, cache_fields, cache_lines, cache_nats
from app.evaluation.compressors import compressed_bits_per_byte
from app.evaluation.config import EvalConfig
from app.evaluation.dynamic import DYNAMIC_COLUMNS, DynamicEvaluator, dynamic_fields, dynamic_lines
from app.evaluation.held_out import EvalResult, evaluate
from app.evaluation.stream import (
    STREAM_COLUMNS,
    document_lengths,
    split_documents,
    stream_fields,
    stream_nats,
)
from app.generation.decoder import Decoder
from app.parallel.engine import Engine
from app.parallel.layout import inference_layout
from app.parallel.runtime import init_distributed, set_threads


def read_texts(paths: list[str]) -> list[tuple[str, bytes, str]]:
    out = []
    for name in paths:
        p = Path(name)
        try:
            raw = without_bom(p.read_bytes())  # a byte-order mark is no text of the file's
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


def text_ids(tokenizer, text: str) -> np.ndarray:
    """A --text file's tokens, EOS appended (int64)."""
    return np.asarray([*tokenizer.encode(text), tokenizer.eos_id], dtype=np.int64)


def text_store(tokenizer, text: str | np.ndarray, chunk: int):
    """One document (its text, or its `text_ids`) -> a TokenStore of --text-chunk-len pieces (the data_prep
    row format)."""
    import pyarrow as pa

    ids = text_ids(tokenizer, text) if isinstance(text, str) else text
    pieces = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
    table = pa.table(
        {
            "input_ids": [p.tolist() for p in pieces],
            "length": [len(p) for p in pieces],
            "num_bytes": [int(tokenizer.token_bytes[p].sum()) for p in pieces],
            "bucket": [0] * len(pieces),
        }
    )
    return TokenStore(table)


def default_out(src) -> Path:
    return eval_result_path(src)  # where the model card of an export looks for it, too


def fmt_table(rows: list[dict]) -> str:
    cols = ["", "tokens", "bytes", "loss", "ppl", "bits/byte"]
    cols += [c for c in STREAM_COLUMNS if any(c in r for r in rows)]
    cols += ["gzip -9", "bzip2 -9", "xz -9"]
    cols += [c for c in DYNAMIC_COLUMNS + CACHE_COLUMNS if any(c in r for r in rows)]

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


def text_scoring(cfg: EvalConfig, streamed: bool) -> dict:
    """What each --text figure is, for the JSON beside them (the stream and cache ones where this process
    read them: rank 0)."""
    chunk = cfg.text_chunk_len
    out = {"bits/byte": f"{chunk}-token pieces (--text-chunk-len), each read from a fresh state after BOS"}
    if cfg.stream and streamed:
        out["stream bits/byte"] = "the whole file read as one stream, the state carried from piece to piece"
    if cfg.cache and streamed:
        out["cache"] = (
            f"read as one stream with a neural cache of the last {cfg.cache_window} positions (no weight "
            "changes): the Bayesian mixture of the --cache-lambda x --cache-theta settings"
        )
    return out


def _row(name: str, res) -> dict:
    return {
        "name": name,
        "tokens": res.tokens,
        "bytes": res.num_bytes,
        "loss": res.loss,
        "ppl": res.perplexity,
        "bits/byte": res.bits_per_byte,
    }


class Evaluator:
    def __init__(self, cfg: EvalConfig) -> None:
        """Everything that can be wrong with the request fails here, before any process group exists."""
        self.cfg = cfg
        self.src: Source = open_source(cfg.checkpoint)
        self.out = Path(cfg.out) if cfg.out else default_out(self.src)
        reads = [("--checkpoint", cfg.checkpoint), ("--data", cfg.data), *(("--text", t) for t in cfg.text)]
        outputs.check([outputs.file("--out", self.out)], reads)  # no input written over; writable
        self.tokenizer = self.src.tokenizer()
        self.data = self.store = None
        if cfg.data is not None:
            self.data = open_prepared(cfg.data)
            check_data_tokenizer(self.data, self.src)
            self.store = TokenStore(self.data.table(cfg.split))
            if len(self.store) == 0:
                raise UserError(f"--data {self.data.path}: the {cfg.split} split is empty")
        self.texts = read_texts(cfg.text)
        for flag, on in (("--dynamic", cfg.dynamic), ("--cache", cfg.cache)):
            if on and int(os.environ.get("WORLD_SIZE", "1")) > 1:
                raise UserError(
                    f"{flag} runs in one process: use python app/evaluate.py, not the deepspeed launcher"
                )
        num_specs = self.src.model_cfg.num_layers + 2
        if cfg.pipeline_stages > num_specs:
            raise UserError(
                f"--pipeline-stages {cfg.pipeline_stages}: the model has only {num_specs} layers "
                f"(embedding, {self.src.model_cfg.num_layers} recurrent, head)"
            )
        self.ids = [text_ids(self.tokenizer, text) for _, _, text in self.texts]  # each file's, read once
        self._bound()  # before the weights are read: every size the flags ask for fits
        self.full = self.src.state_dict()

    def _bound(self) -> None:
        """--text-chunk-len, --dyn-segment, --cache-window and --micro-batch capped at what the input can
        use, and the evaluation's memory checked (app.evaluation.bounds), before the weights are read."""
        store, rank = self.store, int(os.environ.get("RANK", "0"))
        empty = np.zeros(0, np.int64)
        bounds = self.data.meta["buckets"] if self.data is not None else []
        inputs = Inputs(
            texts=[len(ids) for ids in self.ids],
            rows=store.lengths if store is not None else empty,
            buckets=bucket_counts(store, len(bounds)) if store is not None else empty,
            bounds=bounds,
            documents=document_lengths(store, self.tokenizer.eos_id) if store is not None else empty,
        )
        log = get_logger()
        say, note = (log.warning, log.info) if rank == 0 else (None, None)
        self.cfg = cap_lengths(self.cfg, inputs, say, note)
        device = str(rank_device("auto", "device"))  # the device this rank's engine takes
        reads = rank == 0 and bool(self.texts or self.data)
        check_evaluation_fits(
            self.cfg, self.src.model_cfg, inputs, stages=self.cfg.pipeline_stages, device=device, reads=reads
        )

    def setup(self) -> None:
        """The process group and an inference engine holding the weights, in the requested layout."""
        init_distributed()
        self.rank, world = dist.get_rank(), dist.get_world_size()
        set_threads()
        self.layout, ds_config = inference_layout(world, self.cfg.pipeline_stages, self.cfg.micro_batch)
        self.engine = Engine(
            self.src.model_cfg,
            self.layout,
            ds_config,
            seed=0,
            partition_method=self.cfg.partition_method,
            inference=True,
        )
        self.engine.module.load_state_dict(to_module_state(self.full, self.engine.module), strict=True)
        self.decoder = None  # the stream and cache readers: one process reads each text in order
        if (self.cfg.stream or self.cfg.cache) and (self.texts or self.data) and self.rank == 0:
            self.decoder = Decoder(self.src.load_model(state=self.full))
        del self.full
        self.dynamic = None
        if self.cfg.dynamic:  # a private copy that adapts; the engine's weights stay the trained ones
            c = self.cfg
            self.dynamic = DynamicEvaluator(self.src.load_model(), c.dyn_lr, c.dyn_decay, c.dyn_segment)

    def _progress(
        self, total: int, desc: str, unit: str
    ) -> contextlib.AbstractContextManager[Progress | None]:
        """Rank 0's progress of one pass (a bar on a terminal, a line at least every 20 s in a log)."""
        return Progress(total, desc, unit) if self.rank == 0 else contextlib.nullcontext()

    def _run(self, store: TokenStore, bounds: list[int], desc: str) -> EvalResult:
        lay = self.layout
        sched = BucketSchedule(
            store,
            bounds,
            micro_batch=lay.micro_batch,
            grad_accum=lay.grad_accum,
            data_parallel=lay.data_parallel,
            seed=0,
            shuffle=False,
        )
        t = self.tokenizer
        with self._progress(sched.steps_per_epoch, desc, "batch") as p:
            return evaluate(self.engine, sched, store, t.bos_id, t.pad_id, progress=p)[0]

    def _with_dynamic(self, row: dict, sequences: list, num_bytes: int) -> dict:
        """Add the dynamic-evaluation fields (and the gain over `row`'s static bits/byte) to `row`."""
        total = (1 + len(self.cfg.dyn_lr)) * sum(len(s) - 1 for s in sequences)  # each learner reads them all
        with self._progress(total, f"dynamic {row['name']}", "token") as p:
            dyn = dynamic_fields(self.dynamic.evaluate(sequences, p), num_bytes)
        dyn["dyn gain %"] = 100.0 * (1.0 - dyn["dynamic"] / row["bits/byte"])
        row.update(dyn)
        return dyn

    def _with_streams(self, row: dict, seqs: list[np.ndarray], num_bytes: int) -> dict:
        """Add to `row` the fields of `seqs` (targets: a --text file's tokens and EOS, or a split's
        documents) each read as one stream, the state carried (--stream: app/evaluation/stream.py), and
        with the neural cache (--cache: app/evaluation/cache.py); rank 0, which holds the decoder
        -> the fields added."""
        t, c = self.tokenizer, self.cfg
        out: dict = {}
        tokens = sum(len(s) for s in seqs)
        if c.stream:
            with self._progress(tokens, f"stream {row['name']}", "token") as p:
                res = stream_nats(self.decoder, seqs, t.bos_id, t.pad_id, c.text_chunk_len, progress=p)
            out |= stream_fields(res, num_bytes)
        if c.cache:
            grid = [(lam, theta) for lam in c.cache_lambda for theta in c.cache_theta]
            with self._progress(tokens, f"cache {row['name']}", "token") as p:
                res = cache_nats(self.decoder, seqs, t.bos_id, c.text_chunk_len, c.cache_window, grid, p)
            out |= cache_fields(res, num_bytes)
            out["cache gain %"] = 100.0 * (1.0 - out["cache"] / row["bits/byte"])
        row.update(out)
        return out

    def _compressed(self, documents: list[np.ndarray], split: str) -> dict[str, float]:
        """gzip/bzip2/xz bits/byte on the split's raw text: its documents decoded (data prep's tokenizers are
        lossless), which are the bytes its bits/byte counts."""
        t = self.tokenizer
        raw = b"".join(t.decode(doc[doc != t.eos_id]).encode() for doc in documents)
        with heartbeat(f"compressing the {split} split ({len(raw):,} bytes) with gzip, bzip2 and xz"):
            return compressed_bits_per_byte(raw)

    def run(self) -> tuple[dict, list[dict]]:
        """-> (the JSON result, one table row per evaluated source)."""
        cfg, src, lay = self.cfg, self.src, self.layout
        rows: list[dict] = []
        result: dict = {
            "checkpoint": str(src.path),
            "kind": src.kind,
            "step": src.step,
            "trained_layout": src.trained_layout,
            "evaluated_layout": {
                "world_size": lay.world_size,
                "stages": lay.stages,
                "data_parallel": lay.data_parallel,
                "precision": "fp32",
            },
        }
        if self.data is not None:
            store = self.store
            res = self._run(store, self.data.meta["buckets"], f"{cfg.split} split")
            result.update({"data": str(self.data.path), "split": cfg.split, **res.as_dict(cfg.split)})
            rows.append(_row(f"{cfg.split} split", res))
            documents = split_documents(store, self.tokenizer.eos_id) if self.rank == 0 else []
            if self.rank == 0:  # the compressors on the split's text, as the model's bits/byte count it
                squeezed = self._compressed(documents, cfg.split)
                rows[-1].update(squeezed)
                result.update({f"{cfg.split}/{k}": v for k, v in squeezed.items()})
            if self.decoder is not None:  # the documents are read where they were built: rank 0
                streams = self._with_streams(rows[-1], documents, res.num_bytes)
                result.update({f"{cfg.split}/{k}": v for k, v in streams.items()})
            if self.dynamic is not None:
                seqs = [[self.tokenizer.bos_id, *store.ids(i).tolist()] for i in range(len(store))]
                dyn = self._with_dynamic(rows[-1], seqs, res.num_bytes)
                result.update({f"{cfg.split}/{k}": v for k, v in dyn.items()})
        result["texts"] = []
        for (name, raw, _), ids in zip(self.texts, self.ids, strict=True):
            res = self._run(text_store(self.tokenizer, ids, cfg.text_chunk_len), [cfg.text_chunk_len], name)
            res = EvalResult(res.nats, res.tokens, len(raw))  # the file's bytes, what the compressors see
            row = {**_row(name, res), **compressed_bits_per_byte(raw)}
            if self.decoder is not None:
                self._with_streams(row, [ids], len(raw))
            if self.dynamic is not None:
                self._with_dynamic(row, [[self.tokenizer.bos_id, *ids.tolist()]], len(raw))
            rows.append(row)
            result["texts"].append({"file": name, **{k: v for k, v in row.items() if k != "name"}})
        result["text_chunk_len"] = cfg.text_chunk_len
        if self.texts:
            result["text_scoring"] = text_scoring(cfg, self.decoder is not None)
        if self.dynamic is not None:
            result["dynamic"] = {"lr": cfg.dyn_lr, "decay": cfg.dyn_decay, "segment": cfg.dyn_segment}
        if cfg.cache and self.decoder is not None:
            result["cache"] = {
                "window": cfg.cache_window,
                "lambda": cfg.cache_lambda,
                "theta": cfg.cache_theta,
            }
        return result, rows

    def report(self, result: dict, rows: list[dict], log) -> None:
        """Rank 0 prints the table and writes the JSON; every rank then refuses a non-finite loss."""
        if self.rank == 0:
            out = self.out
            lay = self.src.trained_layout
            trained = f"P={lay['stages']} x DP={lay['data_parallel']}" if lay else "?"
            print(
                f"{self.src.describe()}\nevaluated with P={self.layout.stages} x DP={self.layout.data_parallel} "
                f"(fp32)\n{fmt_table(rows)}",
                *(f"  {k}: {v}" for k, v in result.get("text_scoring", {}).items()),
                *dynamic_lines(rows),
                *cache_lines(rows),
                sep="\n",
                flush=True,
            )
            try:
                with outputs.new_file(out) as tmp:  # whole or absent
                    tmp.write_text(json.dumps(result, indent=1))
            except OSError as e:
                raise UserError(
                    f"--out {out}: cannot write ({outputs.disk_problem(e) or e.strerror or e})"
                ) from None
            log.info(f"results (trained {trained}) written to {out}")
        for r in rows:
            if not math.isfinite(r["loss"]):
                raise RuntimeError(f"{r['name']}: loss is not finite ({r['loss']})")
        dist.barrier()
