"""data_prep/csv_rows.py: which CSV files leave pandas, where their first invalid byte is, and that the
Python reader gives the rows pandas gives (through ``datasets``) on files both can read."""

from __future__ import annotations

import csv
import random

import pytest

from data_prep import csv_rows, readers

ALPHABET = ["a", "b", " ", "\n", "\u00e9", "\u4e2d", "\U0001f600", ",", '"']


def _where(data: bytes) -> tuple[int, int] | None:
    """(line, byte) of the first invalid UTF-8 byte, decoding the whole file at once."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return data.count(b"\n", 0, exc.start) + 1, exc.start
    return None


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 1 << 20])
def test_scan_finds_the_first_invalid_byte_across_block_edges(tmp_path, monkeypatch, block):
    monkeypatch.setattr(csv_rows, "SCAN_BYTES", block)
    rng = random.Random(block)
    for trial in range(40):
        data = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 60))).encode()
        if trial % 4:  # a stray Latin-1 byte, a lone continuation byte or a character cut short
            at = rng.randrange(len(data) + 1)
            data = data[:at] + rng.choice([b"\xe9", b"\x80", b"\xf0\x9f", b"\xe4\xb8"]) + data[at:]
        if trial % 5 == 0:
            data += b"\x00"
        path = tmp_path / f"{trial}.csv"
        path.write_bytes(data)
        utf8 = readers.Utf8State()
        assert csv_rows.scan(path, utf8) == (b"\0" in data or _where(data) is not None), data
        assert utf8.first_bad == _where(data), data


def _random_table(rng: random.Random, rows: int) -> list[list[str]]:
    def field() -> str:
        return "".join(rng.choice([*ALPHABET, "\r\n", "'", "x"]) for _ in range(rng.randrange(0, 12)))

    return [[field(), field(), str(i)] for i in range(rows)]


@pytest.mark.parametrize("sep", [",", "\t"])
def test_the_python_reader_gives_the_rows_pandas_gives(tmp_path, sep):
    """Quoted separators, quotes, newlines and CRLF inside fields, empty fields, a short row and blank
    lines: the rows of a file pandas reads faithfully are the same from both readers."""
    rng = random.Random(sep == ",")
    path = tmp_path / ("t.csv" if sep == "," else "t.tsv")
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=sep)
        w.writerow(["text", "other", "n"])
        w.writerows(_random_table(rng, 200))
        f.write("\n\n")  # blank lines: no rows
        f.write(f"only one field{sep}x\n")  # a short row: the missing field is empty
    for field in ("text", "n"):
        want = list(
            readers.table_records("csv", path, field, 2, sep=sep, keep_default_na=False, na_values=[])
        )
        got = list(csv_rows._python_rows(path, field, sep))
        assert got == want
    assert list(csv_rows._python_rows(path, "n", sep))[-1] == ("", "", 202, True)


def test_a_nul_byte_and_latin1_leave_pandas_and_keep_their_text(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b'\xef\xbb\xbftext\n"a\x00b"\n"caf\xe9"\n"' + b"x" * 300_000 + b'"\n')
    utf8 = readers.Utf8State()
    rows = list(csv_rows.csv_records(path, "text", ",", clean=not csv_rows.scan(path, utf8)))
    assert [r[0] for r in rows] == ["a\x00b", "caf\ufffd", "x" * 300_000]  # a field over csv's 128 KiB
    assert utf8.first_bad == (3, 18)  # after the BOM (3 bytes), as for text files


def test_no_such_column_is_one_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b'body\n"caf\xe9"\n')
    with pytest.raises(readers.UserError, match=r"t\.csv: no column 'text' \(columns: body\)"):
        list(csv_rows.csv_records(path, "text", ",", clean=False))
