"""app.parallel.runtime: process set-up."""

import torch

from app.parallel.runtime import seed_everything


def test_deterministic_mode_does_not_fill_uninitialized_memory():
    # DeepSpeed's ZeRO allocates a 2 GB reduce bucket with torch.empty on every micro-batch; NaN-filling
    # it under deterministic mode cost 17% of a step (and more with two ranks sharing memory bandwidth).
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    try:
        seed_everything(0, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is False
        a = torch.rand(3)
        seed_everything(0, deterministic=True)
        assert torch.equal(a, torch.rand(3))
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.utils.deterministic.fill_uninitialized_memory = before[1]


def test_deterministic_defaults_on_for_cpu_and_off_on_cuda():
    from app.parallel.runtime import deterministic_default

    assert deterministic_default(None) is (not torch.cuda.is_available())
    assert (deterministic_default(True), deterministic_default(False)) == (True, False)


def test_a_lock_left_by_a_killed_comm_op_build_does_not_hang_the_next_launch(tmp_path):
    """A first launch killed while DeepSpeed JIT-built its CPU comm op leaves torch's `lock` file in the op's
    build folder. Before the op was built under our build lock, every later launch waited on it for ever in
    `deepspeed.init_distributed` (a CI run sat out its 90 minutes on one). Now the process set-up removes it,
    says so, and starts."""
    import os
    import shutil
    import subprocess
    import sys

    from launcher import ROOT

    from app.common.toolchain import build_directory, cache_dir, extensions_root

    built = build_directory("deepspeed_shm_comm")  # by the session fixture (tests/conftest.py)
    root = tmp_path / "cache" / extensions_root().relative_to(cache_dir())  # our folder, in a fresh cache
    shutil.copytree(built, root / "deepspeed_shm_comm", ignore=shutil.ignore_patterns("lock", "*.flock"))
    (root / "deepspeed_shm_comm" / "lock").touch()  # what a killed build leaves
    env = {**os.environ, "MLSTM_CACHE_DIR": str(tmp_path / "cache"), "MASTER_PORT": "29871"}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE"):
        env.pop(k, None)
    code = "from app.parallel.runtime import init_distributed; init_distributed(); print('started')"
    try:
        p = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("the launch waited on the dead build's lock") from None
    assert p.returncode == 0 and "started" in p.stdout, p.stderr[-3000:]
    assert "left by a build that was killed" in p.stderr, p.stderr[-3000:]
    assert not (root / "deepspeed_shm_comm" / "lock").exists()


def test_threads_never_exceed_the_cpus_this_process_may_run_on(monkeypatch):
    """One process on a machine whose affinity mask grants it one CPU (taskset, a Slurm task): one thread,
    where base 2652e8d split os.cpu_count() (every core of the node) between the node's processes."""
    import os

    from app.parallel.runtime import set_threads

    before, mask = torch.get_num_threads(), os.sched_getaffinity(0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_SIZE", "1")
    try:
        os.sched_setaffinity(0, {min(mask)})
        assert set_threads() == 1 == torch.get_num_threads()
        os.sched_setaffinity(0, mask)
        assert set_threads() == min(len(mask), os.cpu_count())
    finally:
        os.sched_setaffinity(0, mask)
        torch.set_num_threads(before)
