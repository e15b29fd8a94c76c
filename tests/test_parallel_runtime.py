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
