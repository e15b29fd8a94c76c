"""Fast mLSTM recurrence (Krause et al. 2016) with backward through time written out.

The python backend of the op contract in app/model/core.py, the oracle every fused backend is tested
against, and the one home of prefill / single-step / from-state inference.

Per layer, per time step (x input, h/c state, zero initial state):

    m_t = (W_mx x_t) * (W_mh h_{t-1})
    [i, f, o, u] = W_x x_t + W_m m_t + b
    c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(u)
    h_t = sigmoid(o) * tanh(c_t)

What makes it fast:
- The input side [W_mx; W_x] x for every time step is ONE (B*T, in) @ (in, 5H) product before the loop.
- Inside the loop only the two recurrent products (B, H) @ (H, H) and (B, H) @ (H, 4H) remain, plus a
  handful of elementwise ops writing into preallocated buffers (per-op overhead matters at small sizes).
- Backward runs the same loop in reverse with the two transposed recurrent products, storing the
  pre-activation gradients; all weight gradients are then one large product each over all B*T tokens.
- Everything that does not depend on the recurrence (gate derivatives) is computed for all steps at once.

Precision: matmul operands use the compute dtype (the input's: float32/float64, or bf16/fp16 under
autocast); gates, cell state and the backward recurrence stay in float32 when the compute dtype is
16-bit, so only the products are low precision (fp32 accumulation inside the kernels).
Right padding needs nothing: the recurrence is causal, so outputs at real positions never see the pad
that follows them, and pad positions get no loss gradient.
"""

from __future__ import annotations

import torch

from app.model.matmul import grad_weight, linear


def state_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """Gates and cell state are kept at least in float32."""
    return torch.float32 if compute_dtype in (torch.bfloat16, torch.float16) else compute_dtype


def _recur(
    x: torch.Tensor,
    w_in: torch.Tensor,
    bias: torch.Tensor,
    w_mh: torch.Tensor,
    w_m: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """The input projection, then THE cell equations (`forward_loop`) over x (B, T, in) from `state` (h_0,
    c_0), zero when None.

    Returns every buffer backward needs: xt (T, B, in), pm (T, B, H), gates (T, B, 4H) activated
    [si, sf, so, tu], cs (T+1, B, H) c_0..c_T, tcs (T, B, H), rs (T, B, H) W_mh h_{t-1}, ms (T, B, H),
    hs (T+1, B, H) h_0..h_T. Training, prefill and the per-token step all run this one loop.
    """
    B, T, D = x.shape
    H = w_mh.shape[0]
    sdt = state_dtype(x.dtype)
    xt = x.transpose(0, 1).contiguous()  # (T, B, D): per-step slices contiguous
    proj = linear(xt.view(T * B, D), w_in).view(T, B, 5 * H).to(sdt)  # (T, B, 5H)
    # a contiguous copy, so backward keeps (T, B, H) alive rather than all of proj (T, B, 5H)
    pm = proj[..., :H].contiguous()  # (T, B, H)  W_mx x_t
    pg = proj[..., H:]  # (T, B, 4H) W_x x_t
    pg += bias
    return (xt, pm, *forward_loop(pm, pg, w_mh, w_m, state, x.dtype))


def forward_loop(
    pm: torch.Tensor,
    pg: torch.Tensor,
    w_mh: torch.Tensor,
    w_m: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None,
    cdt: torch.dtype,
) -> tuple[torch.Tensor, ...]:
    """THE cell equations, from the input projections pm (T, B, H) = W_mx x_t and pg (T, B, 4H) = W_x x_t + b
    (state dtype) and `state` (h_0, c_0) (zero when None), products in `cdt`. Returns gates, cs, tcs, rs, ms,
    hs as `_recur` describes them (the GPU loops' outputs too: gpu_verify checks them against this in float64)."""
    T, B, H = pm.shape
    sdt = pm.dtype
    kw = dict(device=pm.device)
    gates = torch.empty(T, B, 4 * H, dtype=sdt, **kw)  # activated [si, sf, so, tu]
    cs = torch.zeros(T + 1, B, H, dtype=sdt, **kw)  # c_0 .. c_T (only c_0 needs the zero)
    tcs = torch.empty(T, B, H, dtype=sdt, **kw)  # tanh(c_t)
    ms = torch.empty(T, B, H, dtype=cdt, **kw)  # m_t, matmul operand
    hs = torch.zeros(T + 1, B, H, dtype=cdt, **kw)  # h_0 .. h_T, matmul operand
    if state is not None:
        hs[0].copy_(state[0])
        cs[0].copy_(state[1])
    g = torch.empty(B, 4 * H, dtype=sdt, **kw)  # pre-activations, reused every step
    g_sig, g_tanh = g[:, : 3 * H], g[:, 3 * H :]
    # Per-step views made once: indexing inside the loop costs a dispatcher call each time,
    # which is most of the per-step cost at small sizes.
    hs_u, cs_u, tcs_u, ms_u, pm_u, pg_u = (v.unbind(0) for v in (hs, cs, tcs, ms, pm, pg))
    a_sig_u, a_tanh_u = gates[..., : 3 * H].unbind(0), gates[..., 3 * H :].unbind(0)
    si_u, sf_u, so_u, tu_u = (v.unbind(0) for v in gates.split(H, dim=2))
    rs_list = []  # W_mh h_{t-1}, kept for backward (stacked once after the loop)
    for t in range(T):
        r = linear(hs_u[t], w_mh)  # (B, H)
        rs_list.append(r)
        torch.mul(pm_u[t], r, out=ms_u[t])  # m_t = (W_mx x_t) * (W_mh h_{t-1})
        torch.add(pg_u[t], linear(ms_u[t], w_m), out=g)  # (B, 4H) W_x x_t + W_m m_t + b
        torch.sigmoid(g_sig, out=a_sig_u[t])
        torch.tanh(g_tanh, out=a_tanh_u[t])
        c = cs_u[t + 1]
        torch.mul(sf_u[t], cs_u[t], out=c)  # c_t = sigmoid(f) c_{t-1} + sigmoid(i) tanh(u)
        c.addcmul_(si_u[t], tu_u[t])
        torch.tanh(c, out=tcs_u[t])
        torch.mul(so_u[t], tcs_u[t], out=hs_u[t + 1])  # h_t = sigmoid(o) tanh(c_t)
    rs = torch.stack(rs_list)  # (T, B, H)
    return gates, cs, tcs, rs, ms, hs


def backward_loop(
    dyt: torch.Tensor,
    w_mh: torch.Tensor,
    w_m: torch.Tensor,
    pm: torch.Tensor,
    gates: torch.Tensor,
    cs: torch.Tensor,
    tcs: torch.Tensor,
    rs: torch.Tensor,
    cdt: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loop of backpropagation through time: dy (T, B, H) in the state dtype and the forward's buffers ->
    (dG (T, B, 4H) the pre-activations' gradients [i, f, o, u], dPm (T, B, H) d(W_mx x_t), dR (T, B, H)
    d(W_mh h_{t-1})), in `cdt` (the products' operands). The GPU loops' dP is [dPm | dG], their dr dR."""
    T, B, H = pm.shape
    sdt = pm.dtype
    kw = dict(device=pm.device)
    # Everything the reverse loop needs that does not depend on the recurrence, for all t at once.
    si, sf, so, tu = gates.split(H, dim=2)  # each (T, B, H)
    # dL/d(pre-activation) = E_t * K_t with E_t = [dc, dc, dh, dc] and
    # K = [tu, c_{t-1}, tanh c_t, si] * [sig', sig', sig', tanh'] of the respective gate,
    # written with fused addcmul passes because these are the biggest elementwise ops of the layer.
    one = torch.ones((), dtype=sdt, **kw)
    K = torch.empty(T, B, 4, H, dtype=sdt, **kw)
    d = torch.addcmul(si, si, si, value=-1)  # (T, B, H) sigmoid'(i) = si (1 - si)
    torch.mul(d, tu, out=K[:, :, 0])
    torch.addcmul(sf, sf, sf, value=-1, out=d)
    torch.mul(d, cs[:-1], out=K[:, :, 1])
    torch.addcmul(so, so, so, value=-1, out=d)
    torch.mul(d, tcs, out=K[:, :, 2])
    torch.addcmul(one, tu, tu, value=-1, out=d)  # tanh'(u) = 1 - tu^2
    torch.mul(d, si, out=K[:, :, 3])
    torch.addcmul(one, tcs, tcs, value=-1, out=d)
    S = d.mul_(so)  # (T, B, H) dh -> dc
    w_m_t = w_m.t().contiguous()  # (H, 4H)
    w_mh_t = w_mh.t().contiguous()  # (H, H)

    dG = torch.empty(T, B, 4 * H, dtype=cdt, **kw)  # d(pre-activations [i, f, o, u])
    dPm = torch.empty(T, B, H, dtype=cdt, **kw)  # d(W_mx x_t)
    dR = torch.empty(T, B, H, dtype=cdt, **kw)  # d(W_mh h_{t-1})
    dc = torch.zeros(B, H, dtype=sdt, **kw)
    dh_next = torch.zeros(B, H, dtype=sdt, **kw)
    dyt_u, S_u, K_u, Ko_u, sf_u = (v.unbind(0) for v in (dyt, S, K, K[:, :, 2], sf))
    dG_u, dGo_u = dG.view(T, B, 4, H).unbind(0), dG.view(T, B, 4, H)[:, :, 2].unbind(0)
    dG2_u, dPm_u, dR_u, rs_u, pm_u = (v.unbind(0) for v in (dG, dPm, dR, rs, pm))
    for t in range(T - 1, -1, -1):
        dh = dyt_u[t] + dh_next  # (B, H)
        dc.addcmul_(dh, S_u[t])  # dc arrives already multiplied by sf[t+1]
        torch.mul(K_u[t], dc.unsqueeze(1), out=dG_u[t])  # (B, 4, H): i, f, u take dc ...
        torch.mul(Ko_u[t], dh, out=dGo_u[t])  # ... and the o gate takes dh
        dm = linear(dG2_u[t], w_m_t)  # (B, H)
        torch.mul(dm, rs_u[t], out=dPm_u[t])
        torch.mul(dm, pm_u[t], out=dR_u[t])
        dh_next = linear(dR_u[t], w_mh_t)  # (B, H)
        dc.mul_(sf_u[t])  # carry to c_{t-1}
    return dG, dPm, dR


class MLSTMFunction(torch.autograd.Function):
    """(x, w_in, bias, w_mh, w_m) -> h for all steps.

    x (B, T, in) compute dtype; w_in (5H, in) = [W_mx; W_x] with W_x rows in gate order i, f, o, u;
    bias (4H,) state dtype; w_mh (H, H); w_m (4H, H). Returns h (B, T, H) in the compute dtype.
    """

    @staticmethod
    def forward(ctx, x, w_in, bias, w_mh, w_m):
        xt, pm, gates, cs, tcs, rs, ms, hs = _recur(x, w_in, bias, w_mh, w_m)
        ctx.save_for_backward(xt, w_in, w_mh, w_m, pm, gates, cs, tcs, rs, ms, hs)
        return hs[1:].transpose(0, 1).contiguous()  # (B, T, H)

    @staticmethod
    def backward(ctx, dy):
        xt, w_in, w_mh, w_m, pm, gates, cs, tcs, rs, ms, hs = ctx.saved_tensors
        T, B, D = xt.shape
        H = w_mh.shape[0]
        cdt, sdt = xt.dtype, state_dtype(xt.dtype)
        dyt = dy.transpose(0, 1).to(sdt).contiguous()  # (T, B, H)
        dG, dPm, dR = backward_loop(dyt, w_mh, w_m, pm, gates, cs, tcs, rs, cdt)

        N = T * B
        dG2, dPm2, X = dG.view(N, 4 * H), dPm.view(N, H), xt.view(N, D)
        d_w_m = grad_weight(dG2, ms.view(N, H))  # (4H, H)
        d_w_mh = grad_weight(dR.view(N, H), hs[:-1].reshape(N, H))  # (H, H)
        d_bias = dG2.sum(dim=0, dtype=sdt)  # (4H,)
        d_w_in = torch.cat((grad_weight(dPm2, X), grad_weight(dG2, X)))  # (5H, D)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = linear(dG2, w_in[H:].t().contiguous())  # (N, D)
            dx += linear(dPm2, w_in[:H].t().contiguous())
            dx = dx.view(T, B, D).transpose(0, 1)  # (B, T, D)
        return dx, d_w_in, d_bias, d_w_mh, d_w_m


class MLSTMFromState(MLSTMFunction):
    """(x, w_in, bias, w_mh, w_m, h_0, c_0) -> (h for all steps, c_T): `MLSTMFunction` from a given state.

    For truncated backpropagation through time (dynamic evaluation): the state enters as a constant (no
    gradient flows into it) and c_T leaves without one; the weight gradients are MLSTMFunction's own
    backward, which already reads c_0 and h_0 from the saved cs[0] / hs[0].
    """

    @staticmethod
    def forward(ctx, x, w_in, bias, w_mh, w_m, h0, c0):
        xt, pm, gates, cs, tcs, rs, ms, hs = _recur(x, w_in, bias, w_mh, w_m, (h0, c0))
        ctx.save_for_backward(xt, w_in, w_mh, w_m, pm, gates, cs, tcs, rs, ms, hs)
        c_last = cs[-1].clone()  # (B, H)
        ctx.mark_non_differentiable(c_last)
        return hs[1:].transpose(0, 1).contiguous(), c_last  # (B, T, H), (B, H)

    @staticmethod
    def backward(ctx, dy, _dc_last):
        return (*MLSTMFunction.backward(ctx, dy), None, None)


@torch.no_grad()
def mlstm_prefill(
    x: torch.Tensor,
    lengths: torch.Tensor,
    w_in,
    bias,
    w_mh,
    w_m,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Inference: x (B, T, in) from `state` (zero when None) -> (h (B, T, H), (h, c) after row b's first
    lengths[b] steps).

    The same loop as training (`_recur` keeps every c_t), so the state at each row's own end can be
    picked out of a right-padded batch. No autograd. (`core.mlstm_prefill` routes a prefill from a zero
    state to the compiled loop where the model's core runs there.)
    """
    lengths = lengths.to(x.device)
    bias = bias.to(state_dtype(x.dtype))
    *_, cs, _, _, _, hs = _recur(x, w_in, bias, w_mh, w_m, state)
    rows = torch.arange(x.shape[0], device=x.device)
    return hs[1:].transpose(0, 1), (hs[lengths, rows], cs[lengths, rows])


@torch.no_grad()
def mlstm_step(
    x_t: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor],
    w_in: torch.Tensor,
    bias: torch.Tensor,
    w_mh: torch.Tensor,
    w_m: torch.Tensor,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Inference: one token x_t (B, in), state (h, c) each (B, H) -> (h_t, (h_t, c_t)). No autograd."""
    *_, cs, _, _, _, hs = _recur(x_t.unsqueeze(1), w_in, bias.to(state_dtype(x_t.dtype)), w_mh, w_m, state)
    return hs[1], (hs[1], cs[1])
