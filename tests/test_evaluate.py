"""app/evaluate.py: exact numbers from any checkpoint with any layout; text files beside gzip/bzip2/xz.

The slow tests evaluate the checkpoints of real training runs (tests/conftest.py) as one plain process
and under the deepspeed launcher with another layout, and check the numbers against each other and
against the run's own final_metrics.json (computed by the training engine at the end of the run).
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import pytest
from in_process import call
from launcher import ROOT, deepspeed_cmd, run
from test_checkpoints_consolidate import fake_checkpoint, tiny

from app.evaluate import main as evaluate_main
from app.evaluation.compressors import compressed_bits_per_byte
from app.evaluation.evaluator import fmt_table, text_store
from data_prep.tokenizer import ByteTokenizer

REL = 1e-5


def close(a: float, b: float, rel: float = REL) -> bool:
    return math.isclose(a, b, rel_tol=rel)


def test_compressors_and_text_chunks():
    text = "the quick brown fox jumps over the lazy dog. " * 50
    ref = compressed_bits_per_byte(text.encode())
    assert set(ref) == {"gzip -9", "bzip2 -9", "xz -9"} and all(0 < v < 1.5 for v in ref.values())
    tok = ByteTokenizer()
    store = text_store(tok, text + "é", chunk=64)
    n = len((text + "é").encode()) + 1  # bytes + EOS
    assert int(store.lengths.sum()) == n and store.lengths.max() == 64
    assert int(store.num_bytes.sum()) == n - 1
    table = fmt_table([{"name": "x", "tokens": 3, "bytes": 4, "loss": 1.0, "ppl": 2.7, "bits/byte": 0.5}])
    assert "bits/byte" in table and "-" in table.splitlines()[1]


def refusal(tmp_path: Path, capsys, *args: str) -> str:
    """app/evaluate.py in-process on a tiny checkpoint (tmp_path/run) and a short text with `args` added
    -> its one error line (exit 2)."""
    fake_checkpoint(tmp_path / "run", tiny(), "module")
    (tmp_path / "t.txt").write_text("hello")
    rc = evaluate_main(["--checkpoint", str(tmp_path / "run"), "--text", str(tmp_path / "t.txt"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--checkpoint", "/nonexistent"], "nothing to evaluate"),
        (["--checkpoint", "/nonexistent", "--data", "/x"], "--checkpoint: no such file"),
        (["--checkpoint", "RUN", "--data", "/nonexistent/data"], "--data"),
        (["--checkpoint", "RUN", "--text", "/nonexistent.txt"], "--text /nonexistent.txt"),
        (["--checkpoint", "RUN", "--text", "BINARY"], "not UTF-8"),
        (["--checkpoint", "RUN", "--text", "EMPTY"], "empty"),
        (["--checkpoint", "RUN", "--data", "/x", "--split", "dev"], "--split"),
        (["--checkpoint", "RUN", "--text", "EMPTY", "--pipeline-stages", "0"], "--pipeline-stages"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, capsys, args, needle):
    """All of these fail before any process group exists, so they run in-process."""
    fake_checkpoint(tmp_path / "run", tiny(), "module")
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00abc")
    (tmp_path / "empty").write_bytes(b"")
    subst = {"RUN": str(tmp_path / "run"), "BINARY": str(tmp_path / "bin"), "EMPTY": str(tmp_path / "empty")}
    rc = evaluate_main([subst.get(a, a) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


def test_data_with_another_tokenizer_is_refused(tmp_path, capsys, prepared_dir):
    fake_checkpoint(tmp_path / "run", tiny(), "module")  # byte tokenizer; prepared_dir is SentencePiece
    assert evaluate_main(["--checkpoint", str(tmp_path / "run"), "--data", str(prepared_dir)]) == 2
    assert "tokenized differently" in capsys.readouterr().err


# ---------------------------------------------------------------- real checkpoints, several layouts


def evaluate_cli(ckpt: Path, out: Path, *extra: str, nprocs: int = 0) -> dict:
    """nprocs 0: `python app/evaluate.py` (one plain process), its main called in this process
    (tests/in_process.py; test_long_passes_say_how_far_they_are... launches it); else under the deepspeed
    launcher."""
    args = ["--checkpoint", str(ckpt), "--out", str(out), *extra]
    p = run(deepspeed_cmd(nprocs, "app/evaluate.py", args)) if nprocs else call(evaluate_main, args)
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    assert "bits/byte" in p.stdout
    return json.loads(out.read_text())


def same_numbers(a: dict, b: dict, keys: tuple[str, ...]) -> None:
    for k in keys:
        assert close(a[k], b[k]), (k, a[k], b[k])


TEST_KEYS = ("test/loss", "test/bpb", "test/ppl")


def whole_text_bits_per_byte(ckpt: Path, text: Path) -> float:
    """[BOS, tokens, EOS] of the file through the checkpoint's plain LanguageModel in one forward pass."""
    import torch
    import torch.nn.functional as F

    from app.checkpoints.loader import open_source

    src = open_source(ckpt)
    tok, model = src.tokenizer(), src.load_model()
    ids = torch.tensor([tok.bos_id, *tok.encode(text.read_text()), tok.eos_id])
    with torch.no_grad():
        nats = F.cross_entropy(model(ids[None, :-1])[0].double(), ids[1:], reduction="sum")
    return float(nats) / math.log(2) / len(text.read_bytes())


@pytest.mark.slow
def test_pp2_dp2_checkpoint_evaluated_as_one_process_and_as_two_stages(pp2_dp2_run, prepared_dir, tmp_path):
    text = ROOT / "README.md"
    common = ["--data", str(prepared_dir), "--text", str(text)]
    one = evaluate_cli(pp2_dp2_run, tmp_path / "p1.json", *common)
    two = evaluate_cli(pp2_dp2_run, tmp_path / "p2.json", *common, "--pipeline-stages", "2", nprocs=2)
    assert one["trained_layout"]["stages"] == 2 and one["trained_layout"]["data_parallel"] == 2
    assert one["evaluated_layout"]["stages"] == 1 and two["evaluated_layout"]["stages"] == 2
    same_numbers(one, two, TEST_KEYS)
    assert one["test/tokens"] == two["test/tokens"] and one["test/bytes"] == two["test/bytes"]
    t1, t2 = one["texts"][0], two["texts"][0]
    assert t1["bytes"] == len(text.read_bytes()) and t1["tokens"] == t2["tokens"]
    assert close(t1["loss"], t2["loss"]) and close(t1["bits/byte"], t2["bits/byte"])
    assert t1["gzip -9"] < 8 and t1["xz -9"] < 8  # the reference line is there
    # the stream figure (rank 0, one plain model) is one forward pass over the whole file
    assert set(one["text_scoring"]) == {"bits/byte", "stream bits/byte"}
    assert close(t1["stream bits/byte"], t2["stream bits/byte"])
    assert close(t1["stream bits/byte"], whole_text_bits_per_byte(pp2_dp2_run, text), rel=1e-4)
    # the split's documents as streams (rank 0's plain model): there, and the same in either layout
    assert close(one["test/stream bits/byte"], two["test/stream bits/byte"])
    final = json.loads((pp2_dp2_run / "final_metrics.json").read_text())
    same_numbers(one, final, TEST_KEYS)  # what the training engine computed at the end of the run
    assert one["test/tokens"] == final["test/tokens"]


@pytest.mark.slow
def test_reference_checkpoint_one_process_vs_data_parallel_and_export(reference_run, prepared_dir, tmp_path):
    from app.export import main as export_main

    run_dir, _ = reference_run
    step6 = run_dir / "checkpoints" / "step_00000006"
    # <run>/best: the lowest recorded validation loss, the final save's in this run
    one = evaluate_cli(run_dir / "best", tmp_path / "p1.json", "--data", str(prepared_dir))
    assert one["checkpoint"].endswith("step_00000008"), one["checkpoint"]
    final = json.loads((run_dir / "final_metrics.json").read_text())
    same_numbers(one, final, TEST_KEYS)
    # P = 1 x DP = 2 under the launcher, on the older checkpoint, validation split
    dp2 = evaluate_cli(
        step6, tmp_path / "dp2.json", "--data", str(prepared_dir), "--split", "validation", nprocs=2
    )
    assert dp2["evaluated_layout"]["data_parallel"] == 2 and dp2["step"] == 6
    # the exported older checkpoint, one plain process, gives the same validation numbers
    assert export_main(["--checkpoint", str(step6), "--out", str(tmp_path / "exp")]) == 0
    exp = evaluate_cli(
        tmp_path / "exp", tmp_path / "e.json", "--data", str(prepared_dir), "--split", "validation"
    )
    same_numbers(dp2, exp, ("validation/loss", "validation/bpb"))
    assert exp["kind"] == "export" and exp["step"] == 6


@pytest.mark.cluster  # a run stopped by the wall clock (--time-budget): how far it gets is the machine's
@pytest.mark.slow
def test_zero3_checkpoint_is_consolidated_safely(prepared_dir, tmp_path):
    """ZeRO-3 partitions every weight over the ranks; the consolidation must give the trained model.
    The run is time-budgeted (--time-budget) with a given warmup and no --eval-every: its validation points
    are decided on rank 0's clock after the first steps and followed by both ranks (a rank on another
    schedule would wait in a collective the other never starts), and it stops on rank 0's clock with its
    final save and evaluation."""
    from launcher import CPU_CONFIG, metrics, train
    from run_files import samples, samples_from_checkpoint
    from test_export import exported_equals_checkpoint

    from app.checkpoints.loader import open_source

    cfg = json.loads((ROOT / "ds_configs" / "cpu_zero2.json").read_text())
    cfg["zero_optimization"] = {"stage": 3, "overlap_comm": False, "contiguous_gradients": False}
    ds = tmp_path / "zero3.json"
    ds.write_text(json.dumps(cfg))
    assert ds != CPU_CONFIG
    out = tmp_path / "z3"
    p = train(2, prepared_dir, out, "--time-budget", "0.15", "--wandb-mode", "disabled", stages=1, config=ds)
    final = json.loads((out / "final_metrics.json").read_text())
    assert final["stopped_by"] == "time" and final["time_budget_s"] == 9.0 and final["step"] >= 3, final
    assert "time budget: stopping after step" in p.stderr
    latest = (out / "checkpoints" / "latest").read_text()
    assert latest == f"step_{final['step']:08d}", "the run must end with a save of its last step"
    state = json.loads((out / "checkpoints" / latest / "app_state.json").read_text())
    assert 0 < state["train_seconds"] <= final["train_seconds"] and 0 <= state["decay_from"] < 1, state
    records = metrics(out)
    lrs = [m["train/lr"] for m in records if "train/lr" in m]
    peak = cfg["optimizer"]["params"]["lr"]
    assert lrs[:2] == pytest.approx([peak / 2, peak]), "the warmup counts steps"
    assert all(a >= b for a, b in itertools.pairwise(lrs[1:])) and lrs[-1] < 0.5 * peak, lrs
    assert state["schedule"]["eval_every"] > 0, state["schedule"]
    validated = [m["step"] for m in records if "val/loss" in m]
    every = state["schedule"]["eval_every"]
    assert len(validated) >= 2 and all(v % every == 0 for v in validated), (validated, state["schedule"])
    src = open_source(out)
    assert src.zero_stage == 3 and not any(src.path.glob("layer_*"))
    one = evaluate_cli(out, tmp_path / "z3.json", "--data", str(prepared_dir))
    same_numbers(one, json.loads((out / "final_metrics.json").read_text()), TEST_KEYS)
    exported_equals_checkpoint(out, tmp_path / "exp")
    # taken at each validation from the weights ZeRO-3 gathered for them; the last step's periodic validation
    # (its first batches) and the final one (the whole split) both took theirs
    got = samples(out)
    assert sorted(got) == sorted(set(validated)), sorted(got)
    assert all(len(rows) == 4 for step, rows in got.items() if step != final["step"]), got.keys()
    assert [r["text"] for r in got[final["step"]][-4:]] == samples_from_checkpoint(out, 4)


@pytest.mark.slow
def test_generate_from_pipeline_checkpoints_is_deterministic(reference_run, pp2_dp2_run, capsys):
    from app.generate import main as generate_main

    outs = []
    for run_dir in (reference_run[0], pp2_dp2_run, reference_run[0]):
        assert generate_main(["--checkpoint", str(run_dir), "--prompt", "def ", "--seed", "5",
                              "--max-new-tokens", "20"]) == 0  # fmt: skip
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[2] and all(o.startswith("def ") for o in outs)


@pytest.mark.slow
def test_long_passes_say_how_far_they_are_and_a_split_gets_its_compressors(
    reference_run, prepared_dir, tmp_path
):
    """A plain `python app/evaluate.py` whose log is a pipe: each pass (the split, the text, its stream,
    each dynamic learner) says how far it is at every heartbeat (0.05 s here, 20 s by default), so the log's
    lines are never further apart than that while it works; and the split's row has gzip/bzip2/xz on the
    split's own text, whose size is the bytes its bits/byte counts. The heartbeat is far shorter than any
    pass takes, so the count of lines does not depend on the machine's speed (at 1 s, a fast machine
    finished before the third)."""
    import re
    from datetime import datetime

    text = tmp_path / "play.txt"
    text.write_bytes((ROOT / "bench" / "corpora" / "tinyshakespeare.txt").read_bytes()[:8_000])
    out = tmp_path / "e.json"
    args = ["--checkpoint", str(reference_run[0]), "--out", str(out), "--data", str(prepared_dir),
            "--split", "validation", "--text", str(text), "--dynamic"]  # fmt: skip
    p = run([sys.executable, "app/evaluate.py", *args], {"MLSTM_HEARTBEAT_S": "0.05"})
    assert p.returncode == 0, p.stderr[-3000:]
    said = [ln for ln in p.stderr.splitlines() if re.search(r" INFO (dynamic|stream) .*: \d+/\d+ tokens", ln)]
    assert any(f" INFO dynamic {text}: " in ln for ln in said), p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if ln[:2] == "20"]
    times = [datetime.strptime(ln[:19], "%Y-%m-%d %H:%M:%S") for ln in lines[lines.index(said[0]) :]]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert len(said) >= 3 and max(gaps) <= 6, (gaps, lines)  # 1 s timestamps, a loaded 2-core machine
    result = json.loads(out.read_text())
    meta = json.loads((prepared_dir / "meta.json").read_text())
    assert (
        result["validation/bytes"] == meta["splits"]["validation"]["bytes"]
        and 0 < result["validation/gzip -9"] < 8
    ), result
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith("validation split"))
    assert f"{result['validation/xz -9']:.4f}" in row and " - " not in f" {row} ", row
