"""app/common/resources.py: what this process may use of the machine, and the cap / refuse rule (the parts that
share a memory added up, the largest named with its remedy)."""

import pytest

from app.common import resources
from app.common.errors import UserError


def test_a_value_above_its_limit_is_capped_in_one_line():
    said = []
    assert resources.cap("--num-proc", 4096, [(8, "8 CPUs"), (3, "3 blocks to encode")], said.append) == 3
    assert said == ["--num-proc 4096 capped at 3: 3 blocks to encode"]
    assert resources.cap("--num-proc", 2, [(8, "8 CPUs")], said.append) == 2 and len(said) == 1


def test_what_cannot_fit_in_free_memory_is_refused_in_one_line():
    free = resources.available_memory()
    assert free is None or free > 0
    if free is None:
        pytest.skip("this machine reports no free memory (no /proc/meminfo, no cgroup limit)")
    resources.check_fits("a small batch", 1 << 20, "lower it")
    with pytest.raises(
        UserError, match=r"^a huge batch needs about .* of memory and .* is available; lower it$"
    ):
        resources.check_fits("a huge batch", 10 * free, "lower it")


def test_parts_that_together_exceed_the_free_memory_are_refused_naming_the_largest():
    parts = [(60 << 20, "the model", "use a smaller model"), (30 << 20, "a batch", "lower --micro-batch")]
    resources.refuse_over(90 << 20, parts)  # fits exactly
    resources.refuse_over(
        None, [(1 << 60, "anything", "")]
    )  # the free memory unknown: nothing is refused for it
    with pytest.raises(UserError) as e:
        resources.refuse_over(50 << 20, parts, " on cuda:0")
    assert str(e.value) == (
        "the model needs about 60 MiB of memory on cuda:0, beside 30 MiB for the rest, and 50 MiB is "
        "available; use a smaller model"
    )
    with pytest.raises(
        UserError, match=r"^a batch needs about 30 MiB of memory and 1 MiB is available; lower"
    ):
        resources.refuse_over(1 << 20, parts[1:])


def test_cpus_are_those_this_process_may_run_on():
    import os

    assert resources.usable_cpus() == len(os.sched_getaffinity(0))


@pytest.mark.gpu
def test_on_a_cuda_device_the_free_memory_is_the_devices():
    import torch

    free, _ = torch.cuda.mem_get_info(0)
    got = resources.available_memory("cuda:0")
    assert abs(got - free) < 256 << 20  # what the driver reports, not the host's RAM
    with pytest.raises(UserError, match=r"of memory on cuda:0 and [\d.]+ [GM]iB is available; lower it$"):
        resources.check_fits("a batch", 10 * free, "lower it", "cuda:0")
