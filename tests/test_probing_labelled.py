"""app/probing/labelled.py: labelled files read row by row, each problem one line naming the row at fault,
through transfer's CLI (no traceback reaches the user)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_checkpoints_consolidate import fake_checkpoint, tiny

from app.common.errors import UserError
from app.probing.labelled import read_labelled
from app.transfer import main as transfer_main


def refused(tmp_path: Path, train: Path, capsys) -> str:
    """transfer's CLI on `train` (also the test file): its one error line, less the traceback file it names."""
    run = tmp_path / "run"
    if not run.exists():
        fake_checkpoint(run, tiny(), "module")
    args = [
        "--checkpoint",
        str(run),
        "--train",
        str(train),
        "--test",
        str(train),
        "--out",
        str(tmp_path / "o"),
    ]
    rc = transfer_main([*args, "--finetune-epochs", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0].split(" (traceback in ")[0]


def test_an_empty_label_cell_in_an_integer_column_names_its_row(tmp_path, capsys):
    """pandas reads an integer column holding an empty cell as floats (NaN there): base 2652e8d blamed row 1
    ("label 1.0 is not a string or an integer"); the empty cell is row 7."""
    rows = [f"text {i},{i % 2}" if i != 7 else f"text {i}," for i in range(1, 10)]
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "\n".join(rows) + "\n")
    line = refused(tmp_path, train, capsys)
    assert line == f"error: --train {train}: row 7: the label ('label') is empty"
    train.write_text("text,label\n" + "\n".join(f"t{i},{i % 2}" for i in range(1, 10)) + "\n")
    assert read_labelled("train", str(train), "text", "label").labels == [i % 2 for i in range(1, 10)]
    train.write_text("text,label\na,1.5\nb,2\n")  # a true float label is still refused on its own row
    with pytest.raises(UserError, match=r"row 1: label 1\.5 is not a string or an integer"):
        read_labelled("train", str(train), "text", "label")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_file_that_is_not_utf8_names_the_encoding_and_the_first_bad_bytes_line(tmp_path, capsys, suffix):
    """A Latin-1 export: base 2652e8d said "cannot read it as csv (An error occurred while generating the
    dataset)" after a line of datasets' own logging."""
    rows = [("good row", "a"), ("still fine", "b"), ("caf\u00e9 au lait", "a"), ("na\u00efve", "b")]
    if suffix == ".csv":
        text = "text,label\n" + "".join(f"{t},{y}\n" for t, y in rows)
        line, offset = 4, len("text,label\ngood row,a\nstill fine,b\ncaf")
    else:
        text = "".join(f'{{"text": "{t}", "label": "{y}"}}\n' for t, y in rows)
        line, offset = (
            3,
            len('{"text": "good row", "label": "a"}\n{"text": "still fine", "label": "b"}\n') + 13,
        )
    train = tmp_path / f"train{suffix}"
    train.write_bytes(text.encode("latin-1"))
    assert refused(tmp_path, train, capsys) == (
        f"error: --train {train}: line {line}: byte {offset} (0xe9) is not UTF-8 (a file saved as Latin-1 or "
        f"Windows-1252?): save it as UTF-8, e.g. iconv -f latin1 -t utf-8 {train} > utf8{suffix}"
    )
    train.write_bytes(text.encode())  # the same rows in UTF-8 read as they are
    assert read_labelled("train", str(train), "text", "label").texts == [t for t, _ in rows]


@pytest.mark.parametrize("data", [bytes(range(256)) * 12, b"PAR1 not a parquet file PAR1"])
def test_a_file_that_is_not_parquet_is_one_line(tmp_path, capsys, data):
    """Garbage named .parquet: one line of ours, not `datasets`' own logged line before it."""
    train = tmp_path / "train.parquet"
    train.write_bytes(data)
    assert refused(tmp_path, train, capsys).startswith(f"error: --train {train}: cannot read it as parquet (")
    assert train.read_bytes() == data
