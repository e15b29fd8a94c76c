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
