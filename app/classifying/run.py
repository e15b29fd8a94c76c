"""`app/classify.py` end to end: check every input, then each rank classifies its chunks, rank 0 joins them.

The input is cut into chunks of --chunk-rows consecutive rows; chunk c is rank c mod world's. Every rank
reads the whole input (a row is cheap to skip, a model step is not) and classifies only its chunks that have
no part yet (app/classifying/parts.py). Within a chunk the texts are sorted by length and batched under
--batch-tokens (app.probing.features.length_batches), the features read as app/transfer.py read them (the
prefill path for a probe, the fine-tuning path for a fine-tuned classifier) and turned into labels by the
kept head (app.probing.head.Head). Once every rank is done, rank 0 writes the output and the features from
the parts in chunk order, then removes them: the same bytes from 1 rank or N, killed and rerun or not.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from app.checkpoints.export_format import feature_preprocess
from app.checkpoints.loader import Source, open_source
from app.classifying.config import ClassifyConfig
from app.classifying.inputs import Input, Row
from app.classifying.parts import WorkDir
from app.classifying.writers import Columns, Rows, join_features, join_parts, part_bytes
from app.common.errors import UserError
from app.common.faults import hang_after_part
from app.common.files import fsync_dir
from app.common.logs import get_logger, progress_bar
from app.common.resources import available_memory, cap, fmt_bytes
from app.model import gpu_health
from app.model.memory import activation_floats_per_token
from app.probing.config import parse_layers
from app.probing.features import batch_feature_sets, length_batches, token_ids
from app.probing.finetune import pooled
from app.probing.head import Head
from app.probing.keep import load_head

PROGRESS_EVERY_S = 30.0  # a progress line this often in a log (a bar on a terminal)
NAMED_BAD_ROWS = 10  # bad rows named in the summary line (all are counted)


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
            kept, self.head = load_head(cfg.classifier)
            self.src: Source = kept.src
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
        self.device = self._device()
        work = cfg.work_dir or f"{cfg.output or cfg.features_out}.parts"
        self.work = WorkDir(Path(work), self._key(), cfg.output_kind())
        self.log = get_logger()

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

    def _device(self) -> torch.device:
        c = self.cfg.device
        if c == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device is available")
        if c == "cpu" or not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}")

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

    def _chunks(self) -> Iterator[tuple[int, list[Row]]]:
        """(chunk index, its rows) for this rank's chunks without a part; the rows of the others are read
        and dropped. Ends with the number of chunks of the whole input in `self.n_chunks`."""
        size, chunk, rows, index = self.cfg.chunk_rows, 0, [], 0
        mine = self._todo(0)
        for row in self.input.rows():
            if mine:
                rows.append(row)
            index += 1
            if index == size:
                if mine:
                    yield chunk, rows
                chunk, rows, index = chunk + 1, [], 0
                mine = self._todo(chunk)
        if index and mine:
            yield chunk, rows
        self.n_chunks = chunk + (1 if index else 0)

    def _todo(self, chunk: int) -> bool:
        return chunk % self.world == self.rank and not self.work.done(chunk)

    @torch.no_grad()
    def features(self, model, ids: list[np.ndarray]) -> np.ndarray:
        """Each text's features (n, d) float32, in `ids`' order, as app/transfer.py read them."""
        lengths = np.asarray([len(s) for s in ids], dtype=np.int64)
        out = np.zeros((len(ids), model.cfg.hidden_dim * len(self.layers)), dtype=np.float32)
        pad = self.tokenizer.pad_id
        for rows in length_batches(lengths, self.cfg.batch_tokens):
            batch = np.full((len(rows), int(lengths[rows].max())), pad, dtype=np.int64)
            for r, i in enumerate(rows):
                batch[r, : lengths[i]] = ids[i]
            x, lens = torch.from_numpy(batch).to(self.device), torch.from_numpy(lengths[rows]).to(self.device)
            if (
                self.head is not None and self.head.method == "finetune"
            ):  # (batch_feature_sets: checked inside)
                f = gpu_health.checked(pooled, model, x, lens, self.layers)  # a failed GPU loop: read again
            else:
                f = batch_feature_sets(model, x, lens, self.layers)[self.kind]
            out[rows] = f.float().cpu().numpy()
        return out

    def _too_long(self, good: list[Row], ids: list[np.ndarray]) -> tuple[list[Row], list[np.ndarray]]:
        """Texts of more tokens than the free memory can read at once become bad rows (named)."""
        longest = max((len(s) for s in ids), default=0)
        if longest <= self.cfg.batch_tokens:
            return good, ids
        per_token = 4 * activation_floats_per_token(self.src.model_cfg, max(self.layers) + 1, False)
        free = available_memory(self.device)
        if free is None or longest * per_token <= free:
            return good, ids
        keep = []
        for row, s in zip(good, ids):
            if len(s) * per_token > free:
                row.text, row.problem = (
                    None,
                    f"{len(s):,} tokens need {fmt_bytes(len(s) * per_token)}, {fmt_bytes(free)} free",
                )
            else:
                keep.append(s)
        return [r for r in good if r.text is not None], keep

    def classify(self, model, rows: list[Row]) -> tuple[bytes | None, np.ndarray | None, dict]:
        """One chunk -> (its output part, its features, its record)."""
        good = [r for r in rows if r.text is not None]
        ids = token_ids(self.tokenizer, [r.text for r in good], self.preprocess)
        if self.max_tokens:
            ids = [s[: self.max_tokens] for s in ids]
        good, ids = self._too_long(good, ids)
        F = self.features(model, ids)
        stats = {
            "rows": len(rows),
            "texts": len(good),
            "bytes": sum(r.nbytes for r in good),
            "tokens": int(sum(len(s) for s in ids)),
            "bad": [[r.number, r.problem] for r in rows if r.text is None],
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

    def _work(self, model) -> np.ndarray:
        """This rank's chunks -> [texts, bytes, tokens, chunks] classified in this run; a bar on a terminal
        and a line every PROGRESS_EVERY_S in a log (rank 0)."""
        done = np.zeros(4)
        t0 = last = time.perf_counter()
        bar = progress_bar(None, "classify", "text") if self.rank == 0 else None
        for chunk, rows in self._chunks():
            data, feats, stats = self.classify(model, rows)
            self.work.write(chunk, data, feats, stats)
            done += [stats["texts"], stats["bytes"], stats["tokens"], 1]
            hang_after_part(int(done[3]))
            if bar is not None:
                bar.update(stats["texts"])
                now = time.perf_counter()
                if not bar.disable or now - last < PROGRESS_EVERY_S:
                    continue
                last, read = now, self.input.progress()
                where = f", {100 * read:.0f}% of the input read" if read is not None else ""
                self.log.info(
                    f"classify: {int(done[0]):,} texts on rank 0{where}, {done[0] / (now - t0):,.1f} texts/s"
                )
        if bar is not None:
            bar.close()
        return done

    # ---- the run

    def _barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def run(self) -> dict | None:
        """Classify this rank's chunks; rank 0 then writes the outputs -> rank 0's summary (None elsewhere)."""
        from app.parallel.runtime import init_distributed, set_threads

        if self.world > 1:
            init_distributed()
        set_threads()
        model = self.src.load_model(self.device)
        resumed = self.work.prepare(self.log.warning) if self.rank == 0 else 0
        self._barrier()
        self.work.check()
        t0 = time.perf_counter()
        done = self._work(model)
        if self.world > 1:
            import torch.distributed as dist

            total = torch.from_numpy(done)
            dist.all_reduce(total)
            done = total.numpy()
        seconds = time.perf_counter() - t0
        if self.rank != 0:
            return None
        return self._finish(done, seconds, resumed)

    def _finish(self, done: np.ndarray, seconds: float, resumed: int) -> dict:
        """Rank 0: the parts joined into --output and --features-out, the work folder removed."""
        chunks = range(self.n_chunks)
        stats = [self.work.stats(c) for c in chunks]
        bad = [b for s in stats for b in s["bad"]]
        written = []
        for path, join in (
            (self.cfg.output, self._join_output),
            (self.cfg.features_out, self._join_features),
        ):
            if path is None:
                continue
            out = Path(path)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
            join(chunks, stats, tmp)
            tmp.replace(out)
            fsync_dir(out.parent)
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
            "chunks_resumed": resumed,
            "run": {"texts": int(done[0]), "bytes": int(done[1]), "tokens": int(done[2]), "seconds": seconds},
            "texts_per_s": done[0] / seconds if seconds else None,
            "bytes_per_s": done[1] / seconds if seconds else None,
            "written": written,
        }

    def _join_output(self, chunks, stats, tmp: Path) -> None:
        join_parts(self.cfg.output_kind(), self.cols, [self.work.part(c) for c in chunks], tmp)

    def _join_features(self, chunks, stats, tmp: Path) -> None:
        width = self.src.model_cfg.hidden_dim * len(self.layers)
        rows = sum(s["texts"] for s in stats)
        join_features([self.work.features(c) for c in chunks], (rows, width), tmp)


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
        f"{resumed}): this run {r['texts']:,} texts in {r['seconds']:.1f} s, {speed}"
    ]
    if res["bad_rows"]:
        named = ", ".join(f"row {n} ({why})" for n, why in res["bad"][:NAMED_BAD_ROWS])
        more = f", and {res['bad_rows'] - NAMED_BAD_ROWS} more" if res["bad_rows"] > NAMED_BAD_ROWS else ""
        lines.append(f"{res['bad_rows']:,} bad rows skipped: {named}{more}")
    lines.append(f"written: {', '.join(res['written'])}")
    return "\n".join(lines)
