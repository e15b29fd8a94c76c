"""In-process model tests: config, fast core vs the equations, padding, layers, loss weighting."""

from __future__ import annotations

import pytest
import torch

from app.model.config import PRESETS, ModelConfig, debug_config, flops_per_token
from app.model.core import mlstm_sequence
from app.model.layers import Head, RecurrentLayer
from app.model.lm import LanguageModel
from app.model.loss import IGNORE_INDEX, loss_scale, token_loss
from app.model.reference import naive_mlstm
from app.parallel.pipeline import build_sequential, layer_costs, layer_specs


def rand_weights(in_dim: int, H: int, dtype=torch.float64, scale: float = 0.5) -> list[torch.Tensor]:
    """(w_in (5H, in), bias (4H,), w_mh (H, H), w_m (4H, H)), leaf tensors requiring grad."""
    shapes = [(5 * H, in_dim), (4 * H,), (H, H), (4 * H, H)]
    return [(torch.randn(s, dtype=dtype) * scale).requires_grad_() for s in shapes]


def reference(x, w_in, bias, w_mh, w_m):
    H = w_mh.shape[0]
    return naive_mlstm(x, w_in[:H], w_in[H:], bias, w_mh, w_m)


# ---------------------------------------------------------------- config


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="hidden_dim"):
        debug_config(hidden_dim=0)
    with pytest.raises(ValueError, match="dropout"):
        debug_config(dropout=1.0)
    with pytest.raises(ValueError, match="cell"):
        debug_config(cell="gru")
    with pytest.raises(ValueError, match="embed_dim=32 hidden_dim=64"):
        debug_config(tie_embeddings=True)
    with pytest.raises(ValueError, match="weight_norm"):
        debug_config(cell="lstm")
    with pytest.raises(ValueError, match=r"\['bogus'\]"):
        ModelConfig.from_dict({**debug_config().to_dict(), "bogus": 1})


def test_config_roundtrip_and_flops():
    cfg = debug_config(100, residual=True)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    E, H, V = 32, 64, 100
    fwd = 2 * (5 * H * E + 5 * H * H) + 2 * (10 * H * H) + 2 * H * V
    assert flops_per_token(cfg) == 3 * fwd
    assert layer_costs(cfg) == [0.0, 2 * (5 * H * E + 5 * H * H), 2 * (10 * H * H), 2 * H * V]


# ---------------------------------------------------------------- fast core


def test_core_matches_equations_float64():
    torch.manual_seed(0)
    B, T, D, H = 4, 9, 6, 5
    x = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    ws = rand_weights(D, H)
    y = mlstm_sequence(x, *ws)
    y_ref = reference(x, *ws)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    gy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, *ws], gy)
    want = torch.autograd.grad(y_ref, [x, *ws], gy)
    for name, g, w in zip(["x", "w_in", "bias", "w_mh", "w_m"], got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"grad {n}: {m}")


def test_core_gradcheck():
    torch.manual_seed(1)
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mlstm_sequence, (x, *rand_weights(3, 2)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_core_low_precision_close_to_float64(dtype):
    torch.manual_seed(2)
    B, T, D, H = 8, 16, 32, 32
    x = torch.randn(B, T, D, dtype=torch.float64)
    ws = [w.detach() for w in rand_weights(D, H, scale=0.2)]
    y_ref = reference(x, *ws)
    cast = [x.to(dtype), ws[0].to(dtype), ws[1], ws[2].to(dtype), ws[3].to(dtype)]
    y = mlstm_sequence(*cast)
    assert y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert (y.double() - y_ref).abs().max() < tol


def test_padding_and_zero_state_independence():
    torch.manual_seed(3)
    B, T, D, H = 3, 12, 5, 6
    ws = rand_weights(D, H)
    x = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    y = mlstm_sequence(x, *ws)
    # Padding invariance: rewriting what follows position 7 changes nothing up to it, in value or grad.
    x2 = x.detach().clone()
    x2[:, 8:] = torch.randn(B, T - 8, D, dtype=torch.float64) * 5
    x2.requires_grad_()
    y2 = mlstm_sequence(x2, *ws)
    torch.testing.assert_close(y[:, :8], y2[:, :8], rtol=0, atol=0)
    g1 = torch.autograd.grad(y[:, :8].sum(), [x, *ws])
    g2 = torch.autograd.grad(y2[:, :8].sum(), [x2, *ws])
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # Zero-state independence: each row equals that row run alone; a shorter run equals the prefix.
    for b in range(B):
        torch.testing.assert_close(mlstm_sequence(x[b : b + 1], *ws), y[b : b + 1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mlstm_sequence(x[:, :5], *ws), y[:, :5], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(y[:, 8:], y2[:, 8:])  # and the padding did change what follows


# ---------------------------------------------------------------- layers


@pytest.mark.parametrize("cell", ["mlstm", "lstm"])
def test_step_matches_sequence(cell):
    torch.manual_seed(4)
    cfg = debug_config(cell=cell, weight_norm=cell == "mlstm", residual=True, embed_dim=64)
    layer = RecurrentLayer(cfg, 1)
    assert layer.residual
    x = torch.randn(2, 6, 64)
    y = layer(x)
    state = layer.init_state(2, "cpu")
    steps = []
    for t in range(6):
        y_t, state = layer.step(x[:, t], state)
        steps.append(y_t)
    torch.testing.assert_close(torch.stack(steps, dim=1), y, rtol=1e-5, atol=1e-5)


def test_weight_norm_init_identity_and_gains_matter():
    cfg = debug_config()
    torch.manual_seed(5)
    wn = RecurrentLayer(cfg, 0)
    torch.manual_seed(5)
    plain = RecurrentLayer(debug_config(weight_norm=False), 0)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(wn(x), plain(x), rtol=1e-5, atol=1e-6)
    assert {n for n, _ in wn.named_parameters()} == {
        "weight_in", "weight_mh", "weight_m", "bias", "gain_in", "gain_mh", "gain_m"
    }  # fmt: skip
    before = wn(x).detach()
    with torch.no_grad():
        wn.weight_in.mul_(3.0)  # direction unchanged: weight-normed output must not move
        plain.weight_in.mul_(3.0)
        wn.weight_mh.mul_(0.5)
    torch.testing.assert_close(wn(x), before, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(plain(x), before, atol=1e-3)
    with torch.no_grad():
        wn.gain_m.mul_(2.0)  # the gains do set the scale
    assert not torch.allclose(wn(x), before, atol=1e-3)
    assert torch.all(plain.bias[64:128] == 1.0) and torch.all(plain.bias[:64] == 0.0)  # forget bias


def test_layer_bf16_autocast_and_dropout():
    torch.manual_seed(6)
    layer = RecurrentLayer(debug_config(dropout=0.5), 0)
    x = torch.randn(2, 7, 32, requires_grad=True)
    layer.eval()
    y32 = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = layer(x)
    assert y16.dtype == torch.bfloat16 and y16.is_contiguous()
    assert (y16.float() - y32).abs().max() < 3e-2
    y16.float().sum().backward()
    assert layer.weight_in.grad.dtype == torch.float32 and torch.isfinite(layer.weight_in.grad).all()
    layer.train()
    assert (layer(x) == 0).float().mean() > 0.3  # dropout on the output in training only


def test_layer_with_bf16_parameters():
    """DeepSpeed bf16 mode keeps parameters in bf16 without autocast: gates still run in fp32."""
    torch.manual_seed(8)
    layer = RecurrentLayer(debug_config(), 0)
    x = torch.randn(2, 9, 32)
    y32 = layer(x)
    layer.to(torch.bfloat16)
    y16 = layer(x.bfloat16())
    assert y16.dtype == torch.bfloat16 and (y16.float() - y32).abs().max() < 3e-2
    y16.float().sum().backward()
    assert all(p.grad.dtype == torch.bfloat16 and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("tied", [False, True])
def test_sequential_model_structure(tied):
    cfg = debug_config(50, embed_dim=64, tie_embeddings=tied)
    model = build_sequential(cfg)
    ids = torch.randint(0, 50, (3, 8))
    logits = model(ids)
    assert logits.shape == (3, 8, 50) and logits.is_contiguous()
    keys = {k.split(".")[0] for k in model.state_dict()}
    assert keys == ({"0", "1", "2"} if tied else {"0", "1", "2", "3"})
    assert len(layer_specs(cfg)) == 4
    # Same seeds -> same weights: the layout-independence the pipeline relies on.
    torch.testing.assert_close(build_sequential(cfg)(ids), logits, rtol=0, atol=0)
    if tied:
        logits.sum().backward()
        emb_grad = model.get_submodule("0").weight.grad
        # the head's contribution reaches the shared matrix: rows of tokens never input get grad too
        unused = torch.ones(50, dtype=torch.bool)
        unused[ids.flatten()] = False
        assert emb_grad[unused].abs().sum() > 0


# ---------------------------------------------------------------- loss weighting


def padded_batch(gen, B, T, vocab):
    ids = torch.randint(0, vocab, (B, T), generator=gen)
    tgt = torch.randint(0, vocab, (B, T), generator=gen)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    pad = torch.arange(T)[None] >= lengths[:, None]
    ids[pad], tgt[pad] = 0, IGNORE_INDEX
    return ids, tgt


def pad_to(t, T, value):
    return torch.nn.functional.pad(t, (0, T - t.shape[1]), value=value)


def test_loss_weighting_matches_one_big_batch():
    """Micro-batches (different lengths and token counts) on 2 simulated dp ranks, DeepSpeed's
    arithmetic (loss / gas, mean over ranks), give the same loss and gradient as one batch."""
    torch.manual_seed(7)
    vocab = 40
    model = build_sequential(debug_config(vocab))
    gen = torch.Generator().manual_seed(0)
    ranks = [[padded_batch(gen, 2, 5, vocab), padded_batch(gen, 2, 11, vocab)] for _ in range(2)]
    gas, dp = 2, 2
    n_tokens = sum(int((t != IGNORE_INDEX).sum()) for mbs in ranks for _, t in mbs)

    def grads():
        g = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        return g

    # one batch holding all four micro-batches, padded to a common length
    ids = torch.cat([pad_to(i, 11, 0) for mbs in ranks for i, _ in mbs])
    tgt = torch.cat([pad_to(t, 11, IGNORE_INDEX) for mbs in ranks for _, t in mbs])
    big = token_loss(model(ids), (tgt, loss_scale(n_tokens)))
    big.backward()
    g_big = grads()

    def deepspeed_style(scale_of):
        total, acc = 0.0, None
        for mbs in ranks:
            for i, t in mbs:
                loss = token_loss(model(i), (t, scale_of(t)))
                (loss / gas).backward()
                total += float(loss.detach()) / gas / dp
            g = grads()
            acc = g if acc is None else [a + b for a, b in zip(acc, g)]
        return total, [a / dp for a in acc]

    loss, g = deepspeed_style(lambda t: loss_scale(n_tokens, gas, dp))
    assert abs(loss - float(big.detach())) < 1e-5
    for a, b in zip(g, g_big):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    # Control: DeepSpeed's default (a mean per micro-batch) is measurably different here.
    loss_mean, g_mean = deepspeed_style(lambda t: loss_scale(int((t != IGNORE_INDEX).sum())))
    assert abs(loss_mean - float(big.detach())) > 1e-3 or any(
        not torch.allclose(a, b) for a, b in zip(g_mean, g_big)
    )


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_builds_and_runs(preset):
    """Each shipped size builds with the shapes its config implies; those up to H = 1024 also run forward."""
    cfg = ModelConfig(vocab_size=300, **PRESETS[preset])
    H, E = cfg.hidden_dim, cfg.embed_dim
    with torch.device("meta"):  # no memory, so the large preset is checked too
        shapes = {k: tuple(v.shape) for k, v in LanguageModel(cfg).state_dict().items()}
    assert shapes["0.weight"] == (300, E)
    assert shapes["1.weight_in"] == (5 * H, E) and shapes["1.weight_m"] == (4 * H, H)
    assert len(layer_specs(cfg)) == cfg.num_layers + 2
    if H <= 1024:
        logits = LanguageModel(cfg)(torch.zeros(2, 5, dtype=torch.long))
        assert logits.shape == (2, 5, 300) and torch.isfinite(logits).all()


@pytest.mark.parametrize("tied", [True, False])
def test_a_model_built_on_the_meta_device_imports_no_dynamo_and_draws_what_it_drew(tied):
    """Evaluate, generate, classify and export build the model on the meta device to take saved weights: no
    init op may reach torch's Python meta kernels (`mul`, `norm`), which import torch._dynamo (~2 s a
    process), nor its Python `randn`, which imports sympy through FX's symbolic shapes (0.7 s). On the CPU
    the draws are those of `randn * std` and `norm(dim=1)`."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from app.model.config import debug_config\n"
        "from app.model.lm import LanguageModel\n"
        f"cfg = debug_config(vocab_size=300, tie_embeddings={tied}, embed_dim=64, weight_norm=True)\n"
        "with torch.device('meta'):\n"
        "    LanguageModel(cfg)\n"
        "print('torch._dynamo' in sys.modules, 'torch.fx.experimental.symbolic_shapes' in sys.modules)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.split() == ["False", "False"], (p.stdout, p.stderr[-2000:])
    cfg = debug_config(vocab_size=300, tie_embeddings=tied, embed_dim=64, weight_norm=True)
    torch.manual_seed(7)
    model = LanguageModel(cfg)
    torch.manual_seed(7)
    first = torch.randn(cfg.vocab_size, cfg.embed_dim) * cfg.embed_init_std
    assert torch.equal(model.state_dict()["0.weight"], first)
    if not tied:  # the head: the last draw of the model (its bias is zeros)
        torch.manual_seed(11)
        head = Head(cfg).weight
        torch.manual_seed(11)
        assert torch.equal(head, torch.randn(cfg.vocab_size, cfg.hidden_dim) * cfg.embed_init_std)
    for name, p in model.named_parameters():
        if name.endswith("gain_in"):
            assert torch.equal(
                p, dict(model.named_parameters())[name[: -len("gain_in")] + "weight_in"].norm(dim=1)
            )
