"""Dynamic evaluation (app/evaluation/dynamic.py, `app/evaluate.py --dynamic`).

The cell run from a carried state is checked against float64 finite differences and against one
unsplit pass; the end-to-end tests run the real CLI on the real training run of tests/conftest.py.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
import torch
from test_checkpoints_consolidate import tiny
from test_evaluate import evaluate_cli, refusal

from app.common.cli import parse_config
from app.evaluation.config import EvalConfig
from app.evaluation.dynamic import DynamicEvaluator, dynamic_lines
from app.model.config import debug_config
from app.model.core import mlstm_sequence_from
from app.model.layers import RecurrentLayer


@pytest.mark.parametrize("core", ["python", "fused"])
def test_cell_from_a_state_has_exact_weight_gradients(core):
    """Fresh random float64 inputs and a non-zero starting state: the custom backward (the Python loop's,
    the fused CPU loop's) agrees with finite differences for x and every weight."""
    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    B, T, D, H = 2, 5, 3, 4

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_()

    x, ws = rnd(B, T, D), (rnd(5 * H, D), rnd(4 * H), rnd(H, H, scale=0.5), rnd(4 * H, H, scale=0.5))
    state = (
        torch.randn(B, H, generator=g, dtype=torch.float64).tanh(),
        torch.randn(B, H, generator=g).double(),
    )
    assert torch.autograd.gradcheck(
        lambda *a: mlstm_sequence_from(a[0], state, *a[1:], core=core)[0], (x, *ws)
    )


@pytest.mark.parametrize("cell", ["mlstm", "lstm"])
def test_carried_state_equals_one_unsplit_pass(cell):
    torch.manual_seed(random.randrange(1 << 30))
    layer = RecurrentLayer(debug_config(cell=cell, weight_norm=cell == "mlstm"), 1).double()
    x = torch.randn(3, 11, layer.in_dim, dtype=torch.float64)
    whole = layer(x)  # (B, T, H) from a zero state
    state, parts = layer.init_state(3, "cpu", torch.float64), []
    for a, b in ((0, 4), (4, 5), (5, 11)):
        y, state = layer.forward_from(x[:, a:b], state)
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-10, atol=1e-12)


def test_segments_are_scored_before_the_update():
    """The first segment's loss with adaptation equals its loss without: no token sees its own gradient."""
    model = tiny()
    ids = list(range(3, 40)) * 2
    dyn = DynamicEvaluator(model, [1e-2], decay=0.0, segment=len(ids) - 1)  # one segment: nothing to gain
    res = dyn.evaluate([ids])
    assert res.dynamic_nats == pytest.approx(res.carried_nats, rel=1e-6)
    for p, p0 in zip(dyn.params, model.parameters()):  # reset to the trained weights afterwards
        assert torch.equal(p, p0)


def test_one_line_per_text_read_with_several_step_sizes():
    mixed = {
        "name": "a.txt",
        "dynamic": 1.5,
        "dynamic_by_lr": [
            {"lr": 3e-4, "bits/byte": 1.6, "weight": 0.0},
            {"lr": 3e-3, "bits/byte": 1.5, "weight": 1.0},
        ],
    }
    single = {
        "name": "b.txt",
        "dynamic": 2.0,
        "dynamic_by_lr": [{"lr": 1e-3, "bits/byte": 2.0, "weight": 1.0}],
    }
    assert dynamic_lines([mixed, single, {"name": "c.txt"}]) == [
        "  dynamic, a.txt: the mixture 1.5000 of step sizes 0.0003: 1.6000 (weight 0.00), 0.003: 1.5000 (weight 1.00)"
    ]


@pytest.mark.parametrize(
    ("config", "flags", "want"),
    [
        (None, [], [3e-4, 1e-3, 3e-3]),  # the default: the mixture of three
        (None, ["--dyn-lr", "1e-3", "3e-3"], [1e-3, 3e-3]),
        ("dyn_lr: 1e-3\n", [], [1e-3]),  # YAML reads 1e-3 as a string; one number is a list of one
        ("dyn_lr: [0.0003, 0.003]\n", [], [3e-4, 3e-3]),
        ("dyn_lr: [0.0003]\n", ["--dyn-lr", "0"], [0.0]),  # the flag wins over the file
    ],
)  # fmt: skip
def test_dyn_lr_from_flags_and_config_files(tmp_path, config, flags, want):
    argv = ["--checkpoint", "c", "--data", "d", *flags]
    if config is not None:
        (tmp_path / "e.yaml").write_text(config)
        argv += ["--config", str(tmp_path / "e.yaml")]
    assert parse_config(EvalConfig, argv, None).dyn_lr == want
    assert EvalConfig(checkpoint="c", data="d", dyn_lr=1e-3).dyn_lr == [1e-3]  # programmatic: one number


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ("dyn_lr: []\n", "--dyn-lr needs at least one value"),
        ("dyn_lr: [true]\n", "`dyn_lr`: expects a list of numbers"),
        ("dyn_lr: [0.001, fast]\n", "`dyn_lr`: expects a list of numbers"),
        ("dyn_lr: [0.001, .nan]\n", "--dyn-lr: expects a finite number"),
        ("dyn_lr: 1" + "0" * 400 + "\n", "`dyn_lr`: expects a list of numbers"),  # too large for a float
    ],
)  # fmt: skip
def test_bad_dyn_lr_in_a_config_file_is_one_line(tmp_path, capsys, config, needle):
    (tmp_path / "e.yaml").write_text(config)
    assert needle in refusal(tmp_path, capsys, "--config", str(tmp_path / "e.yaml"))


def test_each_step_size_starts_from_the_trained_weights():
    """Learners run one after another; each starts from θ0 and an empty RMS, so a learner's figure does not
    depend on the step sizes read before it."""
    model = tiny()
    ids = [2, *(list(range(3, 40)) * 3)]
    both = DynamicEvaluator(model, [1e-2, 3e-3], decay=0.01, segment=8).evaluate([ids])
    alone = [DynamicEvaluator(model, [lr], decay=0.01, segment=8).evaluate([ids]) for lr in (1e-2, 3e-3)]
    assert both.learner_nats == (alone[0].learner_nats[0], alone[1].learner_nats[0])
    assert both.learner_nats[0] != both.learner_nats[1]
    assert both.carried_nats == alone[0].carried_nats


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_dynamic_lowers_bits_per_byte_on_repeated_text_and_leaves_the_checkpoint(reference_run, tmp_path):
    run_dir, _ = reference_run
    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(40)
    ]
    block = " ".join(rng.choice(words) for _ in range(60)) + ".\n"
    text = tmp_path / "repeated.txt"
    text.write_text(block * 6)  # structure the model never saw, repeated: what adaptation can learn
    before = digest(run_dir / "checkpoints")
    args = (
        "--text",
        str(text),
        "--dynamic",
        "--dyn-lr",
        "1e-3",
        "--dyn-decay",
        "0.02",
        "--dyn-segment",
        "32",
    )
    a = evaluate_cli(run_dir, tmp_path / "a.json", *args)
    m = evaluate_cli(run_dir, tmp_path / "m.json", *args[:4], "1e-3", "3e-3", *args[5:])["texts"][0]
    assert digest(run_dir / "checkpoints") == before  # not one byte of the checkpoint changed
    ra = a["texts"][0]
    assert ra["dynamic"] < 0.9 * ra["static carried"] and ra["dynamic"] < 0.9 * ra["bits/byte"], ra
    assert ra["dyn gain %"] == pytest.approx(100 * (1 - ra["dynamic"] / ra["bits/byte"]))
    assert a["dynamic"] == {"lr": [1e-3], "decay": 0.02, "segment": 32}
    assert [d["lr"] for d in ra["dynamic_by_lr"]] == [1e-3]
    assert ra["dynamic_by_lr"][0]["bits/byte"] == ra["dynamic"]
    # another process, two step sizes: the 1e-3 learner is bit for bit the run above (deterministic, and
    # not moved by the learner after it), and the mixture lies within ln 2 nats of the better learner
    assert m["static carried"] == ra["static carried"] and m["dynamic_by_lr"][0]["bits/byte"] == ra["dynamic"]
    learners = [d["bits/byte"] for d in m["dynamic_by_lr"]]
    assert learners[1] != learners[0]
    assert min(learners) <= m["dynamic"] <= min(learners) + 1.0 / m["bytes"]  # ln 2 nats, in bits per byte


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--dyn-segment", "0"], "--dyn-segment"),
        (["--dyn-lr", "-1"], "--dyn-lr"),
        (["--dyn-decay", "nan"], "--dyn-decay"),
        (["--dyn-lr", "fast"], "--dyn-lr: expects a list of numbers"),
        (["--dyn-lr", "1e-3", "nan"], "--dyn-lr"),
    ],
)
def test_bad_dynamic_flags_are_one_clear_line(tmp_path, capsys, args, needle):
    assert needle in refusal(tmp_path, capsys, "--dynamic", *args)


def test_table_shows_dynamic_columns_only_when_evaluated():
    from app.evaluation.evaluator import fmt_table

    rows = [{"name": "x", "bits/byte": 2.0, "static carried": 1.9, "dynamic": 1.5, "dyn gain %": 25.0}]
    head = fmt_table(rows).splitlines()[0]
    assert "dynamic" in head and "static carried" in head
    assert "dynamic" not in fmt_table([{"name": "x", "bits/byte": 2.0}]).splitlines()[0]
