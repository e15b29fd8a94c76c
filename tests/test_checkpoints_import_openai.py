"""app/checkpoints/import_openai.py: OpenAI's 15 .npy files (built here at small sizes, in their layout) read
into our model, which then steps exactly as encoder.py's equations do; files that do not fit are refused
in one line naming the file and the tensor.

The reference below is written from encoder.py (generating-reviews-discovering-sentiment): weights (in,
out), tf.nn.l2_normalize over axis 0 times the gains, m = (x wmx) * (h wmh), z = x wx + m wh + b split
i, f, o, u; logits = h out_w + out_b; ids are the raw bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_checkpoints_importing import load_float64, our_steps

from app.checkpoints.import_openai import read_openai
from app.import_weights import main as import_main
from data_prep.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def openai_shapes(E: int, H: int) -> list[tuple[int, ...]]:
    return [(256, E), (E, 4 * H), *[(H, H)] * 4, (E, H), (H, H), (4 * H,), (4 * H,), (4 * H,), (H,), (H,),
            (H, 256), (256,)]  # fmt: skip


def write_openai(folder: Path, E: int, H: int, seed: int = 0, dtype=np.float32) -> list[np.ndarray]:
    """model/0.npy ... 14.npy of random weights at (E, H); -> the arrays as written."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = []
    for i, shape in enumerate(openai_shapes(E, H)):
        scale = 0.5 if len(shape) == 2 else 1.0
        a = (rng.standard_normal(shape) * scale).astype(dtype)
        if i in (9, 10, 11, 12):  # gains: positive, around 1
            a = (1.0 + 0.25 * rng.standard_normal(shape)).astype(dtype)
        np.save(folder / f"{i}.npy", a)
        arrays.append(a)
    return arrays


def l2_normalize(w: np.ndarray) -> np.ndarray:
    """tf.nn.l2_normalize(w, dim=0) (epsilon 1e-12)."""
    return w / np.sqrt(np.maximum((w * w).sum(axis=0, keepdims=True), 1e-12))


def openai_reference(arrays: list[np.ndarray], byte_ids: np.ndarray) -> list[dict]:
    """encoder.py's model in float64 over byte_ids (B, T) from a zero state: per step logits, h, c."""
    p = [a.astype(np.float64) for a in arrays]
    emb, wx, wmx, wmh, b, gx, gh, gmx, gmh, out_w, out_b = p[0], p[1], *p[6:]
    wh = np.concatenate(p[2:6], axis=1)
    wx, wh = l2_normalize(wx) * gx, l2_normalize(wh) * gh
    wmx, wmh = l2_normalize(wmx) * gmx, l2_normalize(wmh) * gmh
    B, H = byte_ids.shape[0], wmh.shape[0]
    h, c = np.zeros((B, H)), np.zeros((B, H))
    out = []
    for t in range(byte_ids.shape[1]):
        x = emb[byte_ids[:, t]]
        m = (x @ wmx) * (h @ wmh)
        z = x @ wx + m @ wh + b
        i, f, o, u = np.split(z, 4, axis=1)
        sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
        c = sig(f) * c + sig(i) * np.tanh(u)
        h = sig(o) * np.tanh(c)
        out.append({"logits": h @ out_w + out_b, "h": h, "c": c})
    return out


def assert_steps_match(ours: list[dict], theirs: list[dict], offset: int = 0, tol: float = 1e-10) -> None:
    """Every step: our byte logits are theirs (ids b + 3 vs b + offset), EOS's is "\\n"'s; h and c equal."""
    assert len(ours) == len(theirs)
    for t, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        logits = a["logits"].numpy()
        np.testing.assert_allclose(
            logits[:, TOK.OFFSET :],
            b["logits"][:, offset : offset + 256],
            rtol=0,
            atol=tol,
            err_msg=f"step {t}",
        )
        np.testing.assert_array_equal(logits[:, TOK.eos_id], logits[:, TOK.OFFSET + 10])
        np.testing.assert_allclose(a["h"][-1].numpy(), b["h"], rtol=0, atol=tol, err_msg=f"h, step {t}")
        np.testing.assert_allclose(a["c"][-1].numpy(), b["c"], rtol=0, atol=tol, err_msg=f"c, step {t}")


def test_every_step_matches_encoder_py_in_float64(tmp_path):
    arrays = write_openai(tmp_path / "repo" / "model", E=8, H=12)
    model = load_float64(read_openai(tmp_path / "repo"))  # a checkout: its model/ folder is read
    byte_ids = np.random.default_rng(1).integers(0, 256, size=(3, 17))
    ours = torch.from_numpy(byte_ids + TOK.OFFSET)
    theirs = openai_reference(arrays, byte_ids)
    assert_steps_match(our_steps(model, ours), theirs)
    with torch.no_grad():  # the sequence path (the training/evaluation forward) too
        full = model(ours).numpy()  # (B, T, V)
    np.testing.assert_allclose(
        full[:, :, TOK.OFFSET :], np.stack([s["logits"] for s in theirs], 1), rtol=0, atol=1e-10
    )
    # our texts start with BOS: [BOS] + text steps as their "\n" + text
    with_bos = torch.cat([torch.full((3, 1), TOK.bos_id), ours], dim=1)
    newline_first = np.concatenate([np.full((3, 1), 10), byte_ids], axis=1)
    assert_steps_match(our_steps(model, with_bos), openai_reference(arrays, newline_first))


def run_import(capsys, *args: str) -> tuple[int, str, str]:
    rc = import_main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize(
    "file, array, needle",
    [
        ("7.npy", np.zeros((12, 13), np.float32), "7.npy: tensor rnn/wmh has shape (12, 13), expected (12, 12)"),
        ("0.npy", np.zeros((257, 8), np.float32), "0.npy: tensor embedding/w has shape (257, 8), expected (256, E)"),
        ("13.npy", np.zeros((256, 12), np.float32), "13.npy: tensor out/w has shape (256, 12), expected (12, 256)"),
        ("1.npy", np.zeros((8, 30), np.float32), "1.npy: tensor rnn/wx has shape (8, 30), expected (8, 4H)"),
        ("9.npy", np.zeros(48, np.int32), "9.npy: tensor rnn/gx holds int32 values, expected floating point"),
        ("8.npy", np.full(48, np.nan, np.float32), "8.npy: tensor rnn/b holds NaN or infinite values"),
    ],
)  # fmt: skip
def test_a_file_that_does_not_fit_is_refused_in_one_line(tmp_path, capsys, file, array, needle):
    write_openai(tmp_path / "m", E=8, H=12)
    np.save(tmp_path / "m" / file, array)
    rc, _, err = run_import(capsys, "--from", "openai", str(tmp_path / "m"), "--out", str(tmp_path / "exp"))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert not (tmp_path / "exp").exists()


def test_a_missing_file_or_folder_is_refused_in_one_line(tmp_path, capsys):
    write_openai(tmp_path / "m", E=8, H=12)
    (tmp_path / "m" / "3.npy").unlink()
    (tmp_path / "x.npy").write_bytes(b"not a numpy file")
    cases = [
        (tmp_path / "m", "3.npy: tensor rnn/wh (gate f): missing; OpenAI's release has 0.npy ... 14.npy"),
        (tmp_path / "nowhere", "nowhere: not a folder"),
    ]
    for folder, needle in cases:
        rc, _, err = run_import(capsys, "--from", "openai", str(folder), "--out", str(tmp_path / "exp"))
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and needle in lines[0], err
    write_openai(tmp_path / "m", E=8, H=12)
    (tmp_path / "m" / "5.npy").write_bytes(b"\x93NUMPY garbage")
    rc, _, err = run_import(capsys, "--from", "openai", str(tmp_path / "m"), "--out", str(tmp_path / "exp"))
    assert (
        rc == 2
        and len(err.strip().splitlines()) == 1
        and "5.npy: tensor rnn/wh (gate u): unreadable .npy file" in err
    ), err
