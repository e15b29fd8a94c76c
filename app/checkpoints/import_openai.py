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

from pathlib import Path

import numpy as np
import torch

from app.checkpoints.importing import Imported, ImportedLayer, check_tensor
from app.common.errors import UserError

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


def _load(folder: Path, i: int) -> torch.Tensor:
    p = folder / f"{i}.npy"
    where = f"{p}: tensor {TENSORS[i]}"
    if not p.is_file():
        raise UserError(f"{where}: missing; OpenAI's release has 0.npy ... {NUM_FILES - 1}.npy")
    try:
        a = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise UserError(
            f"{where}: unreadable .npy file ({str(e).splitlines()[0] if str(e) else e})"
        ) from None
    if a.dtype.kind != "f":
        raise UserError(f"{where} holds {a.dtype} values, expected floating point")
    return torch.from_numpy(np.ascontiguousarray(a))  # (a fresh array: np.load read the file)


def read_openai(path: Path) -> Imported:
    """The 15 files of `path` (or `path`/model), each checked for its shape, as `Imported`."""
    folder = model_folder(path)
    t = [_load(folder, i) for i in range(NUM_FILES)]
    emb, wx = t[0], t[1]
    if emb.dim() != 2 or emb.shape[0] != 256:
        raise UserError(
            f"{folder / '0.npy'}: tensor {TENSORS[0]} has shape {tuple(emb.shape)}, expected (256, E): "
            "one row per byte"
        )
    E = int(emb.shape[1])
    if wx.dim() != 2 or wx.shape[0] != E or wx.shape[1] % 4 or wx.shape[1] == 0:
        raise UserError(
            f"{folder / '1.npy'}: tensor {TENSORS[1]} has shape {tuple(wx.shape)}, expected ({E}, 4H) "
            f"(E = {E} from 0.npy)"
        )
    H = int(wx.shape[1]) // 4
    want = [(256, E), (E, 4 * H), *[(H, H)] * 4, (E, H), (H, H), (4 * H,), (4 * H,), (4 * H,), (H,), (H,)]
    want += [(H, 256), (256,)]
    for i, (tensor, shape) in enumerate(zip(t, want, strict=True)):
        check_tensor(tensor, shape, f"{folder / f'{i}.npy'}: tensor {TENSORS[i]}")
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
