"""Shared fixtures: tiny prepared datasets (built once per session) for data-prep and trainer tests."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from app.parallel import lazy_dynamo
from data_prep.cli import main as prep_main


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

TINY_PREP_ARGS = ["--default-max-mb", "0.3", "--max-seq-len", "64", "--num-proc", "2", "--quiet"]


def _shared(tmp_path_factory, name: str, build: Callable[[Path], dict | None]) -> tuple[Path, dict | None]:
    """A session fixture built once for the whole run: under pytest-xdist each worker that needs it asks, the
    first builds it (under a lock in the run's common temp folder), the others wait and reuse the folder.
    `build(folder)` returns what its callers need besides the folder, kept as JSON. -> (folder, that)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        out = tmp_path_factory.mktemp("shared") / name
        return out, build(out)
    root = tmp_path_factory.getbasetemp().parent / "shared"
    root.mkdir(exist_ok=True)
    out, done = root / name, root / f"{name}.done.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or its holder dies)
        if not done.exists():  # a build that failed in another worker is tried again, and fails here too
            shutil.rmtree(out, ignore_errors=True)
            done.write_text(json.dumps({"result": build(out)}))
    return out, json.loads(done.read_text())["result"]


def _prepare(argv: list[str]) -> Callable[[Path], None]:
    def build(out: Path) -> None:
        assert prep_main(["--out", str(out), *argv, *TINY_PREP_ARGS]) == 0

    return build


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory) -> Path:
    """SentencePiece (vocab 384) on 0.3 MB of the embedded default corpus, max_seq_len 64."""
    return _shared(tmp_path_factory, "spm", _prepare(["--vocab-size", "384"]))[0]


@pytest.fixture(scope="session")
def prepared_byte_dir(tmp_path_factory) -> Path:
    """Byte tokenizer on the same corpus, max_seq_len 64."""
    return _shared(tmp_path_factory, "byte", _prepare(["--tokenizer", "byte"]))[0]


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test starts from the suite's environment: a run called in-process (`train.main`) sets MASTER_ADDR
    and MASTER_PORT for torch.distributed, and a later launch from the same worker must not inherit them
    (its one-process runs would bind the port the worker's own store still holds)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    lazy_dynamo.restore()  # an in-process fine-tuning or engine deferred TorchDynamo's import: not for the next test


@pytest.fixture(scope="session", autouse=True)
def _release_deepspeed_shm():
    yield
    from launcher import release_shm

    release_shm()


# ---- short real training runs (real deepspeed launcher, CPU, gloo), shared by trainer and eval tests

FAKE_WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"
REF_STEPS = "8"


@pytest.fixture(scope="session")
def reference_run(prepared_dir, tmp_path_factory):
    """P = 2 x DP = 1, grad_accum 4, 8 steps, W&B offline with a (fake) API key in the environment; plots,
    samples (4 per validation) and the final model artifact, as a user gets them.

    Launched as an installed user would, `deepspeed --module app.train`, with the progress bar left at its
    default (stderr is a pipe here: tests/test_train.py checks the log holds no bar).
    Returns (run_dir, CompletedProcess). Checkpoints kept: step 6 and step 8 (latest).
    """
    from launcher import train

    def build(out: Path) -> dict:
        p = train(
            2, prepared_dir, out, "--max-steps", REF_STEPS, "--save-every", "3", "--keep-last", "2",
            "--eval-every", "4", "--wandb-mode", "offline", "--plots", "true",
            extra_env={"WANDB_API_KEY": FAKE_WANDB_KEY},
            script="app.train", progress=True, runner=True,
        )  # fmt: skip
        return {
            "args": [str(a) for a in p.args],
            "returncode": p.returncode,
            "stdout": p.stdout,
            "stderr": p.stderr,
        }

    out, p = _shared(tmp_path_factory, "ref", build)
    return out, subprocess.CompletedProcess(**p)


@pytest.fixture(scope="session")
def pp2_dp2_run(prepared_dir, tmp_path_factory):
    """4 processes: P = 2 stages x DP = 2 ZeRO-1 replicas, grad_accum 2 (same global batches as reference_run).

    The accumulation comes from `--grad-accum 2` over the stock JSON (accum 4), named HF-style by
    `--deepspeed FILE`: the equal losses show the flag reached DeepSpeed."""
    from launcher import CPU_CONFIG, train

    def build(out: Path) -> None:
        train(
            4, prepared_dir, out, "--deepspeed", str(CPU_CONFIG), "--grad-accum", "2", "--max-steps", REF_STEPS,
            "--eval-every", "4", "--wandb-mode", "disabled", config=None,
        )  # fmt: skip

    return _shared(tmp_path_factory, "dp2", build)[0]


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


# ---- a real cluster on this machine (tests/cluster.py): sshd + pdsh on 127.0.0.1/127.0.0.2, and Slurm


def pytest_configure(config):
    config.addinivalue_line("markers", "multinode: real sshd/pdsh or Slurm launches (tests/cluster.py)")


# The files that take longest (seconds summed over their tests in a 2-worker run, rounded: `--durations`),
# run first: the suite runs in pytest-xdist workers one file at a time (launch/test.sh), and a long file
# dealt last would leave one worker running it alone while the other has nothing left.
HEAVY_FILES = {
    "test_lifecycle.py": 200, "test_evaluate.py": 155, "test_checkpoints_safety.py": 95, "test_train.py": 90,
    "test_multinode.py": 80, "test_checkpoints_warm_start.py": 75, "test_model_gpu_tuning.py": 75,
    "test_training_run_schedule.py": 70, "test_classify.py": 60, "test_model_triton_core.py": 55,
    "test_training_preemption.py": 45, "test_data_prep_hostile.py": 45, "test_training_carry_state.py": 40,
    "test_slurm.py": 35, "test_model_gpu_health.py": 80, "test_model_first_call.py": 30,
}  # fmt: skip


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected: the count is of the tests they left
def pytest_collection_modifyitems(config, items):
    """Heavy files first (HEAVY_FILES; the order within a file is kept). `long` tests are left out, and
    counted, unless MLSTM_TEST_ALL=1 (`launch/test.sh --all`), a -m expression names `long`, or a test is
    named by its node id. `gpu` tests need a CUDA device: skipped, with the reason shown, where torch sees
    none."""
    items.sort(key=lambda item: -HEAVY_FILES.get(item.path.name, 0))  # stable: the rest keep their order
    asked = "long" in (config.option.markexpr or "") or any("::" in a for a in config.args)
    if os.environ.get("MLSTM_TEST_ALL") != "1" and not asked:
        long = [item for item in items if item.get_closest_marker("long") is not None]
        if long:
            config.hook.pytest_deselected(items=long)
            items[:] = [item for item in items if item.get_closest_marker("long") is None]
        config.stash[_LONG_LEFT_OUT] = len(long)
        if hasattr(config, "workeroutput"):  # a pytest-xdist worker: its controller says it
            config.workeroutput["long_left_out"] = len(long)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


_LONG_LEFT_OUT = pytest.StashKey[int]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller, as a worker ends: how many `long` tests it left out (every worker collects
    every test)."""
    n = getattr(node, "workeroutput", {}).get("long_left_out")
    if n is not None:
        node.config.stash[_LONG_LEFT_OUT] = n


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Said at the end of every default run: how many `long` tests it left out, and how to run them."""
    n = config.stash.get(_LONG_LEFT_OUT, 0)
    if n:
        terminalreporter.write_line(f"{n} long test{'s' * (n != 1)} left out of this run (pyproject.toml's "
                                    "`long` marker): ./launch/test.sh --all runs every test")  # fmt: skip


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
