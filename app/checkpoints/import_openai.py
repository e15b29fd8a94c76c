"""OpenAI's byte mLSTM (Radford et al. 2017, generating-reviews-discovering-sentiment) -> `Imported`.

Its release is 15 NumPy files, model/0.npy ... 14.npy, read by `encoder.py` in the order its TensorFlow
variables are created, after joining 2..5 on axis 1 into `wh`:

    0  embedding/w  (256, E)        6  rnn/wmx (E, H)      9  rnn/gx  (4H,)    13 out/w (H, 256)
    1  rnn/wx       (E, 4H)         7  rnn/wmh (H, H)     10  rnn/gh  (4H,)    14 out/b (256,)
    2-5 rnn/wh      (H, H) each     8  rnn/b   (4H,)      11  rnn/gmx (H,)
                    (gates i, f, o, u)                    12  rnn/gmh (H,)

The released model: E = 64, H = 4096, one layer. Matrices are stored (in, out) and weight-normed per
output unit (tf.nn.l2_normalize over axis 0, times the gain): ours are (out, in), the same per-row norm, so
every matrix is transposed and keeps its gain; [wmx; wx] become our weight_in with gains [gmx; gx]. The
gate order is ours (i, f, o, u). The head is untied, with a bias; the ids are the raw bytes (offset 0).
Files are read with allow_pickle=False (nothing in them runs).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from app.checkpoints.importing import Imported, ImportedLayer, check_tensor
from app.common.errors import UserError
from app.common.resources import check_fits, fmt_bytes

NUM_FILES = 15
TENSORS = (
    "embedding/w", "rnn/wx", "rnn/wh (gate i)", "rnn/wh (gate f)", "rnn/wh (gate o)", "rnn/wh (gate u)",
    "rnn/wmx", "rnn/wmh", "rnn/b", "rnn/gx", "rnn/gh", "rnn/gmx", "rnn/gmh", "out/w", "out/b",
)  # fmt: skip


def model_folder(path: Path) -> Path:
    """The folder holding 0.npy ... 14.npy: PATH itself, or PATH/model (a checkout of OpenAI's repository)."""
    if not path.is_dir():
        raise UserError(f"--from openai {path}: not a folder (the folder holding model/0.npy ... 14.npy)")
    return path if (path / "0.npy").exists() or not (path / "model").is_dir() else path / "model"


def _where(folder: Path, i: int) -> str:
    return f"{folder / f'{i}.npy'}: tensor {TENSORS[i]}"


def _header(folder: Path, i: int) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of `i`.npy from its header alone, checked against the bytes the file holds: nothing
    is allocated from a header's word (a header claiming (2^20, 2^20) float32 in a small file is refused)."""
    p, where = folder / f"{i}.npy", _where(folder, i)
    if not p.is_file():
        raise UserError(f"{where}: missing; OpenAI's release has 0.npy ... {NUM_FILES - 1}.npy")
    try:
        with open(p, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read(f)
            have = p.stat().st_size - f.tell()
    except (OSError, ValueError, EOFError, TypeError, SyntaxError) as e:
        raise UserError(
            f"{where}: unreadable .npy file ({str(e).splitlines()[0] if str(e) else e})"
        ) from None
    if dtype.kind != "f":
        raise UserError(f"{where} holds {dtype} values, expected floating point")
    need = math.prod(shape) * dtype.itemsize
    if need != have:
        raise UserError(
            f"{where}: its header says shape {shape} {dtype} ({fmt_bytes(need)}), but the file holds "
            f"{fmt_bytes(have)} of data: a damaged or altered file"
        )
    return tuple(int(n) for n in shape), dtype


def _load(folder: Path, i: int) -> torch.Tensor:
    p = folder / f"{i}.npy"
    try:
        a = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise UserError(
            f"{_where(folder, i)}: unreadable .npy file ({str(e).splitlines()[0] if str(e) else e})"
        ) from None
    return torch.from_numpy(np.ascontiguousarray(a))  # (a fresh array: np.load read the file)


def _layout(folder: Path, shapes: list[tuple[int, ...]]) -> tuple[int, int]:
    """(E, H) from 0.npy and 1.npy's headers, every file's shape checked against them -> before any read."""
    emb, wx = shapes[0], shapes[1]
    if len(emb) != 2 or emb[0] != 256:
        raise UserError(f"{_where(folder, 0)} has shape {emb}, expected (256, E): one row per byte")
    E = emb[1]
    if len(wx) != 2 or wx[0] != E or wx[1] % 4 or wx[1] == 0:
        raise UserError(f"{_where(folder, 1)} has shape {wx}, expected ({E}, 4H) (E = {E} from 0.npy)")
    H = wx[1] // 4
    want = [(256, E), (E, 4 * H), *[(H, H)] * 4, (E, H), (H, H), (4 * H,), (4 * H,), (4 * H,), (H,), (H,)]
    want += [(H, 256), (256,)]
    for i, (shape, w) in enumerate(zip(shapes, want, strict=True)):
        if shape != w:
            raise UserError(f"{_where(folder, i)} has shape {shape}, expected {w} (E = {E}, H = {H})")
    return E, H


def read_openai(path: Path) -> Imported:
    """The 15 files of `path` (or `path`/model): their headers checked against the layout and the memory the
    import takes, then read and each checked for its values, as `Imported`."""
    folder = model_folder(path)
    headers = [_header(folder, i) for i in range(NUM_FILES)]
    E, H = _layout(folder, [shape for shape, _ in headers])
    read = sum(math.prod(shape) * dtype.itemsize for shape, dtype in headers)
    floats = sum(math.prod(shape) for shape, _ in headers)
    check_fits(
        f"mlstm-import --from openai {path} (embedding {E}, hidden {H})",
        read + 3 * 4 * floats,  # the files, our float32 layout, its copy into the safetensors file
        "it needs a machine with more memory",
    )
    t = [_load(folder, i) for i in range(NUM_FILES)]
    for i, tensor in enumerate(t):
        check_tensor(tensor, headers[i][0], _where(folder, i))
    emb, wx = t[0], t[1]
    wh = torch.cat(t[2:6], dim=1)  # (H, 4H), as encoder.py joins them
    wmx, wmh, b, gx, gh, gmx, gmh, out_w, out_b = t[6:]
    names = (
        f"{folder}/6.npy and 1.npy: tensors rnn/wmx, rnn/wx",
        f"{folder / '7.npy'}: tensor rnn/wmh",
        f"{folder}/2.npy ... 5.npy: tensor rnn/wh",
    )
    layer = ImportedLayer(
        w_in=torch.cat([wmx.t(), wx.t()]),  # (5H, E)
        w_mh=wmh.t().contiguous(),  # (H, H)
        w_m=wh.t().contiguous(),  # (4H, H)
        bias=b,
        gains=(torch.cat([gmx, gx]), gmh, gh),
        names=names,
    )
    return Imported(
        kind="openai",
        source=path.resolve().name,
        embedding=emb,
        head_weight=out_w.t().contiguous(),  # (256, H)
        head_bias=out_b,
        byte_offset=0,
        pad_row=None,
        layers=[layer],
        notes=[
            f"one mLSTM layer, embedding {E}, hidden {H}, weight-normed (gains gx, gh, gmx, gmh kept as gains)",
            "matrices transposed from (in, out); wh = 2-5.npy joined on axis 1; gate order i, f, o, u (ours)",
        ],
    )
