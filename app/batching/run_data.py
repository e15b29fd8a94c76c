"""A run's prepared data, opened in one place: token stores and batch schedules per split."""

from __future__ import annotations

from app.batching.buckets import BucketSchedule, TokenStore
from app.batching.carry_schedule import CarrySchedule
from app.common.errors import UserError
from app.parallel.layout import Layout
from data_prep.format import PreparedDataError, load_prepared


def open_prepared(path: str):
    """`load_prepared(--data)` (which reads only inside the folder, app.common.handed), its errors naming the
    flag."""
    try:
        return load_prepared(path)
    except PreparedDataError as e:
        raise UserError(f"--data: {e}") from None


class RunData:
    """`--data` opened once; stores and schedules are built on first use and kept."""

    def __init__(self, path: str) -> None:
        self.prepared = open_prepared(path)
        self.path = path
        self.tokenizer = self.prepared.meta["tokenizer"]
        self.bos, self.pad = self.tokenizer["bos_id"], self.tokenizer["pad_id"]
        self._batch_args: dict | None = None
        self._stores: dict[str, TokenStore] = {}
        self._schedules: dict[str, BucketSchedule] = {}

    def configure(
        self, layout: Layout, seed: int, tokens_per_micro_batch: int, carry_state: bool = False
    ) -> None:
        """Fix the batch arithmetic every schedule uses (known once the process group exists); with
        `carry_state` the train split's long documents are planned as streams (`CarrySchedule`)."""
        self.carry_state = carry_state
        self._batch_args = dict(
            micro_batch=layout.micro_batch,
            grad_accum=layout.grad_accum,
            data_parallel=layout.data_parallel,
            seed=seed,
            tokens_per_micro_batch=tokens_per_micro_batch,
        )
        splits = self.prepared.meta.get("splits") or {}
        val = (splits.get("validation") or {}).get("examples")
        if val == 0:  # checked from meta.json: opening an empty split fails with an obscure datasets error
            docs = sum(int((v or {}).get("docs", 0)) for v in splits.values())
            raise UserError(
                f"--data {self.path}: the validation split is empty ({docs} documents in all, none drawn for "
                f"validation); training validates during and after the run: re-run data_prep with more "
                f"documents or a larger --val-fraction"
            )
        if len(self.store("train")) == 0:
            raise UserError(f"--data {self.path}: the train split is empty")

    def store(self, split: str) -> TokenStore:
        if split not in self._stores:
            self._stores[split] = TokenStore(self.prepared.table(split))
        return self._stores[split]

    def schedule(self, split: str) -> BucketSchedule:
        """Train batches are shuffled per epoch; evaluation walks its split in order."""
        assert self._batch_args is not None, "configure() first"
        if split not in self._schedules:
            bounds = self.prepared.meta["buckets"]
            if split == "train" and self.carry_state:
                made = CarrySchedule(
                    self.store(split), bounds, eos_id=self.tokenizer["eos_id"], **self._batch_args
                )
            else:
                made = BucketSchedule(self.store(split), bounds, shuffle=split == "train", **self._batch_args)
            self._schedules[split] = made
        return self._schedules[split]

    def describe(self) -> dict:
        """The data part of the resolved run config, which every checkpoint records: an export's model card
        reads the data's summary here, never from the data folder the run named (outside what it is handed)."""
        meta = self.prepared.meta
        docs = meta.get("documents") or {}
        return {
            "path": str(self.prepared.path),
            "tokenizer": self.tokenizer,
            "splits": meta.get("splits"),
            "summary": {
                "source": meta.get("source"),
                "documents": {"kept": docs.get("kept"), "records": docs.get("records")},
                "max_seq_len": meta.get("max_seq_len"),
                "bytes_per_token": meta.get("bytes_per_token"),
            },
        }
