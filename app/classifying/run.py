"""`app/classify.py` end to end: check every input, then each rank classifies its chunks, rank 0 joins them.

The input is cut into chunks of --chunk-rows consecutive rows; chunk c is rank c mod world's. Every rank
reads the whole input (a row is cheap to skip, a model step is not) and classifies only its chunks that have
no part yet (app/classifying/parts.py). Within a chunk the texts are sorted by length and batched under
--batch-tokens, the features read as app/transfer.py read them (app.classifier.features: the prefill path
for a probe, the fine-tuning path for a fine-tuned classifier; a longer text in pieces, its state carried)
and turned into labels by the kept head (app.classifier.head.Head). Once every rank is done, rank 0 writes
the output and the features from the parts in chunk order, then removes them: the same bytes from 1 rank
or N, killed and rerun or not.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import astuple, dataclass
from pathlib import Path

import numpy as np
import torch

from app.checkpoints.export_format import feature_preprocess
from app.checkpoints.loader import Source, open_source
from app.classifier.features import read_features, token_ids
from app.classifier.folder import read_classifier
from app.classifier.head import Head
from app.classifier.spec import parse_layers
from app.classifying.config import ClassifyConfig
from app.classifying.inputs import Input, Row
from app.classifying.parts import WorkDir
from app.classifying.writers import Columns, Rows, join_features, join_parts, part_bytes
from app.common import outputs
from app.common.devices import rank_device
from app.common.errors import UserError, claim_report
from app.common.faults import hang_after_part
from app.common.logs import Progress, get_logger
from app.common.resources import cap

RESUME = "the finished parts are kept: free some space and run the same command again to resume"
NAMED_BAD_ROWS = 10  # bad rows named in the summary line (all are counted)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program Ctrl-C stopped


@dataclass(slots=True)
class Tally:
    """What one run classified (a rank's, then every rank's summed)."""

    texts: int = 0
    bytes: int = 0
    tokens: int = 0
    chunks: int = 0  # classified in this run
    reused: int = 0  # parts of an earlier run made from the bytes read now: kept
    redone: int = 0  # parts of an earlier run made from other bytes: classified afresh

    def add(self, stats: dict) -> None:
        self.texts, self.bytes = self.texts + stats["texts"], self.bytes + stats["bytes"]
        self.tokens, self.chunks = self.tokens + stats["tokens"], self.chunks + 1

    def summed(self, world: int) -> Tally:
        """Every rank's tally added up (a collective: every rank calls it)."""
        if world == 1:
            return self
        import torch.distributed as dist

        total = torch.tensor(astuple(self), dtype=torch.int64)
        dist.all_reduce(total)
        return Tally(*(int(v) for v in total))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def folder_identity(path: Path) -> str:
    """A digest of a model folder's file names, sizes and modification times: a changed file, a new key."""
    h = hashlib.sha256()
    for p in sorted(q for q in Path(path).rglob("*") if q.is_file()):
        st = p.stat()
        h.update(f"{p.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


class Classify:
    def __init__(self, cfg: ClassifyConfig) -> None:
        """Everything that can be wrong with the request fails here, before any process group or model."""
        self.cfg = cfg
        self.rank, self.world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        if cfg.input == "-" and self.world > 1:
            raise UserError("--input -: stdin reaches one process; give the ranks a file to share")
        if cfg.input == "-" and sys.stdin.isatty():
            raise UserError("--input -: stdin is a terminal; give --input FILE or pipe the texts in")
        self.input = Input(cfg.input, cfg.input_kind(), cfg.text_field, cfg.keep_fields)
        self.head: Head | None = None
        if cfg.classifier is not None:
            kept = read_classifier(cfg.classifier)
            self.src: Source = kept.src
            self.head = kept.head
            self.kind, self.layers, self.max_tokens = (
                self.head.feature,
                self.head.layers,
                self.head.max_tokens,
            )
        else:
            self.src = open_source(cfg.checkpoint)
            try:
                self.layers = parse_layers(cfg.layer, self.src.model_cfg.num_layers)
            except ValueError as e:
                raise UserError(str(e)) from None
            self.kind, self.max_tokens = cfg.features, 0
        self.tokenizer = self.src.tokenizer()
        self.preprocess = feature_preprocess(self.src.path)  # an import's "openai": as transfer read them
        self.cols = self._columns()
        self.log = get_logger()
        self.said: list[str] = [self.input.said] if self.input.said and self.rank == 0 else []
        self.device = rank_device(cfg.device, "--device", self.said.append if self.rank == 0 else None)
        work = cfg.work_dir or f"{cfg.output or cfg.features_out}.parts"
        self.work = WorkDir(Path(work), self._key(), cfg.output_kind(), _say if self.rank == 0 else None)

    def _columns(self) -> Columns | None:
        if self.head is None:
            return None
        say = print if self.rank == 0 else None
        limits = [(len(self.head.top_neurons), f"the classifier keeps {len(self.head.top_neurons)}")]
        top = cap("--top-neurons", self.cfg.top_neurons, limits, say)
        cols = Columns(
            self.cfg.keep_fields, self.head.labels, self.head.multi_label, self.head.top_neurons[:top],
            self.input.kept_types,
        )  # fmt: skip
        cols.check()
        return cols

    def _key(self) -> dict:
        """Everything a byte of the output depends on (the number of ranks does not)."""
        c = self.cfg
        key = {
            "input": self.input.identity(),
            "input_format": self.input.kind,
            "text_field": c.text_field,
            "keep_fields": c.keep_fields,
            "model": {"path": str(self.src.path.resolve()), "files": folder_identity(self.src.path)},
            "features": [self.kind, self.layers, self.max_tokens, self.preprocess],
            "output": c.output_kind(),
            "features_out": c.features_out is not None,
            "neurons": self.cols.neurons if self.cols else [],
            "batch_tokens": c.batch_tokens,
            "chunk_rows": c.chunk_rows,
            "device": self.device.type,
        }
        if c.input == "-":  # a stream cannot be checked to be the same: never resumed
            key["stdin"] = time.time_ns()
        return key

    # ---- the work

    def _chunks(self, tally: Tally) -> Iterator[tuple[int, list[Row], str]]:
        """(chunk index, its rows, the digest of the input bytes they were read from) for this rank's chunks
        that have no part made from those bytes; the rows of the others are read and dropped. Ends with the
        number of chunks of the whole input in `self.n_chunks`."""
        size, chunk, rows, index = self.cfg.chunk_rows, 0, [], 0
        for row in self.input.rows():
            if chunk % self.world == self.rank:
                rows.append(row)
            index += 1
            if index == size:
                yield from self._due(chunk, rows, tally)
                chunk, rows, index = chunk + 1, [], 0
        if index:
            yield from self._due(chunk, rows, tally)
        self.n_chunks = chunk + (1 if index else 0)

    def _due(self, chunk: int, rows: list[Row], tally: Tally) -> Iterator[tuple[int, list[Row], str]]:
        """A whole chunk read: this rank's to classify unless its part was made from these very bytes."""
        digest = self.input.take_digest()  # every rank reads every chunk: the digests stay in step
        if chunk % self.world != self.rank:
            return
        made = self.work.made_from(chunk)
        if made == digest:
            tally.reused += 1
            return
        if made is not None:
            if not tally.redone:
                self.log.warning(
                    f"--input {self.input.describe()}: rows {chunk * self.cfg.chunk_rows + 1}-"
                    f"{chunk * self.cfg.chunk_rows + len(rows)} are not the bytes an earlier run classified "
                    "(the file was rewritten); each such chunk is classified afresh"
                )
            tally.redone += 1
        yield chunk, rows, digest

    def features(self, model, ids: list[np.ndarray], step=lambda _: None) -> np.ndarray:
        """Each text's features (n, d) float32, in `ids`' order, as app/transfer.py read them."""
        method = "probe" if self.head is None else self.head.method
        head = (method, self.kind, self.layers)
        return read_features(model, ids, head, self.cfg.batch_tokens, self.tokenizer.pad_id, step)

    def classify(
        self, model, rows: list[Row], step=lambda _: None
    ) -> tuple[bytes | None, np.ndarray | None, dict]:
        """One chunk -> (its output part, its features, its record); `step(tokens)` as the features are read."""
        good = [r for r in rows if r.text is not None]
        ids = token_ids(self.tokenizer, [r.text for r in good], self.preprocess)
        if self.max_tokens:
            ids = [s[: self.max_tokens] for s in ids]
        F = self.features(model, ids, step)
        stats = {
            "rows": len(rows),
            "texts": len(good),
            "bytes": sum(r.nbytes for r in good),
            "tokens": int(sum(len(s) for s in ids)),
            "bad": [[r.number, r.problem] for r in rows if r.text is None],
            "escaped": sum(r.escaped for r in rows),
        }
        data = None
        if self.head is not None and self.cfg.output is not None:
            data = part_bytes(self.cfg.output_kind(), self.cols, self._rows(good, F))
        return data, (F if self.cfg.features_out else None), stats

    def _rows(self, good: list[Row], F: np.ndarray) -> Rows:
        Z = self.head.logits(F)
        decided, names = self.head.decide(Z), self.head.labels
        if self.head.multi_label:
            labels = [[names[k] for k in np.flatnonzero(d)] for d in decided]
        else:
            labels = [names[k] for k in decided]
        return Rows(
            number=np.asarray([r.number for r in good], dtype=np.int64),
            kept=[r.kept for r in good],
            labels=labels,
            probs=self.head.probabilities(Z).astype(np.float32),
            neurons=F[:, self.cols.neurons],
        )

    def _progress(self, tally: Tally):
        """Rank 0's progress: a bar on a terminal, a line every heartbeat in a log (texts, tokens read, the
        share of the input read); the other ranks say nothing."""
        if self.rank != 0:
            return contextlib.nullcontext(None)

        def detail() -> str:
            read = self.input.progress()
            where = f", {100 * read:.0f}% of the input read" if read is not None else ""
            return f"{tally.tokens:,} tokens{where}"

        return Progress(None, "classify", "text", detail=detail)

    def _work(self, model) -> Tally:
        """This rank's chunks, classified and written -> what this run did on this rank."""
        tally, reading = Tally(), Tally()
        with self._progress(reading) as progress:

            def step(tokens: int) -> None:
                reading.tokens += tokens
                if progress is not None:
                    progress.update(0)

            for chunk, rows, digest in self._chunks(tally):
                data, feats, stats = self.classify(model, rows, step)
                stats["input_sha256"] = digest
                self.work.write(chunk, data, feats, stats)
                tally.add(stats)
                hang_after_part(tally.chunks)
                if progress is not None:
                    progress.update(stats["texts"])
        return tally

    # ---- the run

    def _barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def run(self) -> dict | None:
        """Classify this rank's chunks; rank 0 then writes the outputs -> rank 0's summary (None elsewhere)."""
        from app.parallel.runtime import init_distributed, set_threads, watch_launcher

        if self.world > 1:
            init_distributed()  # watches the launcher too
        elif "RANK" in os.environ:  # one rank under the launcher: it must not outlive it either
            watch_launcher()
        set_threads()
        for line in self.said:
            self.log.info(line)
        start = time.perf_counter()
        model = self.src.load_model(self.device)
        self._warm_up(model)
        if self.rank == 0:
            self.work.prepare(self.log.warning)
        self._barrier()
        self.work.check()
        t0 = time.perf_counter()
        with outputs.disk_errors("--work-dir", self.work.path, RESUME):
            done = self._work(model).summed(self.world)
        seconds = time.perf_counter() - t0
        if self.rank != 0:
            return None
        return self._finish(done, seconds, t0 - start)

    def _warm_up(self, model) -> None:
        """One short text through the features' path before the clock starts: a first run's kernel build
        (the fused CPU core's C++ extension, said as it happens) is start-up, not the texts' rate."""
        bos = self.tokenizer.bos_id
        self.features(model, [np.asarray([bos, bos], dtype=np.int64)])

    def _finish(self, done: Tally, seconds: float, start_up: float) -> dict:
        """Rank 0: the parts joined into --output and --features-out, the work folder removed."""
        chunks = range(self.n_chunks)
        stats = [self.work.stats(c) for c in chunks]
        bad = [b for s in stats for b in s["bad"]]
        if bad and not any(s["texts"] for s in stats):  # nothing to write: our parts go, the line says why
            self.work.remove()
            raise UserError(unreadable(self.input, len(bad), bad))
        written = []
        for flag, path, join in (
            ("--output", self.cfg.output, self._join_output),
            ("--features-out", self.cfg.features_out, self._join_features),
        ):
            if path is None:
                continue
            out = Path(path)
            with outputs.disk_errors(flag, out, RESUME), outputs.new_file(out) as tmp:  # whole or absent
                join(chunks, stats, tmp)
            written.append(str(out))
        self.work.remove()
        return {
            "input": self.input.describe(),
            "rows": sum(s["rows"] for s in stats),
            "texts": sum(s["texts"] for s in stats),
            "bad_rows": len(bad),
            "bad": bad,
            "ranks": self.world,
            "chunks": self.n_chunks,
            "chunks_resumed": done.reused,
            "chunks_redone": done.redone,
            "escaped": sum(s.get("escaped", 0) for s in stats),
            "start_up_seconds": start_up,
            "run": {"texts": done.texts, "bytes": done.bytes, "tokens": done.tokens, "seconds": seconds},
            "texts_per_s": done.texts / seconds if seconds else None,
            "bytes_per_s": done.bytes / seconds if seconds else None,
            "written": written,
        }

    def _join_output(self, chunks, stats, tmp: Path) -> None:
        join_parts(self.cfg.output_kind(), self.cols, [self.work.part(c) for c in chunks], tmp)

    def _join_features(self, chunks, stats, tmp: Path) -> None:
        width = self.src.model_cfg.hidden_dim * len(self.layers)
        rows = sum(s["texts"] for s in stats)
        join_features([self.work.features(c) for c in chunks], (rows, width), tmp)


def _named(bad: list, count: int) -> str:
    named = ", ".join(f"row {n} ({why})" for n, why in bad[:NAMED_BAD_ROWS])
    return named + (f", and {count - NAMED_BAD_ROWS:,} more" if count > NAMED_BAD_ROWS else "")


def unreadable(source: Input, count: int, bad: list) -> str:
    """The line for an input none of whose rows could be classified (a binary file, another format)."""
    return (
        f"--input {source.describe()}: none of its {count:,} rows could be read as {source.kind} text "
        f"({_named(bad, count)}); is it the file you meant, in that format (--input-format)?"
    )


def interrupted(job: Classify | None) -> int:
    """Ctrl-C: one line (once per node of a launch) saying what is kept and how to go on; exit 130."""
    kept = job.work.parts_done() if job is not None else 0
    if claim_report():
        line = (
            f"classify: interrupted (Ctrl-C); {kept:,} classified chunks are kept in {job.work.path}: run "
            "the same command again to continue from them"
            if kept
            else "classify: interrupted (Ctrl-C) before a chunk was classified; nothing was written"
        )
        print(line, file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def summary(res: dict) -> str:
    """The closing line(s): what was classified, how fast, the bad rows by number, what was written."""
    r = res["run"]
    resumed = (
        f", {res['chunks_resumed']} of {res['chunks']} chunks from an earlier run"
        if res["chunks_resumed"]
        else ""
    )
    speed = (
        f"{res['texts_per_s']:,.1f} texts/s, {res['bytes_per_s']:,.0f} bytes/s"
        if res["texts_per_s"]
        else "no new texts"
    )
    lines = [
        f"classified {res['texts']:,} texts of {res['input']} ({res['ranks']} rank{'s' if res['ranks'] > 1 else ''}"
        f"{resumed}): this run {r['texts']:,} texts in {r['seconds']:.1f} s, {speed} (start-up, "
        f"{res['start_up_seconds']:.1f} s, not counted)"
    ]
    if res["chunks_redone"]:
        lines.append(
            f"{res['chunks_redone']:,} chunks classified afresh: the input's bytes there are not those their "
            "parts were made from"
        )
    if res["bad_rows"]:
        lines.append(f"{res['bad_rows']:,} bad rows skipped: {_named(res['bad'], res['bad_rows'])}")
    if res["escaped"]:
        lines.append(
            f"{res['escaped']:,} --keep-fields values were not valid UTF-8: written escaped (\\xNN for a "
            "byte, \\uXXXX for a lone surrogate)"
        )
    lines.append(f"written: {', '.join(res['written'])}")
    return "\n".join(lines)
