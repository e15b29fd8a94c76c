"""The shared rule's refusal: the parts that share a memory added up, the largest named with its remedy."""

from __future__ import annotations

import pytest

from app.common.errors import UserError
from app.common.resources import refuse_over


def test_parts_that_together_exceed_the_free_memory_are_refused_naming_the_largest():
    parts = [(60 << 20, "the model", "use a smaller model"), (30 << 20, "a batch", "lower --micro-batch")]
    refuse_over(90 << 20, parts)  # fits exactly
    refuse_over(None, [(1 << 60, "anything", "")])  # the free memory unknown: nothing is refused for it
    with pytest.raises(UserError) as e:
        refuse_over(50 << 20, parts, " on cuda:0")
    assert str(e.value) == (
        "the model needs about 60 MiB of memory on cuda:0, beside 30 MiB for the rest, and 50 MiB is "
        "available; use a smaller model"
    )
    with pytest.raises(
        UserError, match=r"^a batch needs about 30 MiB of memory and 1 MiB is available; lower"
    ):
        refuse_over(1 << 20, parts[1:])
