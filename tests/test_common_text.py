"""app/common/text.py: text as people save it. Every reader of a handed text file drops a UTF-8 byte-order
mark (evaluate --text, generate --prompts and stdin, data prep's text and JSON Lines readers; classify's
in tests/test_classifying_inputs.py); a value that is not UTF-8 is escaped, never refused; the text column
is chosen by one rule."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from app.common.text import BOM, escaped, is_text, text_column

SENTENCE = "Then he said, “café au lait” — twice.\nAnd a second line.\n"


def test_undecodable_bytes_and_lone_surrogates_are_written_as_text_and_counted():
    latin1 = "Zoë".encode("latin-1").decode("utf-8", "surrogateescape")  # a CSV field read as UTF-8
    assert escaped(latin1, from_bytes=True) == ("Zo\\xeb", 1)
    assert escaped("a\udc80b", from_bytes=False) == ("a\\udc80b", 1)  # JSON's own \udc80 escape
    assert escaped("fine ü", from_bytes=True) == ("fine ü", 0)
    value, n = escaped({"k\ud800": ["x\udfff", 3, None, "ok"]}, from_bytes=False)
    assert value == {"k\\ud800": ["x\\udfff", 3, None, "ok"]} and n == 2
    for v in (value, escaped(latin1, True)[0]):
        str(v).encode("utf-8")  # writable


def test_one_rule_picks_the_text_column():
    sample = {
        "sentence": ["a film", "dull"],
        "label": ["0", "1"],
        "flag": ["true", ""],
        "score": ["1.5", "2e3"],
    }
    cols = list(sample)
    assert text_column("text", cols, sample, ["label"])[0] == "sentence"
    assert text_column("text", cols, sample, [])[0] == "sentence"  # numbers and flags are no text
    assert text_column("body", cols, sample, []) == ("body", None)  # a named column is as named
    two = {**sample, "title": ["A", "B"]}
    assert text_column("text", list(two), two, []) == ("text", None)  # two to choose from: the caller refuses
    assert not is_text([None, 3, 4]) and is_text(["x", None])


def _evaluate(path: Path) -> tuple[str, bytes]:
    from app.evaluation.evaluator import read_texts

    ((_, raw, text),) = read_texts([str(path)])
    return text, raw


def _prompts(path: Path) -> list[str]:
    from app.generation.config import GenerateConfig, read_prompts

    return read_prompts(GenerateConfig(checkpoint="x", prompts=str(path)), io.StringIO())


def _prompt_stdin(path: Path) -> list[str]:
    from app.generation.config import GenerateConfig, read_prompts

    return read_prompts(GenerateConfig(checkpoint="x", prompt="-"), io.StringIO(path.read_bytes().decode()))


def _prep_text(path: Path) -> list[str]:
    from data_prep import readers

    return [t for t, _, _ in readers.iter_lines(path, readers.Utf8State())]


def _prep_jsonl(path: Path) -> list:
    from data_prep import readers

    path.write_bytes(path.read_bytes().replace(b"\n", b'"}\n').replace(b"A", b'{"text": "A'))
    return list(readers.json_records(path, "text", readers.Utf8State()))


@pytest.mark.parametrize("reader", [_evaluate, _prompts, _prompt_stdin, _prep_text, _prep_jsonl])
def test_every_reader_drops_a_byte_order_mark(tmp_path, reader):
    body = b"A first line.\nA first line.\n"
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_bytes(body)
    marked.write_bytes(BOM + body)
    got = reader(marked)
    assert got == reader(plain), got
