"""app/model/matmul.py: the CPU products' per-shape kernel choice."""

import torch


def test_a_wide_product_times_only_the_rows_its_budget_holds(monkeypatch):
    """The first product of a (K, N) times every row bucket up to a cap that shrinks with K x N (the 4096-wide
    layer's first product used to time 1024-row products, over a second each: minutes before a first token);
    more rows take the cap's choice."""
    from app.model import matmul

    monkeypatch.setattr(matmul, "_TIMED_MACS", 1 << 20)
    monkeypatch.setattr(matmul, "_choice", {})
    monkeypatch.delenv("MLSTM_MATMUL", raising=False)
    name = matmul.choose(1000, 256, 256, torch.float32)
    table = matmul._choice[("linear", 256, 256, torch.float32)]
    assert sorted(table) == [1, 2, 4, 8, 16], table  # 16 x 256 x 256 = 2^20 multiply-adds
    assert name == table[16] and matmul.choose(3, 256, 256, torch.float32) == table[4]
    assert (
        matmul._rows_cap("linear", 16, 16) == 1024 and matmul._rows_cap("step", 16, 16) == 256
    )  # the kinds caps
