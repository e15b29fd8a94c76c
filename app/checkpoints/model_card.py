"""The model card (README.md) of an export, written from what the run recorded: model config, training
settings and layout, data summary, evaluation table. Names only, never paths (the card travels).
"""

from __future__ import annotations

from pathlib import PurePath

from app.checkpoints.run_info import RunInfo
from app.model.config import ModelConfig

FRONT_MATTER = """---
library_name: transformers
pipeline_tag: text-generation
tags:
- multiplicative-lstm
- mlstm
- rnn
- mlstm-ds
---
"""


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def _model_section(cfg: ModelConfig, tok: dict, parameters: int) -> str:
    cell = "multiplicative LSTM (mLSTM)" if cfg.cell == "mlstm" else "LSTM (baseline)"
    yes = {True: "yes", False: "no"}
    rows = [
        ["cell", cell],
        ["recurrent layers", str(cfg.num_layers)],
        ["embedding width", str(cfg.embed_dim)],
        ["hidden width (h, c)", str(cfg.hidden_dim)],
        ["vocabulary", f"{cfg.vocab_size} ({tok.get('type')} tokenizer)"],
        ["weight normalisation", yes[cfg.weight_norm]],
        ["tied embeddings", yes[cfg.tie_embeddings]],
        ["residual connections", yes[cfg.residual]],
        ["dropout", str(cfg.dropout)],
        ["parameters", f"{parameters:,}"],
    ]
    return "## Model\n\n" + _table(["", ""], rows)


def _training_section(config: dict | None, step: int | None, layout: dict | None) -> str:
    if not config:
        return "## Training\n\nThe training run's settings were not recorded with this checkpoint."
    train, ds = config.get("train", {}), config.get("deepspeed", {})
    lay = layout or config.get("layout") or {}
    opt = ds.get("optimizer", {})
    params = opt.get("params", {})
    total = config.get("total_steps")
    lines = [f"- steps: {step}" + (f" of {total}" if total else "") + f", seed {train.get('seed')}"]
    if lay:
        dp = lay.get("data_parallel", 0)
        lines.append(
            f"- layout: {lay.get('world_size')} processes = {lay.get('stages')} pipeline stages x {dp} "
            f"data-parallel (ZeRO-{lay.get('zero_stage')}), {lay.get('precision')}"
        )
        per_step = lay.get("micro_batch", 0) * lay.get("grad_accum", 0) * dp
        lines.append(
            f"- batch: {per_step} sequences per step ({lay.get('micro_batch')} per micro-batch x "
            f"{lay.get('grad_accum')} accumulated x {dp} data-parallel)"
        )
    if opt:
        lines.append(
            f"- optimizer: {opt.get('type')}, learning rate {params.get('lr')}, weight decay "
            f"{params.get('weight_decay', 0)}, gradient clipping {ds.get('gradient_clipping', 'none')}"
        )
    # the schedule in force (a budgeted run's, decided after its first steps); else the run's settings
    warmup = _dict(config.get("schedule")).get("warmup_steps", train.get("warmup_steps"))
    lines.append(
        f"- schedule: {warmup} warm-up steps, then {train.get('lr_decay')} decay to "
        f"{train.get('min_lr_ratio')} x the learning rate"
    )
    return (
        "## Training\n\nTrained with mlstm-ds (DeepSpeed pipeline stages x ZeRO data parallelism).\n\n"
        + "\n".join(lines)
    )


def _source_line(meta: dict | None) -> str:
    src = _dict(_dict(meta).get("source"))
    kind = src.get("kind")
    if kind == "default":
        return (
            f"the embedded default corpus: CPython {src.get('python')}'s pydoc_data help topics "
            f"({src.get('topics')}) and standard-library sources ({src.get('files')} files)"
        )
    if kind == "hub":
        extra = ", ".join(str(x) for x in (src.get("config"), src.get("split")) if x)
        return f"the Hugging Face hub dataset `{src.get('name')}`" + (f" ({extra})" if extra else "")
    if kind == "files":
        return f"{src.get('files')} local files"
    return "not recorded"


def _dict(v) -> dict:
    """A JSON object from a checkpoint handed over from elsewhere, or {} where it is something else."""
    return v if isinstance(v, dict) else {}


def _data_section(config: dict | None, meta: dict | None) -> str:
    """The data the checkpoint recorded (any field of another type reads "-": nothing here is trusted)."""
    config, meta = _dict(config), _dict(meta)
    data = _dict(config.get("data"))
    splits = _dict(data.get("splits"))
    if not splits:
        return "## Data\n\nThe data summary was not recorded with this checkpoint."
    name = PurePath(str(data.get("path") or _dict(config.get("train")).get("data") or "?")).name
    lines = [f"Prepared data set `{name}`; text from {_source_line(meta)}."]
    if meta:
        docs = _dict(meta.get("documents"))
        lines.append(
            f"{_num(docs.get('kept'), ',')} documents kept of {_num(docs.get('records'), ',')} read; examples up "
            f"to {_num(meta.get('max_seq_len'), ',')} tokens; {_num(meta.get('bytes_per_token'), '.3f')} bytes "
            "per token (train)."
        )
        long = _dict(docs.get("long_documents_cut"))
        if long.get("documents"):
            lines.append(
                f"{_num(long.get('parts'), ',')} of the documents are parts of {_num(long.get('documents'), ',')} "
                f"longer one(s), cut at line ends every {_num(long.get('part_chars'), ',')} characters."
            )
    rows = [
        [str(k), *(_num(_dict(s).get(f), ",") for f in ("docs", "examples", "tokens", "bytes"))]
        for k, s in splits.items()
    ]
    return (
        "## Data\n\n"
        + " ".join(lines)
        + "\n\n"
        + _table(["split", "documents", "examples", "tokens", "bytes"], rows)
    )


def _num(v, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, int | float) else "-"


def _row(name: str, d: dict, prefix: str, bpb: str) -> list[str]:
    """One evaluation row: tokens, loss, perplexity, bits/byte, then what gzip/xz reach on the same bytes."""
    cells = [_num(d.get(f"{prefix}tokens"), ","), _num(d.get(f"{prefix}loss"), ".4f")]
    cells += [_num(d.get(f"{prefix}ppl"), ".2f"), _num(d.get(f"{prefix}{bpb}"), ".4f")]
    return [name, *cells, _num(d.get("gzip -9"), ".4f"), _num(d.get("xz -9"), ".4f")]


def _eval_section(info: RunInfo) -> str:
    final, ev = info.final_metrics or {}, info.evaluation or {}
    rows = [
        _row(f"{name} split (end of training)", final, f"{split}/", "bpb")
        for split, name in (("val", "validation"), ("test", "test"))
        if f"{split}/loss" in final
    ]
    if (split := ev.get("split")) and f"{split}/loss" in ev:
        rows.append(_row(f"{split} split (app/evaluate.py)", ev, f"{split}/", "bpb"))
    for t in ev.get("texts") or []:
        rows.append(_row(f"`{PurePath(str(t.get('file', '?'))).name}`", t, "", "bits/byte"))
    if not rows:
        return (
            "## Evaluation\n\nNo evaluation was recorded for this checkpoint (run `app/evaluate.py` on it)."
        )
    head = ["", "tokens", "loss (nats/token)", "perplexity", "bits/byte", "gzip -9", "xz -9"]
    return (
        "## Evaluation\n\nExact over every real token of each split or file (the compressors: bits per byte "
        "of the same file, for scale).\n\n" + _table(head, rows)
    )


def _usage_section(folder: str) -> str:
    return f"""## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{folder}", trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained("{folder}", trust_remote_code=True)
inputs = tokenizer("The ", return_tensors="pt")  # bos + the prompt
out = model.generate(**inputs, max_new_tokens=100, do_sample=True, top_p=0.9)
print(tokenizer.decode(out[0], skip_special_tokens=True))
```

`generate` carries the recurrent state (h, c of every layer) as its cache: the prompt is read once and
each new token costs one recurrent step. With mlstm-ds itself (no transformers needed):

```bash
python app/generate.py --checkpoint {folder} --prompt "The " --max-new-tokens 100 --top-p 0.9
python app/evaluate.py --checkpoint {folder} --text some_file.txt
```
"""


def model_card(
    model_cfg: ModelConfig,
    tok_meta: dict,
    parameters: int,
    step: int | None,
    layout: dict | None,
    info: RunInfo,
    folder: str,
) -> str:
    title = info.run_name or folder
    intro = (
        f"# {title}\n\nA recurrent language model: a **multiplicative LSTM (Krause et al. 2016)**, "
        "[Multiplicative LSTM for sequence modelling](https://arxiv.org/abs/1609.07959), the architecture of "
        "OpenAI's byte-level review model and NVIDIA's sentiment-discovery. It is *not* xLSTM's matrix-memory "
        "mLSTM (Beck et al. 2024): its state is a vector pair (h, c) per layer, updated through a "
        "multiplicative intermediate state m_t = (W_mx x_t) * (W_mh h_{t-1})."
    )
    parts = [
        FRONT_MATTER + intro,
        _model_section(model_cfg, tok_meta, parameters),
        _training_section(info.config, step, layout),
        _data_section(info.config, info.data_meta),
        _eval_section(info),
        _usage_section(folder),
    ]
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"
