"""Every memory estimate that admits or refuses work, against the memory the work really takes.

    .venv/bin/python bench/memory.py [--only featurize,generate] [--quick] [--core python] [--device cuda]

Each work (training, featurizing, fine-tuning, generation, the evaluation engine and its stream, cache and
dynamic readers, a data prep block) runs in a child process of its own at a few sizes: the child builds the
model and the inputs, runs the work once at a tiny size (kernels chosen, libraries loaded), then resets its
peak RSS (`/proc/self/clear_refs`), returns freed heap pages to the OS (`malloc_trim`) and runs the work at
the size measured. The growth is the peak RSS then less the RSS before: what the work added to a process
that already held its model. The estimate is the figure the app compares with the free memory before it
starts the same work (its own functions, called with the same sizes). Targets: estimate >= measured (a run
that fits is admitted, one that does not is refused before it starts) and <= 2x measured (nothing that fits
is refused for a figure far off). The table is printed, then a JSON line with every row.

The sizes make growths of 40-800 MB, so that the allocator's noise (a few MB: glibc's arenas, torch's
small-object caches, Python's free lists) is a few percent of what is measured. The children call
`steady_heap` as app/transfer.py, generate.py and evaluate.py do (the trainer's step does not). `tests/`
measures the small end of each estimate (tests/measured.py; a few seconds each).

`--device cuda` runs the works the app runs on a GPU (featurizing, fine-tuning, generation, the evaluation
engine, a training step; the readers and data prep run on the host) with the model there, and measures the
growth of what torch's CUDA allocator hands out (`max_memory_allocated` less the allocation before; its
reserved pool's growth is printed beside it). The estimates are then the app's for that device. Each work
then runs a second time in its child: `left_allocated` is what the first run left allocated (the Triton
core's tuning, arenas and graphs at those shapes), `again` the second run's growth (the work's own).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

Work = Callable[[dict], tuple[int, Callable[[], object], Callable[[], object]]]
MIB = 1 << 20
# a row's fields that are not the work's sizes (a table lists the rest as "sizes"; bench/gpu_tables.py too)
NOT_SIZES = frozenset(
    {"work", "estimate", "measured", "ratio", "seconds", "device", "reserved", "left_allocated", "again",
     "tuner", "core"}
)  # fmt: skip


# ---- measuring one work in this process (the child's side)


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _settle() -> int:
    """Free what can be freed, reset the peak RSS to the current RSS, and return it."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the measure is a little noisier
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)
    return _status("VmRSS")


def _cuda_settle() -> tuple[int, int]:
    """Synchronise, free the allocator's cache, reset its peaks -> (bytes allocated, bytes reserved)."""
    import torch

    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def run_child(spec: dict) -> dict:
    """In the child: the work `spec["work"]` at `spec`'s sizes -> {estimate, measured, seconds} (on a CUDA
    `spec["device"]`, also the growth of the allocator's reserved pool)."""
    import torch

    from app.common.resources import steady_heap

    if spec["work"] != "train":  # as app/transfer.py, generate.py and evaluate.py do; the trainer keeps
        steady_heap()  # glibc's default (a step's tensors reused from its heap, not faulted in anew)
    torch.manual_seed(0)
    torch.set_num_threads(int(spec.get("threads", 1)))
    cuda = _device(spec) != "cpu"
    if cuda:
        from app.common.logs import setup_logging

        setup_logging()  # the GPU core's choice per shape on stderr: its tuner's buffers are in the growth
    estimate, warm, work = WORKS[spec["work"]](spec)
    warm()
    base, reserved = _cuda_settle() if cuda else (_settle(), 0)
    t0 = time.perf_counter()
    work()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if not cuda:
        return {"estimate": int(estimate), "measured": _status("VmHWM") - base, "seconds": round(seconds, 2)}
    got = {
        "estimate": int(estimate),
        "measured": torch.cuda.max_memory_allocated() - base,
        "reserved": torch.cuda.max_memory_reserved() - reserved,
        "seconds": round(seconds, 2),
    }
    # the same work again: what the first run left allocated (the GPU core's tuning, arenas and graphs at
    # these shapes) is then in the base, so the second growth is the work's own
    again, _ = _cuda_settle()
    work()
    torch.cuda.synchronize()
    return {**got, "left_allocated": again - base, "again": torch.cuda.max_memory_allocated() - again}


def measure(spec: dict, timeout: float = 600) -> dict:
    """The work of `spec` measured in a child process of its own -> spec + {estimate, measured, ratio}."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if _device(spec) == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{spec}: the child failed ({p.returncode}):\n{p.stderr[-4000:]}")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    tuner = [ln.split(" INFO ", 1)[-1] for ln in p.stderr.splitlines() if "mLSTM core on cuda" in ln]
    if tuner:  # the loops the GPU core timed at each new shape: each one's time, or why it was left out
        got["tuner"] = tuner
    return {**spec, **got, "ratio": round(got["estimate"] / max(1, got["measured"]), 3)}


def _device(spec: dict) -> str:
    return spec.get("device", "cpu")


# ---- the works: each returns (the app's estimate, a warm-up at a tiny size, the work itself)


def _model(spec: dict):
    from app.model.config import ModelConfig
    from app.model.lm import LanguageModel

    cfg = ModelConfig(
        vocab_size=spec.get("vocab", 256),
        embed_dim=spec.get("embed", 64),
        hidden_dim=spec.get("hidden", 256),
        num_layers=spec.get("layers", 1),
        core=spec.get("core", "auto"),
    )
    return LanguageModel(cfg).to(_device(spec)).eval()


def _texts(n: int, length: int | list[int], vocab: int, seed: int = 0) -> list:
    """`n` random texts of `length` tokens, or of lengths spread evenly over [lo, hi] when it is a pair."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = [length] * n if isinstance(length, int) else np.linspace(*length, n).astype(int).tolist()
    return [rng.integers(3, vocab, int(t)).astype(np.int64) for t in lengths]


def featurize(spec: dict):
    """Transfer's features of `rows` texts of `length` tokens (app.probing.features), its layers 0..L-1."""
    from app.probing.bounds import featurize_bytes
    from app.probing.features import featurize_sets

    model, layers = _model(spec), list(range(spec.get("layers", 1)))
    ids = _texts(spec["rows"], spec["length"], model.cfg.vocab_size)
    budget = spec.get("batch_tokens", 4096)
    estimate = featurize_bytes(ids, budget, model.cfg, len(layers), _device(spec))
    small = _texts(2, 50, model.cfg.vocab_size)
    return (
        estimate,
        lambda: featurize_sets(model, small, layers, budget, 0),
        lambda: featurize_sets(model, ids, layers, budget, 0),
    )


def finetune(spec: dict):
    """Transfer's fine-tuning (app.probing.finetune) for one epoch on `rows` texts of `length` tokens."""
    import numpy as np

    from app.probing.bounds import finetune_bytes
    from app.probing.finetune import FineTuneConfig, fine_tune

    model, layers = _model(spec), list(range(spec.get("layers", 1)))
    ids = _texts(spec["rows"], spec["length"], model.cfg.vocab_size)
    cfg = FineTuneConfig(epochs=1, lr=1e-3, rows=spec.get("max_rows", 32), batch_tokens=spec.get("batch_tokens", 4096),
                         max_tokens=0, seed=0, from_scratch=False)  # fmt: skip
    y = np.arange(len(ids)) % 2
    estimate = finetune_bytes(ids, cfg.batch_tokens, cfg.rows, model.cfg, len(layers), _device(spec))
    small = _texts(4, 20, model.cfg.vocab_size)
    tiny = ((small, np.arange(4) % 2),) * 3
    return (
        estimate,
        lambda: fine_tune(model, tiny, layers, 2, cfg, 0),
        lambda: fine_tune(model, ((ids, y), (ids[:2], y[:2]), (ids[:2], y[:2])), layers, 2, cfg, 0),
    )


def generate(spec: dict):
    """app/generate.py's batch: `rows` prompts of `prompt` bytes, `new` tokens each (byte tokenizer)."""
    import io

    from app.generation.config import generation_bytes
    from app.generation.decoder import Decoder
    from app.generation.sampling import SamplingConfig
    from app.generation.stream import generate as gen
    from data_prep.tokenizer import ByteTokenizer

    model = _model({**spec, "vocab": 259})
    dec, tok, sampling = Decoder(model), ByteTokenizer(), SamplingConfig(temperature=1.0)
    prompts = [
        "".join(chr(97 + (i * 7 + j) % 26) for j in range(spec["prompt"])) for i in range(spec["rows"])
    ]
    estimate = generation_bytes(len(prompts), spec["prompt"] + 1, spec["new"], model.cfg, _device(spec))

    def run(ps: list[str], n: int):
        return gen(dec, tok, ps, max_new_tokens=n, sampling=sampling, seed=0, out=io.StringIO())

    return estimate, lambda: run(prompts[:2], 3), lambda: run(prompts, spec["new"])


def _reader_inputs(spec: dict):
    from app.evaluation.config import EvalConfig
    from app.generation.decoder import Decoder

    model = _model(spec)
    seqs = _texts(spec.get("rows", 1), spec["length"], model.cfg.vocab_size)
    return model, Decoder(model), seqs, EvalConfig


def stream(spec: dict):
    """app/evaluate.py's --stream reader: `rows` sequences of `length` tokens, pieces of `chunk`."""
    from app.evaluation.bounds import STREAM_ROWS, stream_bytes
    from app.evaluation.stream import stream_nats

    model, dec, seqs, _ = _reader_inputs(spec)
    chunk, n = spec["chunk"], min(STREAM_ROWS, len(seqs))
    estimate = stream_bytes(model.cfg, n, chunk, spec["length"])
    small = _texts(2, 30, model.cfg.vocab_size)
    return estimate, lambda: stream_nats(dec, small, 1, 0, 16), lambda: stream_nats(dec, seqs, 1, 0, chunk)


def cache(spec: dict):
    """--cache: one sequence of `length` tokens, pieces of `chunk`, a `window` of positions, a grid."""
    from app.evaluation.bounds import cache_bytes
    from app.evaluation.cache import cache_nats

    model, dec, seqs, _ = _reader_inputs(spec)
    lams, thetas = spec.get("lambdas", [0.1, 0.2]), spec.get("thetas", [0.3, 1.0])
    grid = [(lam, th) for lam in lams for th in thetas]
    chunk, window = spec["chunk"], spec["window"]
    estimate = cache_bytes(model.cfg, chunk, min(window, spec["length"]), len(grid), len(thetas))
    small = _texts(1, 40, model.cfg.vocab_size)
    return (
        estimate,
        lambda: cache_nats(dec, small, 1, 16, 20, grid),
        lambda: cache_nats(dec, seqs, 1, chunk, window, grid),
    )


def dynamic(spec: dict):
    """--dynamic: the learner (its copy of the model and state) over `length` tokens in `segment`s."""
    from app.evaluation.bounds import DYNAMIC_COPIES, dynamic_bytes
    from app.evaluation.dynamic import DynamicEvaluator
    from app.model.memory import weight_bytes

    model, _, seqs, _ = _reader_inputs(spec)
    seg = spec["segment"]
    estimate = DYNAMIC_COPIES * weight_bytes(model.cfg) + dynamic_bytes(model.cfg, seg)
    small = _texts(1, 20, model.cfg.vocab_size)

    def run(s: list, segment: int):
        DynamicEvaluator(model, [1e-3], 0.0, segment).evaluate(s)

    return estimate, lambda: run(small, 8), lambda: run(seqs, seg)


def _engine(spec: dict, ds: dict, inference: bool):
    """A one-process DeepSpeed engine over `spec`'s model (gloo, this process as rank 0 of 1)."""
    import torch

    from app.parallel.engine import Engine
    from app.parallel.layout import engine_config, resolve_layout
    from app.parallel.runtime import init_distributed

    init_distributed()
    layout = resolve_layout(ds, 1, 1, training=not inference)
    model_cfg = _model(spec).cfg
    rows, length, vocab = spec["rows"], spec["length"], model_cfg.vocab_size
    batch = (torch.randint(3, vocab, (rows, length)), torch.randint(3, vocab, (rows, length)))

    def build():
        return Engine(model_cfg, layout, engine_config(ds, layout), seed=0, partition_method="parameters",
                      inference=inference)  # fmt: skip

    return model_cfg, layout, batch, build


def train(spec: dict):
    """A training step of one process (P = 1, ZeRO-`zero`, fp32 Adam): the engine's training state and
    a micro-batch of `rows` x `length` tokens; the estimate is the trainer's (app.training.bounds)."""
    from app.training.bounds import process_bytes

    conf = "cpu_zero2.json" if _device(spec) == "cpu" else "gpu_bf16_zero2.json"  # the GPU's: bf16
    ds = json.loads((ROOT / "ds_configs" / conf).read_text())
    ds |= {"train_micro_batch_size_per_gpu": spec["rows"], "gradient_accumulation_steps": 1}
    ds["zero_optimization"]["stage"] = spec.get("zero", 2)
    model_cfg, layout, batch, build = _engine(spec, ds, inference=False)
    tokens = spec["rows"] * spec["length"]
    tiny = {**spec, "hidden": 8, "embed": 8, "vocab": 16, "rows": 1, "length": 4}
    _, _, small, build_small = _engine(tiny, {**ds, "train_micro_batch_size_per_gpu": 1}, inference=False)
    return (
        process_bytes(model_cfg, layout, tokens, _device(spec)),
        lambda: build_small().train_step([small], 4),
        lambda: build().train_step([batch], tokens),
    )


def engine(spec: dict):
    """app/evaluate.py's engine (one process): the weights and a micro-batch of `rows` x `length` tokens
    scored; the estimate is evaluation's (app.evaluation.bounds.engine_part)."""
    import numpy as np

    from app.evaluation.bounds import Inputs, engine_part
    from app.evaluation.config import EvalConfig
    from app.parallel.layout import inference_layout

    _, ds = inference_layout(1, 1, spec["rows"])
    model_cfg, _, batch, build = _engine(spec, ds, inference=True)
    empty = np.zeros(0, np.int64)
    inputs = Inputs(
        [], np.full(spec["rows"], spec["length"]), np.array([spec["rows"]]), [spec["length"]], empty
    )
    cfg = EvalConfig(checkpoint="-", data="-", micro_batch=spec["rows"])
    need, _, _ = engine_part(cfg, model_cfg, inputs, 1, _device(spec))
    tiny = {**spec, "hidden": 8, "embed": 8, "vocab": 16, "rows": 1, "length": 4}
    _, _, small, build_small = _engine(tiny, inference_layout(1, 1, 1)[1], inference=True)
    return need, lambda: build_small().eval_step([small], 1), lambda: build().eval_step([batch], 1)


def prep_block(spec: dict):
    """A data prep worker's call (`data_prep.pool._work`): one --block-mb block of CPython's sources read
    back from the spool, checked, encoded (byte or a 4096-piece SentencePiece) and spilled to its file."""
    import pickle
    import tempfile

    from data_prep import bounds, pool
    from data_prep.encode import Block, EncodeFn

    texts, size = [], 0
    for f in sorted(Path(os.__file__).parent.rglob("*.py")):
        text = f.read_text(errors="replace")
        texts.append(text)
        size += len(text.encode())
        if size >= spec["block_mb"] * 1e6:
            break
    tok = _prep_tokenizer(spec.get("tokenizer", "byte"), texts)
    spool = Path(tempfile.mkdtemp())
    fn = EncodeFn(tok, 256, seed=0, text_field="text", fractions=(0.05, 0.05), moves={}, segments=False)
    pool._WORKER = (fn, spool)

    def run(items: list[str], index: int):
        with open(spool / f"block-{index}", "wb") as f:
            pickle.dump(Block(items, [True] * len(items), [False] * len(items)), f)
        del items
        pool._work(index, str(spool / f"block-{index}"))

    first = Block(texts, [True] * len(texts), [False] * len(texts))
    block_bytes = bounds.block_memory(spec["block_mb"], bounds.tokens_per_byte(tok, first))
    return block_bytes, lambda: run(texts[:3], 0), lambda: run(texts, 1)


def _prep_tokenizer(kind: str, texts: list[str]):
    from data_prep.tokenizer import ByteTokenizer, SentencePieceTokenizer

    if kind == "byte":
        return ByteTokenizer()
    from data_prep.spm_train import train_sentencepiece

    model = train_sentencepiece(texts[:200], vocab_size=4096, model_type="unigram", num_threads=1)
    return SentencePieceTokenizer(model)


WORKS: dict[str, Work] = {
    "train": train,
    "engine": engine,
    "prep_block": prep_block,
    "featurize": featurize,
    "finetune": finetune,
    "generate": generate,
    "stream": stream,
    "cache": cache,
    "dynamic": dynamic,
}

CUDA_WORKS = ("train", "engine", "featurize", "finetune", "generate")  # what the app runs on a GPU

# the sizes the table is made of (tests/ measures the first of each)
SIZES: dict[str, list[dict]] = {
    "train": [
        {"embed": 64, "hidden": 256, "vocab": 4096, "rows": 8, "length": 512},
        {"embed": 64, "hidden": 512, "layers": 2, "vocab": 4096, "rows": 4, "length": 1024, "zero": 1},
        {"embed": 256, "hidden": 1024, "layers": 2, "vocab": 8192, "rows": 1, "length": 64, "zero": 2},
        {"embed": 256, "hidden": 1024, "layers": 2, "vocab": 8192, "rows": 1, "length": 64, "zero": 1},
    ],
    "engine": [
        {"embed": 64, "hidden": 256, "vocab": 4096, "rows": 8, "length": 1024},
        {"embed": 64, "hidden": 512, "layers": 2, "vocab": 256, "rows": 16, "length": 1024},
    ],
    "prep_block": [
        {"block_mb": 8, "tokenizer": "byte"},
        {"block_mb": 32, "tokenizer": "byte"},
        {"block_mb": 32, "tokenizer": "sentencepiece"},
    ],
    "featurize": [
        {"embed": 64, "hidden": 256, "rows": 1, "length": 20000},
        {"embed": 64, "hidden": 256, "rows": 64, "length": 600, "batch_tokens": 8192},
        {"embed": 128, "hidden": 512, "layers": 2, "rows": 1, "length": 40000},
        {"embed": 32, "hidden": 64, "rows": 1, "length": 100000},
    ],
    "finetune": [
        {"embed": 64, "hidden": 256, "rows": 8, "length": 1000, "batch_tokens": 8192},
        {"embed": 64, "hidden": 512, "layers": 2, "rows": 16, "length": 500, "batch_tokens": 8192},
    ],
    "generate": [
        {"embed": 64, "hidden": 256, "rows": 2000, "prompt": 20, "new": 20},
        {"embed": 64, "hidden": 256, "layers": 2, "rows": 200, "prompt": 400, "new": 50},
        {"embed": 32, "hidden": 64, "rows": 20000, "prompt": 10, "new": 20},
    ],
    "stream": [
        {"embed": 64, "hidden": 256, "vocab": 4096, "rows": 8, "length": 4000, "chunk": 1024},
        {"embed": 64, "hidden": 512, "layers": 2, "vocab": 256, "rows": 2, "length": 20000, "chunk": 4096},
    ],
    "cache": [
        {"embed": 64, "hidden": 256, "vocab": 4096, "length": 8000, "chunk": 1024, "window": 4096},
        {"embed": 64, "hidden": 512, "vocab": 256, "length": 20000, "chunk": 4096, "window": 8192},
    ],
    "dynamic": [
        {"embed": 64, "hidden": 256, "vocab": 4096, "length": 3000, "segment": 1024},
        {"embed": 64, "hidden": 512, "layers": 2, "vocab": 256, "length": 5000, "segment": 2048},
    ],
}


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table; on a GPU with the allocator's second run (the work again) beside."""
    cuda = any("again" in r for r in rows)
    head = "| work | sizes | estimate MiB | measured MiB | estimate / measured |"
    head += (
        " again MiB | estimate / again |\n|---|---|---:|---:|---:|---:|---:|"
        if cuda
        else "\n|---|---|---:|---:|---:|"
    )
    lines = []
    for r in rows:
        line = (f"| {r['work']} | {', '.join(f'{k} {v}' for k, v in r.items() if k not in NOT_SIZES)} | "
                f"{r['estimate'] / MIB:,.0f} | {r['measured'] / MIB:,.0f} | {r['ratio']:.2f} |")  # fmt: skip
        if cuda:
            line += f" {r['again'] / MIB:,.0f} | {r['estimate'] / max(1, r['again']):.2f} |"
        lines.append(line)
    return "\n".join([head, *lines])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--only", default="", help="comma-separated works (default: all)")
    ap.add_argument("--quick", action="store_true", help="the first size of each work only")
    ap.add_argument("--core", default="auto", help="model.core of every model (auto: the fused CPU op)")
    ap.add_argument("--save", action="store_true", help="append the JSON line to bench/results/ (results.py)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help=f"cuda: what the app runs on a GPU ({', '.join(CUDA_WORKS)}), there")  # fmt: skip
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    names = [w for w in args.only.split(",") if w] or list(SIZES)
    if args.device == "cuda":
        if not _cuda_seen():
            print("error: --device cuda: torch sees no CUDA device here", file=sys.stderr)
            return 2
        host = [n for n in names if n not in CUDA_WORKS]
        print(f"on cuda, not measured (the app runs them on the host): {', '.join(host) or 'none'}")
        names = [n for n in names if n in CUDA_WORKS]
    rows, failed = [], []
    for name in names:
        for size in SIZES[name][:1] if args.quick else SIZES[name]:
            spec = {"work": name, **size, **({"core": args.core} if args.core != "auto" else {})}
            spec |= {"device": "cuda"} if args.device == "cuda" else {}
            try:
                rows.append(measure(spec))
            except (RuntimeError, subprocess.TimeoutExpired) as e:  # said and counted, the other rows go on
                failed.append({**spec, "error": str(e).strip().splitlines()[-1][:300]})
                print(f"{name}: failed: {failed[-1]['error']}", flush=True)
                continue
            print(_row_line(rows[-1]), flush=True)
    print(table(rows))
    within = bool(rows) and not failed and all(1.0 <= r["ratio"] <= 2.0 for r in rows)
    line = {"bench": "memory", "machine": _machine(args.device), "device": args.device, "rows": rows,
            "failed": failed, "within_1x_2x": within, "core": args.core}  # fmt: skip
    print(json.dumps(line))
    if args.save:
        sys.path.insert(0, str(ROOT / "bench"))
        from results import save

        print("saved to", save(line, "memory", args.device if args.device == "cpu" else line["machine"]))
    return 0


def _row_line(r: dict) -> str:
    pool = (
        f", allocator's pool +{r['reserved'] / MIB:,.0f} MiB; {r['left_allocated'] / MIB:,.0f} MiB left "
        f"allocated after it, the same work again +{r['again'] / MIB:,.0f} MiB"
        if "reserved" in r
        else ""
    )
    return (f"{r['work']}: estimate {r['estimate'] / MIB:,.0f} MiB, measured {r['measured'] / MIB:,.0f} MiB "
            f"({r['ratio']:.2f}x, {r['seconds']} s{pool})")  # fmt: skip


def _cuda_seen() -> bool:
    import torch

    return torch.cuda.is_available()


def _machine(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    raise SystemExit(main())
