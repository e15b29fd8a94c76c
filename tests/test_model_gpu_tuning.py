"""app/model/gpu_tuning.py: which GPU loop runs, per shape, chosen by measurement; its tiles (gpu_tiles.py), its
batch buckets, the forced loop, (in Triton's interpreter, a wall clock for CUDA events) the timing itself, and
the runs that fall back when a loop fails: a grid barrier that times out, a loop that raises at launch, and a
cached ranking that is corrupt, foreign or wrong, each injected."""

import pytest
import torch
from test_model_triton_core import TIMED, _check

from app.common.errors import UserError
from app.model import gpu_tuning
from app.model.gpu_loops import StepLoop
from app.model.gpu_tiles import Tiles, split_tiles, tiles_for


@pytest.fixture(scope="module")
def tuning(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("tuning")
    return _check("tuning", tmp, TRITON_INTERPRET="1", MLSTM_MATMUL="mm", MLSTM_CACHE_DIR=str(tmp))


# `long`: a process of Triton's interpreter (tens of seconds of a core) for logic the gpu-marked tests run on a
# GPU and whose kernels' numbers tests/test_model_triton_core.py checks in the interpreter in the default run;
# what only they run is the tuner's ranking, timing and checking of every loop without a GPU
@pytest.mark.long
def test_the_tuner_times_every_loop_checks_them_and_compares_the_reference(tuning):
    """gpu_tuning's logic (in the interpreter, a wall clock for CUDA events): every loop checked against the
    float64 reference and timed each way in the whole op, none left out, each also timed alone beside the
    traffic model's time for its tiles (none for cuBLAS's), a loop that computes something else left out with
    why, the whole op against the reference core (the interpreter is slow: the reference wins), one log line;
    the op's paths compared: its CUDA graphs (why they do not run here), its weight gradients overlapped."""
    out = tuning
    ranked = {k: v for k, v in out["choice"].items() if k.startswith(("fwd/", "bwd/"))}
    # training's op paths, after the ranking: no CUDA graphs in the interpreter (said why); the overlapped
    # weight gradients checked against float64 and timed beside the plain op, the faster chosen
    t = out["choice"]
    assert out["paths"][0] is False
    assert t["path/graph"] == "Unavailable: Triton's interpreter has no CUDA graphs", t
    assert isinstance(t["path/overlap"], float) and isinstance(t["path/plain"], float), t
    assert out["paths"][1] == (4 if t["path/overlap"] < t["path/plain"] else 0), (out["paths"], t)
    assert set(ranked) == TIMED and all(isinstance(v, float) for v in ranked.values()), out["choice"]
    assert all(isinstance(out["choice"][f"loop/{k}"], float) for k in TIMED), out["choice"]
    modelled = {k for k in TIMED if not k.endswith("/cublas")}
    assert {k.removeprefix("model/") for k in out["choice"] if k.startswith("model/")} == modelled
    assert sorted(out["checked"]) == sorted([k.split("/")[1], k.startswith("fwd")] for k in TIMED)
    assert out["wrong"]["ranked"] == ["cublas"], out["wrong"]
    assert "hs differs from the float64 reference" in out["wrong"]["times"]["fwd/wrong-negated"], out["wrong"]
    assert out["python"] == ["measured faster than the Triton core at this shape"] * 2 and out["logged"] == 1


@pytest.mark.long
def test_the_ranking_is_logged_with_each_loops_tiles_and_three_times(tuning):
    """One line: each loop with its tiles (the l2 candidate's split phases: ways and sum tiles) and its ms for
    T_TUNE steps in the whole op, alone and by the traffic model."""
    (line,) = tuning["ranked_line"]
    ms = tuning["choice"]
    runs = "weight gradients overlapped" if tuning["paths"][1] else "plain"
    assert line.endswith(
        "; the whole op as CUDA graphs: not run (Unavailable: Triton's interpreter has no CUDA graphs), weight "
        f"gradients overlapped {ms['path/overlap']}, plain {ms['path/plain']}: {runs} runs"
    ), line
    assert line.startswith(
        "ranked the mLSTM core's GPU loops for B16 H20 float32 (ms for T=3: whole op / loop"
    )
    assert "fwd/persistent-l2 [r 16x16/2+8x16 g 4x8x16] " in line, line
    assert "bwd/persistent-l2 [dh 16x16/3+8x16 dm 16x16/2+8x16] " in line, line
    assert "bwd/persistent [dh 16x16 dm 8x16] " in line and "fwd/cublas [r 16x16 g 4x4x16] " in line, line
    ms = tuning["choice"]
    assert (
        f"fwd/step [r 16x16 g 4x4x16] {ms['fwd/step']}/{ms['loop/fwd/step']}/{ms['model/fwd/step']}" in line
    )


@pytest.mark.long
def test_the_ranking_is_by_the_whole_op_not_each_loop_alone(tuning):
    """An op that costs 2 s more whenever the step loop runs a direction in it ranks the step loop last both
    ways, though alone it is as quick as the others; every forward timed behind cuBLAS's backward (the first in
    the fallback order), every backward behind the fastest forward."""
    r = tuning["op_order"]
    assert r["fwd"][-1] == "step" and r["bwd"][-1] == "step", r
    t = r["times"]
    assert t["fwd/step"] > 2000 > t["loop/fwd/step"] and t["bwd/step"] > 2000 > t["loop/bwd/step"], t
    assert max(v for k, v in t.items() if k.startswith(("fwd/", "bwd/")) and "step" not in k) < 2000, t
    assert r["pairs"][:3] == [["cublas", "cublas"], ["step", "cublas"], ["persistent", "cublas"]], r["pairs"]
    assert r["pairs"][3:] == [[r["fwd"][0], "step"], [r["fwd"][0], "persistent"]], r["pairs"]


# the tests of `faults` (one interpreter process, each fault injected) are `long`: what only they run is each
# fallback (a barrier that times out, a loop that cannot launch, a corrupt, foreign or wrong cached ranking)
# without a GPU; tests/test_model_triton_core.py's cuda tests run the barrier's on a GPU
@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("faults")
    return _check("faults", tmp, TRITON_INTERPRET="1", MLSTM_MATMUL="mm", MLSTM_CACHE_DIR=str(tmp / "cache"))


@pytest.mark.long
@pytest.mark.parametrize(
    "case, failed", [("barrier_timeout_fwd", "forward"), ("barrier_timeout_bwd", "backward")]
)
def test_a_barrier_that_gives_up_poisons_its_outputs_and_its_flag_drops_the_loop(faults, case, failed):
    """The persistent loop's forward (or backward) launch finds its barrier flag set and nothing waits for it:
    that direction's outputs are NaN (the forward's: y and every gradient; the backward's: every gradient, y
    right), nothing is said at the launch; the flags read afterwards (where the host waits anyway) drop the
    loop in one line naming it, and the next run, on the cublas loop, is right."""
    r = faults[case]
    nan = [e != e for e in r["each"]]
    assert nan == ([True] * 6 if failed == "forward" else [False] + [True] * 5), r["each"]
    assert not r["warnings"], r["warnings"]
    assert len(r["health"]) == 1 and f"GPU {failed} loop persistent at B5 H20 on cpu" in r["health"][0], r
    assert (
        "grid barrier gave up" in r["health"][0] and "the cublas loop runs it from now on" in r["health"][0]
    )
    assert (r["fwd" if failed == "forward" else "bwd"])[0] == "cublas", r  # the failed loop left the ranking
    assert isinstance(r["again"], float) and r["again"] < 1e-12, r


@pytest.mark.long  # an interpreter run of minutes on 2 cores: `--all`
@pytest.mark.parametrize(
    "case, failed", [("wait_barrier_timeout_fwd", "forward"), ("wait_barrier_timeout_bwd", "backward")]
)
def test_with_the_old_host_wait_a_barrier_that_times_out_is_redone_at_once(faults, case, failed):
    """MLSTM_BARRIER_HOST_WAIT=1 (the A/B switch): the flag is read after the launch, the op redoes that
    direction with the next loop (checked first), says so once, and the user gets the right outputs and
    gradients."""
    r = faults[case]
    assert isinstance(r["errors"], float) and r["errors"] < 1e-12, r
    assert len(r["warnings"]) == 1 and not r["health"], r
    assert f"GPU {failed} loop persistent failed" in r["warnings"][0], r["warnings"]
    assert (
        "grid barrier timed out" in r["warnings"][0] and "redoing it with the cublas loop" in r["warnings"][0]
    )
    assert (r["fwd" if failed == "forward" else "bwd"])[0] == "cublas", r  # the failed loop left the ranking
    assert ["cublas", failed == "forward"] in r["checked"], r["checked"]  # the fallback was checked first


@pytest.mark.long
def test_a_forced_loop_that_cannot_launch_falls_back(faults):
    r = faults["launch_error"]
    assert isinstance(r["errors"], float) and r["errors"] < 1e-12, r
    assert len(r["warnings"]) == 1 and "forward loop step failed" in r["warnings"][0], r["warnings"]
    assert "could not launch" in r["warnings"][0] and r["fwd"][0] == "cublas", r


@pytest.mark.long
def test_a_forced_loop_and_each_fallback_are_checked_before_they_run(faults):
    """MLSTM_GPU_LOOP=step where the step loop is wrong, and so is cuBLAS's, the first it falls back to: each is
    caught by its float64 check before its first run (one line each), and the user gets the third loop's right
    outputs and gradients; no wrong loop is left in the ranking."""
    r = faults["forced_wrong"]
    assert isinstance(r["errors"], float) and r["errors"] < 1e-12, r
    assert len(r["warnings"]) == 2, r["warnings"]
    for w, loop, nxt in zip(r["warnings"], ("step", "cublas"), ("cublas", "persistent")):
        assert f"forward loop {loop} failed" in w and "its float64 check: hs differs" in w, w
        assert w.endswith(f"redoing it with the {nxt} loop"), w
    assert r["fwd"][0] == "persistent" and not {"step", "cublas"} & set(r["fwd"]), r
    assert ["persistent", True] in r["checked"], r["checked"]


@pytest.mark.long
def test_a_cache_hit_checks_every_loop_it_may_fall_back_to(faults):
    """A ranking on disk whose first loop is right here and whose second (cuBLAS's) is wrong: at the hit every
    loop of both rankings is checked, the wrong fallback is dropped in one line, and nothing is timed afresh."""
    r = faults["cache_fallback_wrong"]
    assert isinstance(r["errors"], float) and r["errors"] < 1e-12, r
    assert len(r["warnings"]) == 1 and "the cached mLSTM GPU loop cublas" in r["warnings"][0], r["warnings"]
    assert r["warnings"][0].endswith("dropped from the ranking"), r["warnings"]
    assert r["times"] == {"cached": True} and r["fwd"] == ["persistent", "step"], r
    want = [["cublas", False], ["persistent", False], ["persistent", True], ["step", True]]
    assert sorted(r["checked"]) == want, r["checked"]


@pytest.mark.long
def test_when_every_loop_fails_the_error_says_so(faults):
    r = faults["every_loop_fails"]
    assert isinstance(r["errors"], str) and r["errors"].startswith("NoLoop: no GPU forward loop"), r
    # each loop is checked before its first run: the launch fails there
    assert "step: its float64 check: RuntimeError" in r["errors"], r
    assert "cublas: its float64 check: RuntimeError" in r["errors"], r
    assert r["warnings"][-1].endswith("no other loop is left"), r["warnings"]


@pytest.mark.long
@pytest.mark.parametrize("case", ["cache_corrupt", "cache_foreign"])
def test_a_corrupt_or_foreign_cache_entry_is_timed_afresh(faults, case):
    r = faults[case]
    assert isinstance(r["errors"], float) and r["errors"] < 1e-12, r
    assert "cached" not in r["times"] and set(r["times"]) >= TIMED - {"fwd/step"}, r["times"]


@pytest.mark.long
def test_a_cached_ranking_is_checked_before_it_is_trusted(faults):
    """A ranking on disk whose first loop is wrong here: the check of the cache hit says so in one line, the
    shape is timed afresh, and the tuner's own check leaves the wrong loop out; the ranking it then stores is
    read back, checked and used, untimed."""
    r = faults["cache_wrong"]
    assert isinstance(r["errors"], float) and r["errors"] < 1e-12, r
    assert len(r["warnings"]) == 1 and "the cached mLSTM GPU loop step" in r["warnings"][0], r["warnings"]
    assert "hs differs from the float64 reference" in r["times"]["fwd/step"] and "step" not in r["fwd"], r
    good = faults["cache_good"]
    assert good["times"] == {"cached": True} and good["fwd"] == r["fwd"] and not good["warnings"], good
    every = {(lp, True) for lp in good["fwd"]} | {(lp, False) for lp in good["bwd"]}
    assert {tuple(c) for c in good["checked"]} == every, good  # each loop of the hit, not its first alone
    assert [f for f in faults["cache_file"] if not f.startswith(".")] == ["gpu_loops.json"], faults[
        "cache_file"
    ]
    assert faults["cache_key"] == "triton interpreter"


def test_a_micro_batch_with_fewer_rows_shares_its_bucket():
    from app.model.gpu_tuning import _key, batch_bucket

    assert [batch_bucket(b) for b in (1, 16, 17, 64, 65, 256)] == [16, 16, 32, 64, 128, 256]
    w = torch.zeros(8, 8)
    assert _key(torch.zeros(3, 2, 4), w) == _key(torch.zeros(11, 2, 4), w) != _key(torch.zeros(17, 2, 4), w)


def test_tiles_give_every_sm_work_and_keep_large_layers_whole_batch():
    from app.model.gpu_tiles import split_tiles, tiles_for

    t = tiles_for(64, 1024, torch.bfloat16, sms=132, weights_in_l2=True)
    assert (t.n_r(64, 1024), t.n_g(64, 1024)) == (128, 128) and 4 * t.bu_g == 64, t  # one wave; M = 64
    big = tiles_for(128, 4096, torch.bfloat16, sms=132, weights_in_l2=False)
    assert big.bb_r == big.bb_g == 128, big  # weights streamed from HBM once per step, not per batch tile
    assert 4 * big.bu_g == 128 and big.n_g(128, 4096) == 128, (
        big
    )  # 4 x 32 gate rows: one wave, half the reads
    b256 = tiles_for(256, 4096, torch.bfloat16, sms=132, weights_in_l2=False)
    assert (b256.bb_m, b256.bu_m) == (128, 64), b256  # the backward's K = 4H phase: M = 64, not bu_g's 16
    split = split_tiles(big, 128, 4096, sms=132, dtype=torch.bfloat16)
    assert (split.bb_m, split.bu_m, split.split) == (128, 64, 2), split  # 64 tiles x 2 slices fill the SMs
    tiny = tiles_for(3, 20, torch.float32, sms=132, weights_in_l2=True)
    assert min(tiny.bb_r, tiny.bu_r, tiny.bb_g, 4 * tiny.bu_g, tiny.bk) >= 16, tiny  # tl.dot's minimum


def test_a_smaller_micro_batch_reuses_the_smallest_larger_bucket_timed(monkeypatch):
    """A length bucket's last micro-batch (100 rows in a B256 run) runs the choice its run already has, not a
    fresh timing and compile mid-run; a larger batch than any timed is timed."""
    monkeypatch.setattr(gpu_tuning, "_choices", {})
    t = Tiles(16, 16, 16, 4, 16)
    w = torch.zeros(8, 8)
    key = gpu_tuning._key(torch.zeros(256, 1, 4), w)
    big, mid = (gpu_tuning.Choice([StepLoop(t)], [StepLoop(t)], python=False) for _ in range(2))
    gpu_tuning._choices[(*key, None)] = big
    gpu_tuning._choices[(key[0], 64, *key[2:], None)] = mid
    assert gpu_tuning._reuse((*gpu_tuning._key(torch.zeros(100, 1, 4), w), None), backward=True) is big
    assert gpu_tuning._reuse((*gpu_tuning._key(torch.zeros(20, 1, 4), w), None), backward=True) is mid
    assert gpu_tuning._reuse((*gpu_tuning._key(torch.zeros(300, 1, 4), w), None), backward=True) is None
    fwd_only = gpu_tuning.Choice([StepLoop(t)], None)  # timed for inference only: not for a training step
    gpu_tuning._choices[(*key, None)] = fwd_only
    assert gpu_tuning._reuse((*gpu_tuning._key(torch.zeros(100, 1, 4), w), None), backward=True) is None
    assert gpu_tuning._reuse((*gpu_tuning._key(torch.zeros(100, 1, 4), w), None), backward=False) is fwd_only


def test_a_forced_loop_that_is_none_is_one_line_and_splitk_falls_back(monkeypatch):
    monkeypatch.setenv("MLSTM_GPU_LOOP", "fastest")
    with pytest.raises(
        UserError,
        match="MLSTM_GPU_LOOP must be one of step, cublas, persistent, splitk, persistent-l2, python",
    ):
        gpu_tuning.forced_loop()
    # B256 H4096 (the large preset at B256): 128 output tiles of the split phase on 132 SMs, so no split
    base = tiles_for(256, 4096, torch.bfloat16, sms=132, weights_in_l2=False)
    assert (
        split_tiles(base, 256, 4096, sms=132, dtype=torch.bfloat16).bwd() == base.bwd()
    )  # the persistent loop's own
    loops = [StepLoop(base)]
    persistent = gpu_tuning.PersistentLoop(base, 132)
    assert gpu_tuning.pick("splitk", [*loops, persistent]) is persistent
    assert gpu_tuning.pick("python", [*loops, persistent]) is loops[0]
