"""NVIDIA sentiment-discovery's mLSTM language model (its `RNNModel` state dict, e.g. mlstm.pt) -> `Imported`.

The file is read with `torch.load(weights_only=True)`: tensors and plain containers only, nothing in it
runs (a classifier checkpoint holding its argparse `args` is refused in one line). Its layout:

    {"encoder": {"encoder": {"weight": (V, E)},                     nn.Embedding
                 "rnn": {"rnns.{l}.w_ih" (4H, in), "rnns.{l}.w_hh" (4H, H),
                         "rnns.{l}.w_mih" (H, in), "rnns.{l}.w_mhh" (H, H),
                         "rnns.{l}.b_ih" (4H,), "rnns.{l}.b_hh" (4H,)}},
     "decoder": {"weight": (V, H), "bias": (V,)}}                    nn.Linear

(also flat, "encoder.weight" / "rnn.rnns.0.w_ih" / "decoder.weight", or wrapped in "sd" / "lm_encoder").
Weight-normed files hold `<name>_g` (rows, 1) and `<name>_v` (rows, in) instead of a matrix (apex's
reparameterization, dim 0: w = g * v / ||v|| per output row, as ours).

The cell (model/RNN_utils/RNN/cells.py, mLSTMCell):
    m = (w_mih x) * (w_mhh h);  gates = w_ih x + b_ih + w_hh m + b_hh;  i, f, g, o = gates.chunk(4)
    c' = sigmoid(f) c + sigmoid(i) tanh(g);  h' = sigmoid(o) tanh(c')
Its gate order i, f, g, o is blocks [0, 1, 3, 2] of ours (i, f, o, u): every 4H row block (w_ih, w_hh,
their gains and the biases) is reordered, and b_ih + b_hh become our one bias. Without the reordering the
output gate reads the cell input and the model diverges from the first step.

Byte ids: 257 rows = pad 0 and byte b at b + 1 (its CharacterLevelTokenizer: ord + 1 over UTF-8 bytes);
256 rows = the raw bytes (its releases before the tokenizer). A tied decoder (weight = the embedding) has
its own bias: it is loaded as an untied head, with that bias.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import torch

from app.checkpoints.importing import Imported, ImportedLayer, check_tensor
from app.checkpoints.safety import load_weights_only
from app.common.errors import UserError
from app.common.resources import check_fits

GATE_ORDER = (0, 1, 3, 2)  # our block k (i, f, o, u) is their block GATE_ORDER[k] (i, f, g, o)
MATRICES = ("w_ih", "w_hh", "w_mih", "w_mhh")


def reorder_gates(t: torch.Tensor, order: tuple[int, ...] = GATE_ORDER) -> torch.Tensor:
    """(4H, ...) in their gate order -> ours."""
    blocks = t.chunk(4, dim=0)
    return torch.cat([blocks[k] for k in order])


def flat_tensors(obj: object, path: Path) -> dict[str, torch.Tensor]:
    """The file's nested dicts as {"encoder.weight", "rnn.rnns.0.w_ih", "decoder.bias", ...}."""
    if not isinstance(obj, dict):
        raise UserError(f"{path}: holds a {type(obj).__name__}, expected an RNNModel state dict (a dict)")
    for wrapper in ("sd", "lm_encoder"):  # a classifier's or a featurizer's file around the LM's
        if isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
    out: dict[str, torch.Tensor] = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            elif isinstance(v, torch.Tensor):
                out[f"{prefix}{k}"] = v

    walk(obj, "")
    for nested in ("encoder.encoder.", "encoder.rnn."):  # RNNModel.state_dict nests encoder and rnn
        out = {(k[len("encoder.") :] if k.startswith(nested) else k): v for k, v in out.items()}
    return out


def _matrix(
    tensors: dict, path: Path, key: str, shape: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight or v, g or None) of `key`, plain or weight-normed, checked against `shape`."""
    where = f"{path}: tensor {key}"
    if key in tensors:
        return check_tensor(tensors[key], shape, where), None
    if f"{key}_v" not in tensors or f"{key}_g" not in tensors:
        raise UserError(f"{where}: missing (neither {key} nor {key}_g and {key}_v); not an mLSTM RNNModel?")
    v = check_tensor(tensors[f"{key}_v"], shape, f"{where}_v")
    g = tensors[f"{key}_g"]
    if g.dim() == 2:
        check_tensor(g, (shape[0], 1), f"{where}_g")
    g = check_tensor(g.reshape(-1) if g.dim() == 2 else g, (shape[0],), f"{where}_g")
    return v, g


def _bias(tensors: dict, path: Path, prefix: str, H: int) -> torch.Tensor:
    """b_ih + b_hh (either may be absent: an RNN built with bias=False has neither), in float64."""
    total = torch.zeros(4 * H, dtype=torch.float64)
    for name in ("b_ih", "b_hh"):
        if f"{prefix}{name}" in tensors:
            total += check_tensor(
                tensors[f"{prefix}{name}"], (4 * H,), f"{path}: tensor {prefix}{name}"
            ).double()
    return total


def read_layer(tensors: dict, path: Path, layer: int, in_dim: int, H: int, order=GATE_ORDER) -> ImportedLayer:
    p = f"rnn.rnns.{layer}."
    if f"{p}w_ho" in tensors:
        raise UserError(
            f"{path}: tensor {p}w_ho: a recurrent output projection, which mlstm-ds has no place for"
        )
    (w_ih, g_ih), (w_hh, g_hh) = (
        _matrix(tensors, path, p + "w_ih", (4 * H, in_dim)),
        _matrix(tensors, path, p + "w_hh", (4 * H, H)),
    )
    (w_mih, g_mih), (w_mhh, g_mhh) = (
        _matrix(tensors, path, p + "w_mih", (H, in_dim)),
        _matrix(tensors, path, p + "w_mhh", (H, H)),
    )
    gains = (g_ih, g_hh, g_mih, g_mhh)
    if any(g is None for g in gains) != all(g is None for g in gains):
        raise UserError(f"{path}: layer {layer} mixes weight-normed (_g/_v) and plain matrices")
    names = tuple(f"{path}: tensor {p}{n}" for n in ("w_mih, w_ih", "w_mhh", "w_hh"))
    return ImportedLayer(
        w_in=torch.cat([w_mih, reorder_gates(w_ih, order)]),  # (5H, in)
        w_mh=w_mhh,
        w_m=reorder_gates(w_hh, order),
        bias=reorder_gates(_bias(tensors, path, p, H), order),
        gains=None
        if g_ih is None
        else (torch.cat([g_mih, reorder_gates(g_ih, order)]), g_mhh, reorder_gates(g_hh, order)),
        names=names,
    )


def _layer_count(tensors: dict) -> int:
    n = 0
    while any(k.startswith(f"rnn.rnns.{n}.") for k in tensors):
        n += 1
    return n


def _required(tensors: dict, path: Path, key: str, what: str) -> torch.Tensor:
    if key not in tensors:
        some = ", ".join(sorted(tensors)[:6]) or "none"
        raise UserError(
            f"{path}: tensor {key} ({what}): missing; not an mLSTM RNNModel state dict (tensors: {some})"
        )
    return tensors[key]


def read_sentiment_discovery(path: Path, order: tuple[int, ...] = GATE_ORDER) -> Imported:
    """The state dict in `path` (weights only), each tensor checked for its shape, as `Imported`; `order`:
    the gate reordering (GATE_ORDER; the tests pass the identity to show it matters)."""
    if not path.is_file():
        raise UserError(
            f"--from sentiment-discovery {path}: no such file (a state dict saved with torch.save)"
        )
    obj = load_weights_only(
        path, [], "it holds more than tensors and plain containers",
        "mlstm-import reads a language model's state dict (torch.save(model.state_dict()))",
        mmap=zipfile.is_zipfile(path),  # torch's zip format: the tensors map the file, nothing is allocated
    )  # fmt: skip
    tensors = flat_tensors(obj, path)
    floats = sum(t.numel() for t in tensors.values())
    check_fits(f"mlstm-import --from sentiment-discovery {path}", 3 * 4 * floats, "it needs more memory")
    emb = _required(tensors, path, "encoder.weight", "the byte embedding")
    if emb.dim() != 2 or emb.shape[0] not in (256, 257):
        raise UserError(
            f"{path}: tensor encoder.weight has shape {tuple(emb.shape)}, expected (257, E) (pad + 256 bytes) "
            "or (256, E) (bytes)"
        )
    V, E = (int(s) for s in emb.shape)
    check_tensor(emb, (V, E), f"{path}: tensor encoder.weight")
    num_layers = _layer_count(tensors)
    first = tensors.get("rnn.rnns.0.w_mhh", tensors.get("rnn.rnns.0.w_mhh_v"))
    if first is None or first.dim() != 2:
        _required(tensors, path, "rnn.rnns.0.w_mhh", "layer 0's recurrent multiplicative matrix")
        raise UserError(f"{path}: tensor rnn.rnns.0.w_mhh has shape {tuple(first.shape)}, expected (H, H)")
    H = int(first.shape[0])
    layers = [read_layer(tensors, path, i, E if i == 0 else H, H, order) for i in range(num_layers)]
    dec_w = check_tensor(
        _required(tensors, path, "decoder.weight", "the LM's output layer"),
        (V, H),
        f"{path}: tensor decoder.weight",
    )
    dec_b = check_tensor(
        _required(tensors, path, "decoder.bias", "the LM's output bias"), (V,), f"{path}: tensor decoder.bias"
    )
    _refuse_leftovers(tensors, path, num_layers)
    tied = E == H and torch.equal(dec_w, emb)
    notes = [
        f"{num_layers} mLSTM layer(s), embedding {E}, hidden {H}, "
        + (
            "weight-normed (_g/_v kept as gains and directions)"
            if layers[0].gains is not None
            else "plain weights"
        ),
        "gate order i, f, g, o reordered to ours (blocks 0, 1, 3, 2); b_ih + b_hh summed into one bias",
        f"{V} ids: " + ("pad 0, byte b at b + 1 (ord + 1)" if V == 257 else "the raw bytes"),
    ]
    if tied:
        notes.append("tied decoder (weight = the embedding): loaded as an untied head with its own bias")
    return Imported(
        kind="sentiment-discovery",
        source=path.name,
        embedding=emb,
        head_weight=dec_w,
        head_bias=dec_b,
        byte_offset=V - 256,
        pad_row=0 if V == 257 else None,
        layers=layers,
        notes=notes,
    )


def _refuse_leftovers(tensors: dict, path: Path, num_layers: int) -> None:
    """Every tensor of the file has a place: one that would be dropped is named (never a silent skip)."""
    names = {f"{n}{s}" for n in MATRICES for s in ("", "_g", "_v")} | {"b_ih", "b_hh"}
    known = {"encoder.weight", "decoder.weight", "decoder.bias"}
    known |= {f"rnn.rnns.{i}.{n}" for i in range(num_layers) for n in names}
    extra = sorted(set(tensors) - known)
    if extra:
        raise UserError(
            f"{path}: tensor {extra[0]}{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''} has no place "
            "in an mLSTM language model (embedding, rnn.rnns.<l>.*, decoder)"
        )
