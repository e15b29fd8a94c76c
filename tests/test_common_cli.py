"""app/common/cli.py and config_file.py through the single-process entry points (evaluate, generate,
export, transfer): --config FILE below the flags, --x/--no-x, choices in --help, one-line errors."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

import app
from app import evaluate, export, generate, plot, train, transfer
from app.common.cli import parse_config
from app.generation.config import GenerateConfig
from data_prep.cli import main as prep_main


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
    "main", [train.main, evaluate.main, generate.main, export.main, transfer.main, plot.main, prep_main]
)
def test_every_cli_has_version(main, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.split()[-1] == importlib.metadata.version("mlstm-ds") == app.__version__


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
