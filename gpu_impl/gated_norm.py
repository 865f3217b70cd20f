"""Stage 7, ``gated_norm``: RMSNorm per value head with plain w, then the silu(z) gate."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .target import empty, interpreting, kernel, next_pow2


@kernel
def gated_norm_kernel(p_x, p_z, p_w, p_out, n_rows, Hv, DV, stride_zt, stride_zh, eps,
                      BR: tl.constexpr, BD: tl.constexpr, PER_HEAD: tl.constexpr):
    """The gated RMSNorm (norm first, plain w, then the gate) — the formula: reference/gated_norm.py.

    core (x): [R, dv] rows, R = B·T·Hv, contiguous; z: row r = (bt, h) at bt·stride_zt + h·stride_zh,
    unit stride on dv; w: [dv] or, PER_HEAD, [Hv·dv] fp32; out: [R, dv] contiguous. fp32 math, one
    rounding. Grid: (cdiv(R, BR),); BD = next_pow2(dv).
    """
    i_r = tl.program_id(0)
    o_r = (i_r * BR + tl.arange(0, BR)).to(tl.int64)
    o_d = tl.arange(0, BD)
    m_d = o_d < DV
    m = (o_r < n_rows)[:, None] & m_d[None, :]
    o_h = o_r % Hv
    b_x = tl.load(p_x + o_r[:, None] * DV + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    o_z = (o_r // Hv) * stride_zt + o_h * stride_zh
    b_z = tl.load(p_z + o_z[:, None] + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    if PER_HEAD:
        b_w = tl.load(p_w + o_h[:, None] * DV + o_d[None, :], mask=m, other=0.0)
    else:
        b_w = tl.load(p_w + o_d, mask=m_d, other=0.0)[None, :]
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=1) / DV + eps)
    b_out = b_x * b_rstd[:, None] * b_w * (b_z / (1.0 + tl.exp(-b_z)))
    tl.store(p_out + o_r[:, None] * DV + o_d[None, :], b_out.to(p_out.dtype.element_ty), mask=m)


def gated_norm(core: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """core_gated [..., T, Hv, dv] from core and z [..., T, Hv, dv] (reference/gated_norm.py).

    weight ``linear_attn.norm.weight``: [dv] (shared) or [Hv·dv] (per_head), applied as plain w.
    z may be a strided view (unit stride on dv, uniform stride over the leading axes).
    """
    Hv, dv = core.shape[-2:]
    x = core.reshape(-1, dv).contiguous()
    R = x.shape[0]
    z3 = z.reshape(-1, Hv, dv)
    if z3.stride(-1) != 1:
        z3 = z3.contiguous()
    w = weight.reshape(-1).to(torch.float32).contiguous()
    per_head = w.numel() == Hv * dv and w.numel() != dv
    if not per_head and w.numel() != dv:
        raise ValueError(f"gated_norm: expected a weight of {dv} or {Hv * dv} elements, found {w.numel()}")
    out = empty(core.shape, core.dtype, core.device)
    BD = next_pow2(dv)
    BR = min(next_pow2(R), max(1, 16384 // BD)) if interpreting(core) else max(1, min(16, 2048 // BD))
    gated_norm_kernel[(triton.cdiv(R, BR),)](
        p_x=x, p_z=z3, p_w=w, p_out=out, n_rows=R, Hv=Hv, DV=dv, stride_zt=z3.stride(0), stride_zh=z3.stride(1),
        eps=float(eps), BR=BR, BD=BD, PER_HEAD=per_head, num_warps=4,
    )
    return out
