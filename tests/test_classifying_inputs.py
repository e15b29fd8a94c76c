"""app/classifying/inputs.py through `mlstm-classify` (main(argv), in-process): inputs as people save them.
A UTF-8 byte-order mark is no part of line 1 in a .txt, .csv or .jsonl; a compressed input is read by the
suffix before the compression's; a --keep-fields value that is not UTF-8 (a Latin-1 CSV column, a JSON
lone-surrogate escape) is written escaped and counted; the text column is chosen by app/transfer.py's rule
(SST's `sentence`); a file none of whose rows can be read (a binary file, a broken archive) is one line and
exit 2. The user's files are byte-identical afterwards.

The classifier is a random probe on the tiny byte model (its labels need not mean anything here: the
tests compare one run's output with another's)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import re
from pathlib import Path

import numpy as np
import pytest
from test_checkpoints_consolidate import fake_checkpoint, tiny
from test_classify import botchan_sentences, write_rows

from app.classifier.folder import write_classifier
from app.classifier.head import Head
from app.classify import main as classify_main

BOM = b"\xef\xbb\xbf"
JSONL = "".join(json.dumps({"text": s}) + "\n" for s in botchan_sentences()).encode()
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[rank \d+\] (INFO|DEBUG) ")


def said_lines(stderr: str) -> list[str]:
    """stderr's lines but the log's informational ones (the device chosen, the core): what a user is told."""
    return [ln for ln in stderr.strip().splitlines() if not LOG_LINE.match(ln)]


def cheap_classifier(root: Path, labels: list[str], multi: bool = False, feature: str = "final_cell") -> Path:
    """A kept probe of random weights (seeded) on the tiny byte model: a classifier folder in seconds."""
    if not (root / "run").exists():
        fake_checkpoint(root / "run", tiny(), "module")
    from app.checkpoints.loader import open_source

    src = open_source(root / "run")
    d = src.model_cfg.hidden_dim
    rng = np.random.default_rng(0)
    rows = len(labels) if multi or len(labels) > 2 else 1
    head = Head(
        "probe", multi, labels, feature, [1], np.zeros(d, np.float32), np.full(d, 0.002, np.float32),
        rng.normal(0, 0.3, (rows, d)), rng.normal(0, 0.1, rows), np.full(rows, 0.5) if multi else None, 0,
        [0, 1, 2],
    )  # fmt: skip
    name = "multi" if multi else "single"
    return write_classifier(root / name, src, src.tokenizer_meta, src.load_model().state_dict(), head, {})


@pytest.fixture(scope="module")
def clf(tmp_path_factory) -> Path:
    return cheap_classifier(tmp_path_factory.mktemp("cheap"), ["neg", "pos"])


def classify(*args) -> int:
    return classify_main([str(a) for a in args])


def texts(n: int = 12) -> list[str]:
    return botchan_sentences()[300 : 300 + n]


def output_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def labelled_rows(path: Path) -> list[tuple]:
    return [(r["row"], r["predicted"], r["p_pos"]) for r in output_rows(path)]


@pytest.mark.parametrize("suffix", [".txt", ".csv", ".jsonl"])
def test_a_byte_order_mark_is_no_part_of_line_one(clf, tmp_path, capsys, suffix):
    """Notepad's and PowerShell's UTF-8 files start with a BOM: line 1 scores as the same sentence on line 2
    does, and as the file without it (the .csv was read with utf-8-sig before; .txt and .jsonl were not)."""
    first = texts(1)[0]
    if suffix == ".txt":
        body = f"{first}\n{first}\n".encode()
    elif suffix == ".csv":
        body = f'text\n"{first}"\n"{first}"\n'.encode()
    else:
        body = "".join(json.dumps({"text": first}) + "\n" for _ in range(2)).encode()
    plain, marked = tmp_path / f"plain{suffix}", tmp_path / f"marked{suffix}"
    plain.write_bytes(body)
    marked.write_bytes(BOM + body)
    for src in (plain, marked):
        assert (
            classify("--classifier", clf, "--input", src, "--output", tmp_path / f"out_{src.stem}.jsonl") == 0
        )
    got = labelled_rows(tmp_path / "out_marked.jsonl")
    assert got == labelled_rows(tmp_path / "out_plain.jsonl")
    assert got[0][1:] == got[1][1:]  # line 1 is line 2's sentence, and scores as it
    assert marked.read_bytes() == BOM + body  # the user's file as it was


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".csv.bz2", ".txt.xz", ".jsonl.zst"])
def test_a_compressed_input_is_read_by_the_suffix_before_the_compressions(clf, tmp_path, suffix):
    """docs/classify.md's `--input huge.jsonl.zst`: the format from the suffix before .gz/.bz2/.xz/.zst."""
    rows = [{"text": t} for t in texts()]
    inner = suffix.rsplit(".", 1)[0]  # .jsonl, .csv, .txt
    plain = tmp_path / f"plain{inner}"
    if inner == ".txt":
        plain.write_text("".join(r["text"] + "\n" for r in rows), encoding="utf-8")
    else:
        write_rows(plain, rows)
    data = plain.read_bytes()
    if suffix.endswith(".zst"):
        import zstandard

        packed = zstandard.ZstdCompressor().compress(data)
    else:
        packed = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[Path(suffix).suffix](data)
    src = tmp_path / f"in{suffix}"
    src.write_bytes(packed)
    assert classify("--classifier", clf, "--input", plain, "--output", tmp_path / "a.jsonl") == 0
    assert classify("--classifier", clf, "--input", src, "--output", tmp_path / "b.jsonl") == 0
    assert labelled_rows(tmp_path / "b.jsonl") == labelled_rows(tmp_path / "a.jsonl")
    assert len(labelled_rows(tmp_path / "b.jsonl")) == len(rows)


def test_kept_fields_that_are_not_utf8_are_written_escaped_and_counted(clf, tmp_path, capsys):
    """A Latin-1 author in a CSV column and a JSON lone-surrogate escape: every output format is written
    (valid UTF-8), the values escaped (\\xNN for a byte, \\uXXXX for a surrogate), the summary counts them."""
    import csv
    import io

    t = [s for s in texts(30) if s.isascii()][:3]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([["author", "text"], *zip(["Zoë", "Renée", "Bo"], t)])
    csv_in = tmp_path / "latin1.csv"
    csv_in.write_bytes(buf.getvalue().encode("latin-1"))
    jsonl_in = tmp_path / "lone.jsonl"
    lines = [
        json.dumps({"id": "a<SURROGATE>b", "text": t[0]}).replace("<SURROGATE>", "\\udc80"),
        json.dumps({"id": "ok", "text": t[1]}),
    ]
    jsonl_in.write_text("".join(f"{ln}\n" for ln in lines), encoding="utf-8")
    before = {p: p.read_bytes() for p in (csv_in, jsonl_in)}
    for src, field, want in (
        (csv_in, "author", ["Zo\\xeb", "Ren\\xe9e", "Bo"]),
        (jsonl_in, "id", ["a\\udc80b", "ok"]),
    ):
        for fmt in ("csv", "jsonl", "parquet"):
            out = tmp_path / f"out_{src.stem}.{fmt}"
            assert classify("--classifier", clf, "--input", src, "--output", out, "--keep-fields", field) == 0
            said = capsys.readouterr().out
            escaped = len([w for w in want if "\\" in w])
            assert f"{escaped} --keep-fields values were not valid UTF-8: written escaped" in said, said
            if fmt == "parquet":
                import pyarrow.parquet as pq

                assert pq.read_table(out).column(field).to_pylist() == want
            elif fmt == "jsonl":
                assert [r[field] for r in output_rows(out)] == want
            else:
                with out.open(newline="", encoding="utf-8") as f:
                    assert [r[field] for r in csv.DictReader(f)] == want
    assert all(p.read_bytes() == b for p, b in before.items())


def test_the_text_column_is_chosen_as_transfer_chooses_it(clf, tmp_path, capsys):
    """SST's CSV names its text `sentence`: with --text-field left at `text`, classify reads its one column
    of text besides the --keep-fields (the label's 0/1 are no text), said in one line; two to choose from
    is one error line naming the columns."""
    t = texts(6)
    sst = write_rows(tmp_path / "sst.csv", [{"sentence": x, "label": i % 2} for i, x in enumerate(t)])
    ref = write_rows(tmp_path / "ref.csv", [{"text": x} for x in t])
    assert classify("--classifier", clf, "--input", sst, "--output", tmp_path / "sst.jsonl") == 0
    said = capsys.readouterr()
    assert "--text-field: no column 'text'; reading 'sentence', its one column of text" in said.err
    assert classify("--classifier", clf, "--input", ref, "--output", tmp_path / "ref.jsonl") == 0
    assert labelled_rows(tmp_path / "sst.jsonl") == labelled_rows(tmp_path / "ref.jsonl")
    two = write_rows(tmp_path / "two.csv", [{"sentence": x, "title": "T" + x} for x in t])
    capsys.readouterr()
    assert classify("--classifier", clf, "--input", two, "--output", tmp_path / "two.jsonl") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no column 'text' (--text-field); columns: sentence, title" in err[0], err


@pytest.mark.parametrize(
    ("name", "data", "needle"),
    [
        ("junk.jsonl", bytes(range(256)) * 40, "none of its"),
        ("junk.txt", b"\x00\xff\xfe\x80" * 2000, "none of its"),
        ("junk.csv", b"text\n\xff\xfe\x80\x81\n\xc3\x28\n", "none of its"),
        ("junk.jsonl.gz", b"not gzip at all" * 10, "cannot read it"),
        ("junk.txt.xz", b"\xfd7zXZ\x00garbage" * 10, "cannot read it"),
        ("junk.jsonl.zst", b"\x28\xb5\x2f\xfd" + b"\x00garbage" * 10, "cannot read it"),
        ("cut.jsonl.gz", gzip.compress(JSONL)[: len(gzip.compress(JSONL)) // 2], "cannot read it"),
    ],
)
def test_an_unreadable_file_is_one_line(clf, tmp_path, capsys, name, data, needle):
    src = tmp_path / name
    src.write_bytes(data)
    assert classify("--classifier", clf, "--input", src, "--output", tmp_path / "o.csv") == 2
    err = said_lines(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith(f"error: --input {src}") and needle in err[0], err
    assert src.read_bytes() == data and not (tmp_path / "o.csv").exists()
