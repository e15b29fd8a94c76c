"""app.parallel.partition: per-layer costs that decide the pipeline split."""

import torch

from app.model.config import ModelConfig
from app.parallel.partition import measure_layer_costs
from app.parallel.pipeline import layer_costs

CPU = torch.device("cpu")


def test_measured_costs_cover_every_layer_and_leave_the_rng_alone():
    cfg = ModelConfig(vocab_size=300, embed_dim=32, hidden_dim=96, num_layers=3)
    torch.manual_seed(7)
    expected_next = torch.rand(4)
    torch.manual_seed(7)
    costs = measure_layer_costs(cfg, micro_batch=4, seq_len=16, device=CPU)
    assert torch.equal(torch.rand(4), expected_next)  # timing must not shift the run's random stream
    assert len(costs) == len(layer_costs(cfg)) == cfg.num_layers + 2
    assert all(c > 0 for c in costs)
    emb, first, *rest, _head = costs
    assert rest[0] == rest[1], "layers of the same width share one measurement"
    assert min(first, *rest) > emb, "a recurrent layer costs more than an embedding lookup"


def test_tied_head_is_timed_through_the_embedding():
    cfg = ModelConfig(vocab_size=300, embed_dim=64, hidden_dim=64, num_layers=1, tie_embeddings=True)
    costs = measure_layer_costs(cfg, micro_batch=2, seq_len=8, device=CPU)
    assert len(costs) == 3 and all(c > 0 for c in costs)
