"""Equal-work comparisons of training configs by held-out bits per byte (how bench/README.md's table was made).

    python bench/quality_sweep.py pack --out PACK NAME=PREPARED_DIR:HELDOUT_TXT ...
    python bench/quality_sweep.py run --pack PACK --jobs JOBS.json [--device cpu|cuda] [--parallel N]
    python bench/quality_sweep.py cost --configs CONFIGS.json [--rounds 5]

Wall-clock comparisons on a shared machine are unfair (load varies between runs), so configurations are
compared at equal work instead: each trains the number of steps its own throughput (tokens/s of the real
2-process pipeline run, measured side by side with `bench/quality.py --no-score`) fits into a budget,
then the last 10% of the corpus is scored as evaluate.py's `--text` path scores it (pieces of 256 tokens,
each from a fresh state after BOS; bits per byte of the raw text). What a config learns in N steps does
not depend on the machine that runs them, so `run` may run on any device (a GPU runs the sweep in
minutes): a plain PyTorch loop over the app's own model (`LanguageModel`, the DeepSpeed runs' weights at
the same seed), batches (`BucketSchedule`, `collate`), loss and lr schedule, with the DeepSpeed step's
arithmetic: the mean loss over the step's real tokens, gradient clipping, AdamW. `pack` (run where
`data_prep`'s outputs are) writes what `run` needs as Arrow and numpy files, so `run` needs only torch,
numpy and pyarrow.

`cost` gives each config's relative tokens/s on the 2-process pipeline without training it: every layer's
forward + backward is timed as the trainer's `--partition-method time` times it (one thread, the configs
interleaved over `--rounds`, the minimum kept, so load from other processes hits all alike), and the
pipeline's time per micro-batch is that of its slowest stage under the best 2-stage split (which is what
the partitioner picks on a quiet machine). A config there is {name, model, vocab, micro_batch, seq_len}.

A job is a JSON object: name, data (a NAME given to pack), steps, and optionally model (a preset name
or ModelConfig fields), micro_batch (8), grad_accum (4), lr (3e-3), warmup (10), decay ("cosine"),
min_ratio (0.1), tokens_per_micro_batch (0), betas ([0.9, 0.99]), seed (1234), val (false: also score
the validation split). One JSON line per job
is printed as it finishes; the last line is a JSON list of them all.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEXT_CHUNK = 256  # evaluate.py's --text-chunk-len default
DEFAULTS = dict(
    model="small", micro_batch=8, grad_accum=4, lr=3e-3, warmup=10, decay="cosine", min_ratio=0.1,
    tokens_per_micro_batch=0, betas=[0.9, 0.99], seed=1234, val=False,
)  # fmt: skip


# ---------------------------------------------------------------- pack (where data_prep's outputs are)


def pack(out: Path, specs: list[str]) -> None:
    import numpy as np
    import pyarrow as pa

    from data_prep.format import load_prepared
    from data_prep.tokenizer import ByteTokenizer, SentencePieceTokenizer

    out.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        name, _, rest = spec.partition("=")
        prepared, _, held = rest.rpartition(":")
        data = load_prepared(prepared)
        dest = out / name
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(data.path / "meta.json", dest / "meta.json")
        for split in ("train", "validation"):
            table = data.split(split).data.table.select(["input_ids", "length", "num_bytes", "bucket"])
            with pa.OSFile(str(dest / f"{split}.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
        if data.tokenizer_path is not None:
            shutil.copy(data.tokenizer_path, dest / "tokenizer.model")
            tok = SentencePieceTokenizer.from_file(data.tokenizer_path)
        else:
            tok = ByteTokenizer()
        raw = Path(held).read_bytes()
        ids = np.asarray([*tok.encode(raw.decode("utf-8")), tok.eos_id], dtype=np.int32)
        np.save(dest / "heldout_ids.npy", ids)
        (dest / "heldout.json").write_text(json.dumps({"bytes": len(raw), "file": str(held)}))
        print(f"packed {name}: {prepared} + {held} ({len(ids)} held-out tokens, {len(raw)} bytes)")


# ---------------------------------------------------------------- run (any device)


class _Split:
    """What TokenStore reads from a datasets split: `.data.column(...)` over Arrow chunks."""

    _indices = None

    def __init__(self, path: Path) -> None:
        import pyarrow as pa

        self.data = pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def _model_config(spec, vocab: int, device: str):
    from app.model.config import PRESETS, ModelConfig

    d = dict(PRESETS[spec]) if isinstance(spec, str) else dict(spec)
    d.setdefault("core", "auto" if device == "cpu" else "python")
    return ModelConfig(vocab_size=vocab, **d)


def _heldout_bits_per_byte(model, ids, num_bytes: int, bos: int, pad: int, device) -> float:
    """evaluate.py --text: pieces of TEXT_CHUNK tokens, each after BOS from a zero state."""
    import torch

    from app.batching.buckets import shifted_batch
    from app.model.loss import IGNORE_INDEX

    pieces = [ids[i : i + TEXT_CHUNK] for i in range(0, len(ids), TEXT_CHUNK)]
    nats = 0.0
    for b in range(0, len(pieces), 64):
        x, y = shifted_batch(pieces[b : b + 64], bos, pad)
        logits = model(x.to(device))  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).double(),
            y.to(device).reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        nats += float(loss)
    return nats / math.log(2) / num_bytes


def _split_bits_per_byte(model, store, bounds, bos: int, pad: int, device) -> float:
    import torch

    from app.batching.buckets import BucketSchedule, collate
    from app.model.loss import token_loss

    sched = BucketSchedule(
        store, bounds, micro_batch=32, grad_accum=1, data_parallel=1, seed=0, shuffle=False
    )
    plan = sched.epoch(0)
    nats, nbytes = 0.0, 0
    one = torch.ones(1, device=device)
    for k in range(sched.steps_per_epoch):
        for mb in plan[k]:
            if not len(mb.indices):
                continue
            x, y = collate(store, mb, bos, pad)
            nats += float(token_loss(model(x.to(device)), (y.to(device), one)))
            nbytes += mb.num_bytes
    return nats / math.log(2) / max(1, nbytes)


def run_job(job: dict, pack_dir: str, device: str, threads: int) -> dict:
    import numpy as np
    import torch

    from app.batching.buckets import BucketSchedule, TokenStore, collate
    from app.model.lm import LanguageModel
    from app.model.loss import token_loss
    from app.training.schedule import lr_multiplier

    torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as on the CPU
    torch.backends.cudnn.allow_tf32 = False
    j = {**DEFAULTS, **job}
    src = Path(pack_dir) / j["data"]
    meta = json.loads((src / "meta.json").read_text())
    tok = meta["tokenizer"]
    bos, pad = tok["bos_id"], tok["pad_id"]
    train = TokenStore(_Split(src / "train.arrow"))
    val = TokenStore(_Split(src / "validation.arrow"))
    cfg = _model_config(j["model"], tok["vocab_size"], device)
    torch.manual_seed(j["seed"])
    model = LanguageModel(cfg, base_seed=j["seed"]).to(device)
    sched = BucketSchedule(
        train, meta["buckets"], micro_batch=j["micro_batch"], grad_accum=j["grad_accum"], data_parallel=1,
        seed=j["seed"], tokens_per_micro_batch=j["tokens_per_micro_batch"],
    )  # fmt: skip
    opt = torch.optim.AdamW(
        model.parameters(), lr=j["lr"], betas=tuple(j["betas"]), eps=1e-8, weight_decay=0.0
    )

    def lr_at(s: int) -> float:
        return lr_multiplier(
            s, warmup=j["warmup"], total=j["steps"], decay=j["decay"], min_ratio=j["min_ratio"]
        )

    t0 = time.perf_counter()
    tokens_seen, losses, plan, plan_epoch = 0, [], None, -1
    model.train()
    for step in range(j["steps"]):
        epoch, k = divmod(step, sched.steps_per_epoch)
        if epoch != plan_epoch:
            plan, plan_epoch = sched.epoch(epoch), epoch
        mbs = plan[k]
        tokens = sum(mb.tokens for mb in mbs)
        for g in opt.param_groups:
            g["lr"] = j["lr"] * lr_at(step)
        scale = torch.tensor([1.0 / max(1, tokens)], device=device)
        total = 0.0
        for mb in mbs:
            x, y = collate(train, mb, bos, pad)
            loss = token_loss(model(x.to(device)), (y.to(device), scale))
            loss.backward()
            total += float(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens_seen += tokens
        losses.append(total)
    train_s = time.perf_counter() - t0
    model.eval()
    held = json.loads((src / "heldout.json").read_text())
    ids = np.load(src / "heldout_ids.npy")
    with torch.no_grad():
        heldout = _heldout_bits_per_byte(model, ids, held["bytes"], bos, pad, device)
        val_bpb = _split_bits_per_byte(model, val, meta["buckets"], bos, pad, device) if j["val"] else None
    tail = losses[-10:]
    return {
        **job,
        "heldout_bpb": round(heldout, 4),
        "val_bpb": None if val_bpb is None else round(val_bpb, 4),
        "train_loss_last10": round(sum(tail) / len(tail), 4),
        "tokens_seen": tokens_seen,
        "epochs": round(tokens_seen / max(1, int(train.lengths.sum())), 2),
        "params": sum(p.numel() for p in model.parameters()),
        "seconds": round(train_s, 1),
    }


def costs(configs: list[dict], rounds: int) -> list[dict]:
    import torch

    from app.model.config import flops_per_token
    from app.parallel.partition import measure_layer_costs

    torch.set_num_threads(1)
    best: dict[str, list[float]] = {}
    for _ in range(rounds):
        for c in configs:
            cfg = _model_config(c.get("model", "small"), c["vocab"], "cpu")
            layer = measure_layer_costs(
                cfg, c.get("micro_batch", 8), c.get("seq_len", 128), torch.device("cpu")
            )
            prev = best.get(c["name"])
            best[c["name"]] = layer if prev is None else [min(a, b) for a, b in zip(prev, layer, strict=True)]
    out = []
    for c in configs:
        layer = best[c["name"]]
        one = sum(layer)
        two = min(max(sum(layer[:k]), sum(layer[k:])) for k in range(1, len(layer)))  # best contiguous split
        tokens = c.get("micro_batch", 8) * c.get("seq_len", 128)
        cfg = _model_config(c.get("model", "small"), c["vocab"], "cpu")
        out.append(
            {
                **c,
                "layer_s": [round(x, 5) for x in layer],
                "tokens_per_s_p1": round(tokens / one, 1),
                "tokens_per_s_p2": round(tokens / two, 1),
                "flops_per_token": flops_per_token(cfg),
            }
        )
    return out


def _worker(args) -> dict:
    job, pack_dir, device, threads = args
    try:
        return run_job(job, pack_dir, device, threads)
    except Exception as e:  # one failed config must not lose the others' results
        return {**job, "error": f"{type(e).__name__}: {e}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="write prepared data + held-out ids for `run`")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("specs", nargs="+", metavar="NAME=PREPARED_DIR:HELDOUT_TXT")
    r = sub.add_parser("run", help="train and score each job")
    r.add_argument("--pack", type=Path, required=True)
    r.add_argument("--jobs", type=Path, required=True, help="JSON list of jobs")
    r.add_argument("--device", default="cpu")
    r.add_argument("--parallel", type=int, default=1, help="jobs at a time (processes)")
    r.add_argument("--threads", type=int, default=1, help="torch threads per job")
    c = sub.add_parser("cost", help="relative tokens/s of configs from timed layers (no training)")
    c.add_argument("--configs", type=Path, required=True, help="JSON list of configs")
    c.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.cmd == "pack":
        pack(args.out, args.specs)
        return
    if args.cmd == "cost":
        res = costs(json.loads(args.configs.read_text()), args.rounds)
        for row in res:
            print(json.dumps(row))
        print(json.dumps(res))
        return
    jobs = json.loads(args.jobs.read_text())
    work = [(job, str(args.pack), args.device, args.threads) for job in jobs]
    results = []
    with mp.get_context("spawn").Pool(args.parallel) as pool:
        for res in pool.imap_unordered(_worker, work):
            print(json.dumps(res), flush=True)
            results.append(res)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
