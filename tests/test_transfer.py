"""app/transfer.py: features through the prefill path, the L1 probe, the figures, the cache, bad input.

A tiny random debug model with the byte tokenizer (tests/test_checkpoints_consolidate.py) is enough: its states
already separate texts made of different characters, so the pipeline's numbers can be checked fast.
"""

from __future__ import annotations

import csv
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_checkpoints_consolidate import fake_checkpoint, tiny

from app.classifier.features import batch_feature_sets, length_batches, token_ids
from app.model.reference import naive_mlstm
from app.probing.features import batch_features, featurize
from app.transfer import main as transfer_main
from data_prep.tokenizer import ByteTokenizer


def texts_of(alphabet: str, n: int, rng: random.Random) -> list[str]:
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(3, 40))) for _ in range(n)]


def write_csv(path: Path, rows: list[tuple[str, object]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def task(tmp_path):
    """Binary: lower-case letters ("letters") vs digits and punctuation ("digits"); CSV train, JSONL test."""
    rng = random.Random(0)
    fake_checkpoint(tmp_path / "run", tiny(), "module")
    rows = [(t, "letters") for t in texts_of("abcdefgh ", 40, rng)]
    rows += [(t, "digits") for t in texts_of("0123456789.,;", 40, rng)]
    rng.shuffle(rows)
    write_csv(tmp_path / "train.csv", rows)
    test = [{"text": t, "label": "letters"} for t in texts_of("abcdefgh ", 12, rng)]
    test += [{"text": t, "label": "digits"} for t in texts_of("0123456789.,;", 12, rng)]
    write_jsonl(tmp_path / "test.jsonl", test)
    return tmp_path


def run_transfer(tmp_path: Path, *extra: str) -> dict:
    """The CLI on the task; the probe only unless a --finetune flag is given (tests/test_probing_finetune.py)."""
    if not any(a.startswith("--finetune") for a in extra):
        extra = (*extra, "--finetune-epochs", "0")
    args = ["--checkpoint", str(tmp_path / "run"), "--train", str(tmp_path / "train.csv")]
    args += ["--test", str(tmp_path / "test.jsonl"), "--out", str(tmp_path / "out"), *extra]
    assert transfer_main(args) == 0
    return json.loads((tmp_path / "out" / "transfer.json").read_text())


def test_binary_probe_end_to_end_and_cache(task, capsys):
    res = run_transfer(task)
    assert res["classes"] == ["digits", "letters"] and res["rows"] == {"train": 80, "test": 24}
    assert res["test_accuracy"] > res["majority_class_test_accuracy"] + 0.3  # a separable task is separated
    assert 1 <= res["nonzero_weights"] <= res["hidden_dim"] and res["C"] in {2.0**k for k in range(-6, 5)}
    top = res["top_neurons"]
    assert top and abs(top[0]["weight"]) >= max(abs(t["weight"]) for t in top)
    assert (
        top[0]["neuron"] == res["single_neuron"]["neuron"] and 0 <= res["single_neuron"]["test_accuracy"] <= 1
    )
    assert len(res["single_neuron"]["threshold"]) == 1
    for png in res["figures"]:
        assert (task / "out" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res["featurize"]["tokens"] > 0 and not any(res["featurize"]["cached"].values())
    assert res["featurize"]["texts"] == 80 + 24  # every text of both splits, once (not the feature kinds)
    assert "test accuracy" in capsys.readouterr().out
    again = run_transfer(task)  # features from the .npy cache, same answer
    assert all(again["featurize"]["cached"].values())
    assert again["test_accuracy"] == res["test_accuracy"] and again["top_neurons"] == res["top_neurons"]
    for f in (task / "out" / "features").glob("*.npy"):
        np.load(f, allow_pickle=False)  # plain arrays: nothing to unpickle


def test_multiclass_int_labels_parquet_and_validation(tmp_path):
    import datasets

    rng = random.Random(1)
    fake_checkpoint(tmp_path / "run", tiny(), "module")
    alphabets = {3: "abc ", 7: "xyz!", 11: "0123"}

    def part(name: str, n: int) -> Path:
        rows = [{"text": t, "label": k} for k, a in alphabets.items() for t in texts_of(a, n, rng)]
        datasets.Dataset.from_list(rows).to_parquet(tmp_path / f"{name}.parquet")
        return tmp_path / f"{name}.parquet"

    args = [
        "--checkpoint",
        str(tmp_path / "run"),
        "--out",
        str(tmp_path / "out"),
        "--features",
        "mean_hidden",
    ]
    args += [
        "--train",
        str(part("train", 20)),
        "--validation",
        str(part("val", 6)),
        "--test",
        str(part("test", 6)),
    ]
    assert transfer_main([*args, "--layer", "0"]) == 0
    res = json.loads((tmp_path / "out" / "transfer.json").read_text())
    assert res["classes"] == ["3", "7", "11"] and res["rows"]["validation"] == 18 and res["layer"] == 0
    assert res["test_accuracy"] > 0.6 and len(res["top_neurons"][0]["weight"]) == 3  # one weight per class
    assert len(res["finetune"]["val_accuracy_by_epoch"]) == 4  # the default fine-tuning, three classes


def test_features_match_a_float64_reference_and_ignore_padding():
    """Padded, length-sorted batches give each text the features of that text alone, equal to the naive
    float64 recurrence (final hidden state, mean hidden state) on fresh random weights."""
    torch.manual_seed(random.randrange(1 << 30))
    model = tiny(weight_norm=False)
    tok = ByteTokenizer()
    rng = random.Random(2)
    ids = token_ids(tok, texts_of("abcdefghij 01", 9, rng))
    lay = model.recurrent[0]
    w = lambda t: t.detach().double()  # noqa: E731
    for kind in ("final_hidden", "mean_hidden", "max_hidden", "final_cell"):
        got = featurize(model, ids, kind, 0, batch_tokens=60, pad_id=tok.pad_id).features  # several batches
        for i, s in enumerate(ids):
            alone = batch_features(model, torch.as_tensor(s)[None], torch.tensor([len(s)]), kind, 0)[0]
            np.testing.assert_allclose(got[i], alone.numpy(), rtol=1e-5, atol=1e-5)
            if kind == "final_cell":
                continue
            x = model.embedding(torch.as_tensor(s)[None]).double()  # (1, T, E)
            H = lay.hidden_dim
            h = naive_mlstm(
                x, w(lay.weight_in[:H]), w(lay.weight_in[H:]), w(lay.bias), w(lay.weight_mh), w(lay.weight_m)
            )
            ref = {"final_hidden": h[0, -1], "mean_hidden": h[0].mean(0), "max_hidden": h[0].amax(0)}[kind]
            np.testing.assert_allclose(got[i], ref.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_layers_side_by_side_are_each_layers_features():
    """--layer all / a list: each kind is the listed layers' own features, concatenated in the order given."""
    model = tiny()
    tok = ByteTokenizer()
    seqs = token_ids(tok, ["abc abc", "0123 4", "zz"])
    ids = torch.full((3, max(map(len, seqs))), tok.pad_id)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s)
    lengths = torch.tensor([len(s) for s in seqs])
    both = batch_feature_sets(model, ids, lengths, [1, 0])
    for kind, f in both.items():
        H = model.cfg.hidden_dim
        assert f.shape == (3, 2 * H)
        torch.testing.assert_close(f[:, :H], batch_features(model, ids, lengths, kind, 1), rtol=0, atol=0)
        torch.testing.assert_close(f[:, H:], batch_features(model, ids, lengths, kind, 0), rtol=0, atol=0)


def test_auto_features_are_picked_on_validation_beside_the_ngram_baseline(task):
    res = run_transfer(task, "--layer", "all")
    picked = res["val_accuracy_by_features"]
    assert set(picked) == {"final_cell", "final_hidden", "mean_hidden", "max_hidden"}
    assert res["features_asked"] == "auto" and picked[res["features"]] == max(picked.values())
    assert max(res["val_accuracy_by_C"].values()) == picked[res["features"]]
    assert res["layer"] == [0, 1] and 2 * 64 >= res["top_neurons"][0]["neuron"] >= 0
    base = res["ngram_baseline"]
    assert base["test_accuracy"] > res["majority_class_test_accuracy"] + 0.3 and base["features"] > 0


def test_length_batches_respect_the_budget_and_cover_every_row():
    lengths = np.asarray([5, 50, 3, 20, 20, 7, 1])
    batches = length_batches(lengths, 40)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * lengths[b].max() <= 40
    flat = np.concatenate(batches)
    assert (np.diff(lengths[flat]) >= 0).all()  # sorted by length


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        ("--text-field body", "no column 'body'"),
        ("single_class", "needs two or more classes"),
        ("empty_text", "row 2: 'text' is empty"),
        ("unknown_test_label", "label 'other' does not occur in --train"),
        ("--layer 5", "--layer 5"),
        ("--layer 0,0", "named twice"),
        ("--layer last", "--layer must be"),
        ("--features last", "--features"),
        ("bad_format", "unknown format '.txt'"),
        ("missing_file", "no such file"),
    ],
)
def test_bad_input_is_one_clear_line(task, capsys, mutate, needle):
    train, test = task / "train.csv", task / "test.jsonl"
    extra: list[str] = []
    if mutate.startswith("--"):
        extra = mutate.split()
    elif mutate == "single_class":
        write_csv(train, [("abc", "x"), ("def", "x")])
    elif mutate == "empty_text":
        write_csv(train, [("abc", "x"), ("  ", "y")])
    elif mutate == "unknown_test_label":
        write_jsonl(test, [{"text": "abc", "label": "letters"}, {"text": "abc", "label": "other"}])
    elif mutate == "bad_format":
        test = task / "test.txt"
        test.write_text("abc")
    elif mutate == "missing_file":
        test = task / "nope.csv"
    args = ["--checkpoint", str(task / "run"), "--train", str(train), "--test", str(test), *extra]
    rc = transfer_main([*args, "--out", str(task / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert not (task / "out" / "transfer.json").exists()


def test_missing_extra_names_the_pip_command(task, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # what an environment without the extra looks like
    rc = transfer_main(["--checkpoint", str(task / "run"), "--train", "a.csv", "--test", "b.csv"])
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        rc == 2
        and len(err) == 1
        and "pip install 'mlstm-ds[transfer]'" in err[0]
        and "scikit-learn" in err[0]
    )


def test_progress_bars_on_a_terminal_and_a_line_per_feature_kind_and_c(task):
    """stderr a terminal (a pty): featurizing and fine-tuning draw tqdm bars there; stdout (a pipe) gets a
    line per feature kind and C, and per epoch. Before, the probe said nothing until it ended (25 minutes)."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 columns wide
    args = [
        "--checkpoint",
        str(task / "run"),
        "--train",
        str(task / "train.csv"),
        "--test",
        str(task / "test.jsonl"),
    ]
    args += ["--out", str(task / "out"), "--finetune-epochs", "1", "--heatmap-texts", "0"]
    p = subprocess.Popen([sys.executable, "app/transfer.py", *args], stdout=subprocess.PIPE, stderr=slave, text=True,
                         cwd=Path(__file__).resolve().parent.parent)  # fmt: skip
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out = p.communicate(timeout=300)[0]
    os.close(master)
    assert p.returncode == 0, err.decode(errors="replace")[-3000:]
    err_text = err.decode(errors="replace")
    assert "featurize train" in err_text and "fine-tune epoch 1/1" in err_text  # the bars
    for kind in ("final_cell", "final_hidden", "mean_hidden", "max_hidden"):
        assert f"probe {kind}: C 0.015625: validation accuracy" in out and f"probe {kind}: C 16: " in out
    assert "fine-tune epoch 1/1: loss" in out and "\r" not in out


def test_files_without_a_text_column_read_their_one_string_column(task, capsys):
    """GLUE/SST name the text `sentence`: with --text-field left at `text` and one string column besides the
    label, that column is read, said in one line (once, for every file); two to choose from is one error
    line naming the columns."""
    rows = list(csv.reader((task / "train.csv").open()))[1:]
    with (task / "train.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["label", "sentence"], *[[y, t] for t, y in rows]])
    test = [json.loads(ln) for ln in (task / "test.jsonl").read_text().splitlines()]
    write_jsonl(task / "test.jsonl", [{"sentence": r["text"], "label": r["label"]} for r in test])
    res = run_transfer(task)
    out = capsys.readouterr().out
    assert res["rows"] == {"train": 80, "test": 24}
    said = "--text-field: no column 'text'; reading 'sentence', its one column of text besides 'label'"
    assert out.count(said) == 1, out
    write_jsonl(task / "test.jsonl", [{"sentence": r["text"], "id": "x", "label": r["label"]} for r in test])
    rc = transfer_main(["--checkpoint", str(task / "run"), "--train", str(task / "test.jsonl"),
                        "--test", str(task / "test.jsonl"), "--out", str(task / "out2")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    want = (
        f"error: --train {task / 'test.jsonl'}: no column 'text' (--text-field); columns: sentence, id, label"
    )
    assert rc == 2 and len(err) == 1 and err[0].startswith(want), err
