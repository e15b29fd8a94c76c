"""app/common/cli.py and config_file.py: README.md's promise for every command (the nine console scripts of
pyproject.toml, each `main(argv)` called in this process): --help with every flag documented, --version,
--config FILE (YAML or JSON, keyed by the flags' names, below the flags), and a user error as one `error:`
line with exit status 2. Then the details: --x/--no-x, choices in --help, a bad config file's line."""

from __future__ import annotations

import importlib
import json
import re
import tokenize

import pytest
import yaml
from launcher import CPU_CONFIG, ROOT
from test_console_scripts import console_scripts

import app
from app import evaluate, export, generate, transfer
from app.common.cli import parse_config
from app.generation.config import GenerateConfig

COMMANDS = sorted(console_scripts())


def _main(name: str):
    module, func = console_scripts()[name].split(":")
    return getattr(importlib.import_module(module), func)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def undocumented(help_text: str) -> list[str]:
    """The options of an argparse --help with no help text of their own (`  --x X` and nothing after it, on
    its line or the more indented lines under it)."""
    lines, bare = help_text.splitlines(), []
    for i, line in enumerate(lines):
        head = re.match(r"^  (-\S.*?)(?:\s{2,}(\S.*))?$", line)
        if head and not head.group(2):
            below = lines[i + 1] if i + 1 < len(lines) else ""
            if not re.match(r"^ {4,}\S", below) or re.match(r"^  -", below):
                bare.append(head.group(1))
    return bare


def test_the_help_check_sees_an_undocumented_flag():
    text = "options:\n  -h, --help  show\n  --a A       does a\n  --b-long-name B\n                 does b\n  --c C\n"
    assert undocumented(text) == ["--c C"]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_answers_help_with_each_flag_documented(name, capsys):
    with pytest.raises(SystemExit) as done:
        _main(name)(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: "), out[:300]
    assert "--config FILE" in out and "--version" in out
    assert not undocumented(out), undocumented(out)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_answers_version(name, capsys):
    with pytest.raises(SystemExit) as done:
        _main(name)(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.split()[-1] == importlib.metadata.version("mlstm-ds") == app.__version__


# a value of the wrong type for one of each command's flags
BAD_VALUE = {
    "mlstm-prep": ["--vocab-size", "many"], "mlstm-train": ["--lr", "fast"], "mlstm-eval": ["--split", "dev"],
    "mlstm-generate": ["--top-k", "some"], "mlstm-export": ["--check-hf", "maybe"],
    "mlstm-transfer": ["--features", "best"], "mlstm-plot": ["--out"], "mlstm-import": ["--feature-preprocess", "x"],
    "mlstm-classify": ["--chunk-rows", "1e3"],
}  # fmt: skip


@pytest.mark.parametrize("name", COMMANDS)
def test_every_user_error_of_every_command_is_one_line_and_exit_status_2(name, capsys):
    """An unknown flag, a flag without its value or with one of the wrong type, and a --config file that is
    not there: each one `error:` line (the same words for the same mistake in every command), status 2."""
    main = _main(name)
    assert main(["--no-such-flag=1"]) == 2
    assert _one_error_line(capsys).startswith("error: unrecognized arguments: --no-such-flag=1 (see --help)")
    assert main(BAD_VALUE[name]) == 2
    assert BAD_VALUE[name][0] in _one_error_line(capsys)
    assert main(["--config", str(ROOT / "missing.yaml")]) == 2
    assert _one_error_line(capsys).startswith(f"error: --config {ROOT / 'missing.yaml'}: file not found")


def config_cases(tmp, missing) -> dict[str, tuple[dict, list[str]]]:
    """command -> (a config file's settings, flags): what each command needs to start, keyed by the flags'
    names, naming a path that does not exist as the first thing the command reads."""
    m = str(missing)
    return {
        "mlstm-prep": ({"input": [m], "out": str(tmp / "prep"), "vocab-size": 512}, []),
        "mlstm-train": ({"data": m, "out": str(tmp / "run"), "max-steps": 3}, ["--deepspeed_config", str(CPU_CONFIG)]),
        "mlstm-eval": ({"checkpoint": m, "text": [m]}, []),
        "mlstm-generate": ({"checkpoint": m, "prompt": "x", "max_new_tokens": 5}, []),
        "mlstm-export": ({"checkpoint": m, "out": str(tmp / "export")}, []),
        "mlstm-transfer": ({"checkpoint": m, "train": m, "test": m}, []),
        "mlstm-plot": ({"runs": [m], "out": str(tmp / "p.png")}, []),
        "mlstm-import": ({"from": ["openai", m], "out": str(tmp / "import")}, []),
        "mlstm-classify": ({"input": m, "input-format": "csv", "classifier": m, "output": str(tmp / "l.csv")}, []),
    }  # fmt: skip


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_reads_a_config_file_keyed_by_its_flags_names(name, suffix, tmp_path, capsys):
    """The settings a command needs, from --config alone: it starts and reads the path the file names (which
    is missing: one line naming it). A flag given beside the file wins. A key that names no flag is refused,
    naming the file, its line and the closest flag."""
    missing, other = tmp_path / "missing_from_the_file", tmp_path / "missing_from_the_flag"
    settings, flags = config_cases(tmp_path, missing)[name]
    f = tmp_path / f"settings{suffix}"
    f.write_text(json.dumps(settings, indent=1) if suffix == ".json" else yaml.safe_dump(settings))
    main = _main(name)
    assert main(["--config", str(f), *flags]) == 2
    assert str(missing) in _one_error_line(capsys)
    first_key = next(iter(settings))
    override = ["RUN" if name == "mlstm-plot" else f"--{first_key}"]
    value = ["openai", str(other)] if name == "mlstm-import" else [str(other)]
    args = [*value] if name == "mlstm-plot" else [*override, *value]
    assert main(["--config", str(f), *flags, *args]) == 2
    line = _one_error_line(capsys)
    assert str(other) in line and (name == "mlstm-import" or str(missing) not in line), line
    f.write_text(
        json.dumps({**settings, "colour": 3}, indent=1)
        if suffix == ".json"
        else yaml.safe_dump({**settings, "colour": 3})
    )
    assert main(["--config", str(f), *flags]) == 2
    line = _one_error_line(capsys)
    assert f"{f} line " in line and "unknown setting `colour`" in line, line


def test_no_command_docstring_joins_its_lines():
    """A backslash at the end of a line of a (non-raw) docstring joins that line to the next: `classify --help`
    printed its example as one line with a run of spaces inside. An example's line continuation is `\\\\`."""
    for name in COMMANDS:
        path = ROOT / (console_scripts()[name].split(":")[0].replace(".", "/") + ".py")
        with path.open("rb") as f:
            doc = next(t.string for t in tokenize.tokenize(f.readline) if t.type == tokenize.STRING)
        raw = "r" in re.match(r"[a-zA-Z]*", doc).group().lower()
        assert raw or not re.search(r"(?<!\\)(\\\\)*\\\n", doc), f"{path}: a line ends in a lone backslash"


# ---- the details


def test_config_file_is_below_the_flags_and_above_the_defaults(tmp_path):
    f = tmp_path / "gen.yaml"
    f.write_text("checkpoint: runs/x\nmax-new-tokens: 50\ntop_k: 3\ntemperature: 0\n")
    cfg = parse_config(GenerateConfig, ["--config", str(f), "--top-k", "5"], None)
    assert (cfg.checkpoint, cfg.max_new_tokens, cfg.top_k, cfg.temperature, cfg.top_p) == (
        "runs/x",
        50,
        5,
        0.0,
        1.0,
    )
    j = tmp_path / "export.json"
    j.write_text(json.dumps({"checkpoint": "runs/x", "out": "exp"}))
    assert parse_config(export.ExportConfig, ["--config", str(j), "--out", "e2"], None).out == "e2"


@pytest.mark.parametrize(
    "flags, want",
    [([], False), (["--dynamic"], True), (["--no-dynamic"], False), (["--dynamic", "true"], True),
     (["--dynamic=off"], False), (["--dynamic", "--text", "a", "b"], True)],
)  # fmt: skip
def test_evaluate_booleans_and_lists(flags, want):
    cfg = evaluate.parse_args(["--checkpoint", "c", "--data", "d", "--local_rank=0", *flags])
    assert cfg.dynamic is want
    assert cfg.text == (["a", "b"] if "--text" in flags else [])


@pytest.mark.parametrize(
    "module, needles",
    [
        (evaluate, ["--split {train,validation,test}", "--dynamic, --no-dynamic", "--config FILE"]),
        (
            transfer,
            ["--features {auto,final_cell,final_hidden,mean_hidden,max_hidden}", "--device {auto,cpu,cuda}"],
        ),
        (generate, ["--config FILE", "--top-p TOP_P"]),
    ],
)
def test_help_lists_choices(module, needles, capsys):
    with pytest.raises(SystemExit):
        module.main(["--help"])
    out = capsys.readouterr().out
    for needle in needles:
        assert needle in out, needle


@pytest.mark.parametrize(
    "name, text, needle",
    [
        ("g.json", '{\n "checkpoint": "c",\n "max_new_token": 5\n}', "g.json line 3: unknown setting `max_new_token` for GenerateConfig (did you mean `max_new_tokens`?)"),
        ("g.json", '{\n "checkpoint": "c",\n "top_k": 2.5\n}', "g.json line 3: `top_k`: expects an integer, got 2.5"),
        ("g.json", '{"checkpoint": "c",, }', "g.json line 1 column 20: invalid JSON"),
        ("g.yaml", "checkpoint: c\nprompt: [a, b]\n", "g.yaml line 2: `prompt`: expects a string or null, got ['a', 'b']"),
        ("g.yaml", "checkpoint: !!python/object/apply:os.system [echo hi]\n", "g.yaml line 1 column 13: invalid YAML"),
        ("g.toml", "checkpoint = 'c'\n", "expected a .yaml, .yml or .json file"),
        ("missing.yaml", None, "missing.yaml: file not found"),
    ],
)  # fmt: skip
def test_bad_config_file_is_one_line(tmp_path, capsys, name, text, needle):
    f = tmp_path / name
    if text is not None:
        f.write_text(text)
    assert generate.main(["--config", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
