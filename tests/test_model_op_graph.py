"""app/model/op_graph.py: the GPU core's whole op replayed as CUDA graphs, where the tuner measured that it pays.

Without a GPU: where the graphs may run and why not, the eager first call, a capture that fails (this machine
has no CUDA: a real failure) and the eager run that replaces it, the size rule, the memory count; in Triton's
interpreter (a process of its own, `long`): the tuner's record, a cached ranking's check, the check of a
graph's replay against an op whose replay is wrong, the byte count against the op's own tensors.
With a GPU (`gpu` marker): the op through its graphs against the op without them, layers of one shape
interleaved as training runs them, two lengths, every loop; and the tuner's two times side by side.
"""

from __future__ import annotations

import logging

import pytest
import torch
from test_model_triton_core import LOOPS, _check, _cuda_case, forced_loop  # noqa: F401 (a fixture)

from app.common.errors import UserError
from app.model import first_call, gpu_ranking, gpu_tuning, op_graph, triton_core
from app.model.config import ModelConfig
from app.parallel.layout import Layout

CUDA = torch.device("cuda", 0)  # a device object only: nothing is allocated on it without a GPU


@pytest.fixture(autouse=True)
def no_graphs_kept():
    op_graph.clear()
    yield
    op_graph.clear()


def _choice(graph: bool = True) -> gpu_ranking.Choice:
    loop = gpu_tuning.candidates_for(16, 20, torch.float32, 3, 1 << 40)[0]
    return gpu_ranking.Choice([loop], [loop], op_graph=graph)


def test_where_the_graphs_run_and_why_not(monkeypatch):
    for name in ("MLSTM_OP_GRAPH", "MLSTM_CUDA_GRAPHS", "MLSTM_WGRAD_OVERLAP", "MLSTM_BARRIER_HOST_WAIT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert op_graph.mode() == "auto" and op_graph.why_not(CUDA) is None
    assert op_graph.why_not("cpu") == "CUDA graphs run on CUDA devices, not cpu"
    for env, why in (
        ({"MLSTM_OP_GRAPH": "0"}, "MLSTM_OP_GRAPH=0"),
        ({"MLSTM_CUDA_GRAPHS": "0"}, "MLSTM_CUDA_GRAPHS=0"),
        ({"TRITON_INTERPRET": "1"}, "Triton's interpreter has no CUDA graphs"),
        ({"MLSTM_WGRAD_OVERLAP": "4"}, "the weight gradients overlap the loop on a side stream"),
        ({"MLSTM_BARRIER_HOST_WAIT": "1"}, "MLSTM_BARRIER_HOST_WAIT=1 waits on the host"),
    ):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            assert why in triton_core._graph_why_not(_choice(), CUDA), env
            assert not triton_core._graphed(_choice(), torch.zeros(1, device="meta").expand(0))
    overlapped = _choice()
    overlapped.wgrad_chunks = 4  # the tuner chose the overlap for the shape: a side stream, no graph
    assert "the weight gradients overlap the loop" in triton_core._graph_why_not(overlapped, CUDA)
    monkeypatch.setenv("MLSTM_OP_GRAPH", "yes")
    with pytest.raises(UserError, match="MLSTM_OP_GRAPH must be one of auto, 0, 1 or unset, got 'yes'"):
        op_graph.mode()


def test_a_shapes_first_call_runs_eagerly_and_a_capture_that_fails_runs_eagerly_in_one_line(
    caplog, monkeypatch
):
    """The second call of a shape captures: on this machine (no CUDA) the capture really fails; the call's
    work is done eagerly, the shape runs without graphs from then on, one warning line; the tuner's timing
    (`strict`) gets the failure instead."""
    a, b = torch.arange(6.0).view(2, 3), torch.full((3,), 2.0)
    fn = lambda x, y: (x + y, x * y)  # noqa: E731
    choice = _choice()
    # caplog's handler on the logger itself, which stops there (the app's logging may keep records from the root)
    monkeypatch.setattr(logging.getLogger("app.model.triton_core"), "propagate", False)
    logging.getLogger("app.model.triton_core").addHandler(caplog.handler)
    try:
        with caplog.at_level("WARNING", logger="app.model.triton_core"):
            first = triton_core._through_graph(choice, ("fwd",), fn, [a, b], strict=False)
            assert choice.op_graph and not caplog.records  # eagerly, as every shape's first call
            second = triton_core._through_graph(choice, ("fwd",), fn, [a, b], strict=False)
    finally:
        logging.getLogger("app.model.triton_core").removeHandler(caplog.handler)
    for got in (first, second):
        assert all(torch.equal(g, w) for g, w in zip(got, fn(a, b)))
    assert choice.op_graph is False and op_graph.graphs_held() == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("the mLSTM GPU core's whole-op CUDA graph failed (") and "runs without it" in line
    strict = _choice()
    triton_core._through_graph(strict, ("fwd",), fn, [a, b], strict=True)
    with pytest.raises(op_graph.GraphFailed):
        triton_core._through_graph(strict, ("fwd",), fn, [a, b], strict=True)


def test_a_call_too_large_for_the_graphs_is_never_captured(monkeypatch):
    """A call whose tensors take more than half of MAX_BYTES runs eagerly every time (no capture tried: here
    one would fail); a smaller shape of the same function is captured on its second call."""
    a = torch.ones(64, 64)  # 16 KiB in, 16 KiB out
    monkeypatch.setattr(op_graph, "MAX_BYTES", 32 << 10)
    fn = lambda x: (x * 2,)  # noqa: E731
    for _ in range(3):
        (out,) = op_graph.call(0, ("t",), fn, [a])
        assert torch.equal(out, a * 2)
    assert op_graph.too_large(16 << 10) is None
    assert op_graph.too_large(32 << 10).startswith("a call's tensors (0.03 MiB) exceed half of the graphs' ")
    small = torch.ones(8, 8)
    op_graph.call(0, ("t",), fn, [small])
    with pytest.raises(op_graph.GraphFailed):  # the second call of a small shape captures (no CUDA here)
        op_graph.call(0, ("t",), fn, [small])


def test_forgetting_an_owners_graphs_leaves_the_others():
    """A tuner's trial forgets its own graphs, not training's: its next call is a first call again (eager),
    another owner's next call captures (here, with no CUDA, a capture that fails)."""
    a = torch.ones(4, 4)
    fn = lambda x: (x + 1,)  # noqa: E731
    for owner in (1, 2):
        op_graph.call(owner, ("t",), fn, [a])
    op_graph.forget(1)
    (out,) = op_graph.call(1, ("t",), fn, [a])
    assert torch.equal(out, a + 1)
    with pytest.raises(op_graph.GraphFailed):
        op_graph.call(2, ("t",), fn, [a])


def test_the_tuner_does_not_time_graphs_too_large_to_run(monkeypatch):
    """At B128 H4096 bf16 a graph call at the timed length takes GBs: `path/graph` says so, nothing is run (the
    overlap left to MLSTM_WGRAD_OVERLAP=0 here), the op runs plain."""
    monkeypatch.setenv("MLSTM_WGRAD_OVERLAP", "0")
    choice = _choice(graph=None)
    ran = []
    gpu_ranking.rank_paths(choice, 128, 4096, 4096, torch.bfloat16, CUDA, lambda *a: ran.append(a))
    assert ran == [] and choice.op_graph is False and choice.wgrad_chunks == 0
    assert set(choice.times) == {"path/graph"} and choice.times["path/graph"].startswith("a call's tensors (")
    why = choice.times["path/graph"]
    assert gpu_ranking.path_words(choice) == f"; the whole op as CUDA graphs: not run ({why}): plain runs"


def test_the_paths_are_said_with_their_times_and_which_runs():
    choice = _choice(graph=False)
    assert gpu_ranking.path_words(choice) == ""  # not compared (a forward-only ranking, a forced loop)
    choice.times.update({"path/graph": 1.5, "path/overlap": 2.5, "path/plain": 2.0})
    choice.op_graph = True
    assert gpu_ranking.path_words(choice) == (
        "; the whole op as CUDA graphs 1.5, weight gradients overlapped 2.5, plain 2.0: as CUDA graphs runs"
    )
    choice.op_graph, choice.wgrad_chunks = False, 4
    assert gpu_ranking.path_words(choice).endswith(": weight gradients overlapped runs")


def test_a_path_the_environment_set_is_not_cached_as_the_shapes(tmp_path, monkeypatch):
    """MLSTM_OP_GRAPH=0|1, MLSTM_CUDA_GRAPHS=0 or MLSTM_WGRAD_OVERLAP=N decide the path for every shape: the
    disk cache then stores the ranking's path as not compared (a later run measures its own)."""
    from app.model import gpu_choice_cache

    pytest.importorskip("triton")  # the cache's key names the Triton release
    monkeypatch.setenv("MLSTM_CACHE_DIR", str(tmp_path))
    for name in ("MLSTM_OP_GRAPH", "MLSTM_CUDA_GRAPHS", "MLSTM_WGRAD_OVERLAP"):
        monkeypatch.delenv(name, raising=False)
    choice = _choice(graph=True)
    choice.wgrad_chunks = 0

    def stored() -> tuple:
        gpu_tuning._store(16, 20, torch.float32, "cpu", choice)
        entry = gpu_choice_cache.load(16, 20, torch.float32, "cpu", gpu_tuning._code_files())
        return entry["op_graph"], entry["wgrad_chunks"]

    assert not gpu_ranking.paths_set() and stored() == (True, 0)
    for env in ({"MLSTM_OP_GRAPH": "1"}, {"MLSTM_OP_GRAPH": "0"}, {"MLSTM_CUDA_GRAPHS": "0"},
                {"MLSTM_WGRAD_OVERLAP": "4"}):  # fmt: skip
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            assert gpu_ranking.paths_set() and stored() == (None, None), env


def test_the_memory_estimates_count_the_paths_where_they_may_run(monkeypatch):
    from app.training import bounds

    for name in ("MLSTM_OP_GRAPH", "TRITON_INTERPRET", "MLSTM_CUDA_GRAPHS", "MLSTM_WGRAD_OVERLAP"):
        monkeypatch.delenv(name, raising=False)
    cfg = ModelConfig(vocab_size=256, embed_dim=64, hidden_dim=256, num_layers=2)
    call = op_graph.call_bytes(4096, 256, 256, 2)
    overlap = first_call.overlap_bytes(256, 256, 2)
    assert overlap == (5 * 256 * 256 * 2 + 4 * 256) * 4  # float32 accumulators of every weight gradient
    paths = first_call.op_paths_bytes(cfg, 4096, CUDA, 2)
    assert paths == min(op_graph.MAX_BYTES, 4 * call) + 2 * call + overlap
    big = ModelConfig(vocab_size=256, embed_dim=4096, hidden_dim=4096, num_layers=2)
    assert first_call.op_paths_bytes(
        big, 32768, CUDA, 2
    ) == 2 * op_graph.MAX_BYTES + first_call.overlap_bytes(4096, 4096, 2)  # the graphs' cap
    assert first_call.op_paths_bytes(cfg, 4096, "cpu", 2) == 0
    python = ModelConfig(**{**cfg.to_dict(), "core": "python"})
    assert first_call.op_paths_bytes(python, 4096, CUDA, 2) == 0
    layout = Layout(world_size=1, stages=1, data_parallel=1, micro_batch=16, grad_accum=1, zero_stage=1,
                    precision="bf16")  # fmt: skip
    monkeypatch.setattr(bounds, "first_call_bytes", lambda *a, **k: 0)  # the tuner's: its own tests
    with_paths = bounds.process_bytes(cfg, layout, 4096, CUDA)
    monkeypatch.setenv("MLSTM_OP_GRAPH", "0")
    assert first_call.op_paths_bytes(cfg, 4096, CUDA, 2) == overlap
    monkeypatch.setenv("MLSTM_WGRAD_OVERLAP", "0")
    assert first_call.op_paths_bytes(cfg, 4096, CUDA, 2) == 0
    assert with_paths - bounds.process_bytes(cfg, layout, 4096, CUDA) == paths


# ---- in Triton's interpreter (no graphs there)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("op_graph")
    return _check("op_graph", tmp, TRITON_INTERPRET="1", MLSTM_MATMUL="mm", MLSTM_CACHE_DIR=str(tmp))


@pytest.mark.long  # an interpreter process (tens of seconds of a core): the op's checks run on a GPU in `gpu`
def test_the_tuner_says_why_no_graph_runs_and_times_the_overlap_in_the_interpreter(interpreted):
    """The graphs: not run, why; the overlapped weight gradients: checked against float64 on their path, timed
    beside the plain op, the faster chosen; the ranking line's end says it all."""
    graph, chunks, t, words = interpreted["tuned"]
    why = "Unavailable: Triton's interpreter has no CUDA graphs"
    assert graph is False and t["path/graph"] == why, t
    assert isinstance(t["path/overlap"], float) and isinstance(t["path/plain"], float), t
    overlap = t["path/overlap"] < t["path/plain"]
    assert chunks == (4 if overlap else 0), (chunks, t)
    runs = "weight gradients overlapped" if overlap else "plain"
    assert words == (f"; the whole op as CUDA graphs: not run ({why}), weight gradients overlapped "
                     f"{t['path/overlap']}, plain {t['path/plain']}: {runs} runs")  # fmt: skip


@pytest.mark.long
def test_the_check_of_a_graphs_replay_fails_a_stale_input_and_a_rewritten_output(interpreted):
    got = interpreted["check_op"]
    assert got["right"] is None, got
    assert got["stale"].startswith("h of call 3 differs from the float64 reference by "), got
    assert got["uncloned"].startswith("h of call 2 differs from the float64 reference by "), got


@pytest.mark.long
def test_a_cached_path_is_checked_before_it_runs(interpreted):
    """Graphs where this run has none (the interpreter; MLSTM_OP_GRAPH=0 alike): left out, nothing said; the
    overlap: it passes its check, it runs; an overlap that sums a gradient wrong: one line, the op runs plain;
    an entry from before the paths, or with a foreign chunk count: timed afresh; one without the shape's own
    path: the paths measured at the hit and stored."""
    hits = interpreted["cache_hit"]
    assert hits["graph"] == [False, None, []] and hits["overlap"] == [False, 4, []]
    graph, chunks, (line,) = hits["overlap_wrong"]
    assert (graph, chunks) == (False, 0)
    assert line.startswith("the cached mLSTM GPU op's path (weight gradients overlapped, B16 H20) fails its check "
                           "here (d(w_m) of call 2 differs from the float64 reference by ")  # fmt: skip
    assert line.endswith("): the op runs plain"), line
    assert interpreted["cache_old"] == [True, True]
    assert interpreted["cache_unranked"] == [["path/graph", "path/overlap", "path/plain"], False, True]


@pytest.mark.long
def test_the_byte_count_is_the_ops_own_tensors(interpreted):
    """op_graph.call_bytes (the larger way, the backward) against the bytes of the op's inputs and outputs each
    way, counted on its real tensors: the backward's within 5% (its state's T+1 rows, one short at T = 4 steps:
    1.3% here), the forward below it."""
    for dt, ((fwd, bwd), count) in interpreted["bytes"].items():
        assert fwd < bwd and 0.95 <= count / bwd <= 1.05, (dt, fwd, bwd, count)


# ---- on a CUDA device


def _op(fn, x, ws, dy, dtype, graph: bool) -> tuple:
    """(y, the leaves) of `fn` on the case's leaves in `dtype` (their rounding the same for every fn), the shape's
    op through its graphs or not."""
    from app.model.mlstm_core import state_dtype

    leaves = [x.to(dtype)] + [w.to(state_dtype(dtype) if i == 1 else dtype) for i, w in enumerate(ws)]
    if fn is not triton_core.TritonMLSTMFunction:  # the float64 reference on the same rounded operands
        leaves = [t.double() for t in leaves]
    leaves = [t.clone().requires_grad_() for t in leaves]
    if fn is triton_core.TritonMLSTMFunction:
        gpu_tuning.loops_for(leaves[0], leaves[3], True, triton_core.run_op).op_graph = graph
    return fn.apply(*leaves), leaves


def _outputs(y, leaves) -> list[torch.Tensor]:
    return [t.double() for t in (y.detach(), *(t.grad for t in leaves))]


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("loop", LOOPS)
def test_cuda_op_graph_replay_is_as_close_to_float64_as_the_op_without_it(loop, forced_loop):  # noqa: F811
    """Two layers of one shape, interleaved as training runs them (forward A, forward B, backward B, backward
    A), three steps on fresh inputs (eager, captured, replayed), at two lengths: every output and gradient
    within twice the error of the op without graphs against the float64 reference core (a stale input or an
    output a later replay rewrote is off by its whole size)."""
    from app.model.mlstm_core import MLSTMFunction

    forced_loop(loop)
    dt = torch.bfloat16
    for T in (12, 7):
        cases = [_cuda_case(8, T, 64, 128, dt, seed=s) for s in (1, 2)]
        want, eager = [], []
        for x, ws, dy in cases:
            for fn, into in ((MLSTMFunction, want), (triton_core.TritonMLSTMFunction, eager)):
                y, leaves = _op(fn, x, ws, dy, dt, graph=False)
                (y.double() * dy.double()).sum().backward()
                into.append(_outputs(y, leaves))
        for _ in range(3):
            runs = [_op(triton_core.TritonMLSTMFunction, x, ws, dy, dt, graph=True) for x, ws, dy in cases]
            sum((y.float() * dy).sum() for (y, _), (_, _, dy) in zip(runs, cases)).backward()
            for (y, leaves), w, e in zip(runs, want, eager):
                for got, ref, base in zip(_outputs(y, leaves), w, e):
                    assert _error(got, ref) <= max(2 * _error(base, ref), 1e-6), (T, _error(got, ref))
        assert op_graph.graphs_held() >= 2


@pytest.mark.gpu
def test_cuda_op_graph_and_overlap_are_timed_beside_the_plain_op():
    gpu_tuning._choices.clear()
    choice = gpu_tuning._tune(16, 256, 256, torch.bfloat16, CUDA, True, triton_core.run_op)
    t = choice.times
    ms = {n: t[f"path/{n}"] for n in gpu_ranking.PATHS}
    assert all(isinstance(v, float) for v in ms.values()), t
    best = "graph" if op_graph.mode() == "1" else min(ms, key=ms.__getitem__)
    assert (choice.op_graph, bool(choice.wgrad_chunks)) == (best == "graph", best == "overlap"), t
