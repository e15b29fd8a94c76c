"""Start-up precision check: bf16 on a CPU that only emulates it is flagged."""

from __future__ import annotations

import logging

from app.model.matmul import bf16_is_native
from app.parallel.precision import check_precision


def test_bf16_flagged_exactly_when_emulated(caplog):
    log = logging.getLogger("test_precision")
    with caplog.at_level(logging.WARNING, logger="test_precision"):
        assert check_precision("fp32", "cpu", "cfg.json", log)
        assert check_precision("bf16", "cuda", "cfg.json", log)
        assert not caplog.records
        sound = check_precision("bf16", "cpu", "cfg.json", log)
    native = bf16_is_native()  # measured: bf16 product faster than fp32 on this CPU
    assert sound == native
    assert bool(caplog.records) == (not native)
    if not native:
        assert "cfg.json enables bf16, but this CPU has no native bf16" in caplog.records[0].getMessage()
