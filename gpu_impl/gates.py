"""Stage 5, ``gates``: the log-decay g and the write strength beta, in one kernel, fp32 out."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .target import empty, interpreting, kernel, next_pow2


@kernel
def gates_kernel(p_a, p_b, p_alog, p_dt, p_g, p_beta, n_rows, H, stride_a, stride_b,
                 BR: tl.constexpr, BH: tl.constexpr):
    """g and beta — the formulas: reference/gates.py.

    a, b: [R, Hv] (row strides stride_a, stride_b; unit head stride); A_log, dt_bias: [Hv] fp32;
    g, beta: [R, Hv] fp32 contiguous. softplus(x) = max(x, 0) + log1p(e^{-|x|}), with log1p
    written so that it keeps full relative accuracy for small arguments (no threshold).
    Grid: (cdiv(R, BR),); BH = next_pow2(Hv).
    """
    i_r = tl.program_id(0)
    o_r = (i_r * BR + tl.arange(0, BR)).to(tl.int64)
    o_h = tl.arange(0, BH)
    m_h = o_h < H
    m = (o_r < n_rows)[:, None] & m_h[None, :]
    b_a = tl.load(p_a + o_r[:, None] * stride_a + o_h[None, :], mask=m, other=0.0).to(tl.float32)
    b_b = tl.load(p_b + o_r[:, None] * stride_b + o_h[None, :], mask=m, other=0.0).to(tl.float32)
    b_A = tl.exp(tl.load(p_alog + o_h, mask=m_h, other=0.0))
    b_x = b_a + tl.load(p_dt + o_h, mask=m_h, other=0.0)[None, :]
    b_u = tl.exp(-tl.abs(b_x))
    b_w = 1.0 + b_u
    # log1p(u) = u where 1 + u rounds to 1, else log(1 + u) · u / ((1 + u) - 1) (Goldberg)
    b_exact = b_w == 1.0
    b_log1p = tl.where(b_exact, b_u, tl.log(b_w) * (b_u / tl.where(b_exact, 1.0, b_w - 1.0)))
    b_softplus = tl.maximum(b_x, 0.0) + b_log1p
    o_out = o_r[:, None] * H + o_h[None, :]
    tl.store(p_g + o_out, -b_A[None, :] * b_softplus, mask=m)
    tl.store(p_beta + o_out, 1.0 / (1.0 + tl.exp(-b_b)), mask=m)


def gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """g, beta [..., T, Hv] in fp32 from a, b [..., T, Hv] (reference/gates.py).

    a, b may be strided views (unit stride on the head axis); A_log, dt_bias: [Hv].
    """
    H = a.shape[-1]
    a2, b2 = a.reshape(-1, H), b.reshape(-1, H)
    if a2.stride(-1) != 1:
        a2 = a2.contiguous()
    if b2.stride(-1) != 1:
        b2 = b2.contiguous()
    R = a2.shape[0]
    g = empty(a.shape, torch.float32, a.device)
    beta = empty(a.shape, torch.float32, a.device)
    BH = next_pow2(H)
    BR = min(next_pow2(R), max(1, 16384 // BH)) if interpreting(a) else max(1, min(64, 4096 // BH))
    gates_kernel[(triton.cdiv(R, BR),)](
        p_a=a2, p_b=b2, p_alog=A_log.to(torch.float32), p_dt=dt_bias.to(torch.float32), p_g=g, p_beta=beta,
        n_rows=R, H=H, stride_a=a2.stride(0), stride_b=b2.stride(0), BR=BR, BH=BH, num_warps=4,
    )
    return g, beta
