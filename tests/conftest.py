"""Shared fixtures: the named runs and prepared corpora (tests/runs.py), the environment each test starts
from, the fused core built up front, the test clusters; the tiers and the order (tests/tiers.py) and
`--timings` (tests/timings.py) are plugins loaded here."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
from launcher import SUITE_CACHE
from runs import FAKE_WANDB_KEY, REF_STEPS, TINY_PREP_ARGS, Runs

__all__ = ["FAKE_WANDB_KEY", "REF_STEPS", "TINY_PREP_ARGS"]  # what test files import from here
pytest_plugins = ["timings", "tiers"]  # `pytest --timings FILE`; the tiers and the order


os.environ.setdefault("MLSTM_CACHE_DIR", SUITE_CACHE)  # this process builds where its launches load from


def _cpu_for_launched_processes() -> None:
    """The suite's launches (deepspeed ranks, entry points) are CPU tests (gloo, 2 ranks on one machine): on a
    GPU machine they must not take the GPU. This process enumerates its CUDA devices first (the `gpu` tests run
    here, on the GPU), then every process it starts sees none, and DeepSpeed runs on the CPU accelerator."""
    # pytest-xdist's workers inherit this process's environment: each restores what the suite was started with
    given = os.environ.setdefault(
        "MLSTM_SUITE_CUDA_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    )
    if given == "<unset>":
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = given
    if torch.cuda.is_available():  # the CUDA runtime reads CUDA_VISIBLE_DEVICES once: now, with the GPUs seen
        torch.cuda.init()
        torch.cuda.device_count()  # torch caches the count once CUDA is initialised (else it re-reads the variable)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["DS_ACCELERATOR"] = "cpu"


_cpu_for_launched_processes()
# one id per session, which pytest-xdist's workers inherit: tests/runs.py checks a kept run once per session
os.environ.setdefault("MLSTM_SUITE_SESSION", f"{os.getpid()}-{time.time_ns()}")


def _one_thread_per_worker() -> None:
    """Under pytest-xdist the workers (one per core) already keep every core busy: each worker's own torch work
    takes one thread, as the launched ranks do (tests/launcher.py). A second OpenMP thread spins at every
    barrier while another process holds the core: a transfer-and-export test of 6 s alone took 74 s of a core
    in the suite, and 53 s of CPU against 14 s with one thread beside two busy loops (docs/development.md)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        torch.set_num_threads(1)
        # and every process a test starts (an entry point, data prep, Triton's interpreter): those not started
        # through tests/launcher.py took torch's default of one thread per core, and spun beside the workers
        os.environ["OMP_NUM_THREADS"] = "1"


_one_thread_per_worker()


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    """The named launched runs and prepared corpora of tests/runs.py, each built once (by the first
    pytest-xdist worker that asks, under a lock; the others wait and reuse it) and kept for the next
    session of the same tree (MLSTM_TEST_RUN_CACHE)."""
    session_dir = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        session_dir = session_dir.parent  # the run's common temp folder, above each worker's
    return Runs.for_session(session_dir)


@pytest.fixture(scope="session")
def prepared_dir(runs) -> Path:
    """SentencePiece (vocab 384) on 0.3 MB of the embedded default corpus, max_seq_len 64."""
    return runs.corpus("spm")


@pytest.fixture(scope="session")
def prepared_byte_dir(runs) -> Path:
    """Byte tokenizer on the same corpus, max_seq_len 64."""
    return runs.corpus("byte")


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test starts from the suite's environment: a run called in-process (`train.main`) sets MASTER_ADDR
    and MASTER_PORT for torch.distributed, and a later launch from the same worker must not inherit them
    (its one-process runs would bind the port the worker's own store still holds)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def _release_deepspeed_shm():
    yield
    from launcher import release_shm

    release_shm()


# ---- short real training runs (real deepspeed launcher, CPU, gloo), shared by trainer and eval tests


@pytest.fixture(scope="session")
def reference_run(runs) -> tuple[Path, subprocess.CompletedProcess]:
    """tests/runs.py's "ref": P = 2 x DP = 1, 8 steps, W&B offline, plots, `deepspeed --module app.train`.
    Returns (run_dir, CompletedProcess). Checkpoints kept: step 6 and step 8 (latest)."""
    run = runs.get("ref")
    return run.dir, run.proc


@pytest.fixture(scope="session")
def pp2_dp2_run(runs) -> Path:
    """tests/runs.py's "dp2": P = 2 stages x DP = 2 ZeRO-1 replicas, the same global batches as ref."""
    return runs.get("dp2").dir


@pytest.fixture(scope="session", autouse=True)
def fused_core_built() -> None:
    """Build the fused mLSTM core's C++ extension once, up front (tens of seconds on a fresh machine),
    so that no trainer subprocess pays for it inside its time-out. A failed build is the fallback's
    business (warned once); tests/test_model_fused_core.py fails on it."""
    from app.model.fused_core import fused_ops

    fused_ops()
    # DeepSpeed's CPU all-reduce op, JIT-built by the first rank that needs it: built once here instead,
    # the way every rank builds it (under our build lock, which clears a lock a killed build left)
    from app.parallel.runtime import prebuild_cpu_comm_op

    with contextlib.redirect_stdout(io.StringIO()):
        prebuild_cpu_comm_op()


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected: the counts are of the tests they left
def pytest_collection_modifyitems(config, items):
    """The longest files first, the `long` and `cluster` tiers left out of a default run and counted
    (tests/tiers.py). `gpu` tests need a CUDA device: skipped, with the reason shown, where torch sees
    none."""
    import tiers  # a plugin (pytest_plugins above): imported once pytest has, with its asserts rewritten

    tiers.leave_out_tiers(config, items)
    tiers.order(items, tiers.test_seconds())
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


# ---- a real cluster on this machine (tests/cluster.py): sshd + pdsh on 127.0.0.1/127.0.0.2, and Slurm


@pytest.fixture(scope="session")
def ssh_cluster(tmp_path_factory):
    from cluster import ClusterUnavailable, start_sshd

    try:
        cluster = start_sshd(tmp_path_factory.mktemp("sshd"))
    except ClusterUnavailable as e:
        print(f"\nmultinode: sshd/pdsh unavailable: {e}")
        pytest.skip(f"sshd/pdsh unavailable: {e}")
    yield cluster
    cluster.daemons.stop()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    from cluster import ClusterUnavailable, start_slurm

    try:
        cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    except ClusterUnavailable as e:
        print(f"\nmultinode: Slurm unavailable: {e}")
        pytest.skip(f"Slurm unavailable: {e}")
    yield cluster
    cluster.daemons.stop()
