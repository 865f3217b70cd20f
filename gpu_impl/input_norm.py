"""Stage 1, ``input_norm``: the layer RMSNorm with a zero-centred weight, (1 + w).

The kernel is shared with :mod:`.post_norm`; :mod:`.residual` fuses the residual add into it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .target import empty, interpreting, kernel, next_pow2


@kernel
def rms_norm_kernel(p_x, p_w, p_out, n_rows, D, stride_x, eps, BR: tl.constexpr, BD: tl.constexpr):
    """RMSNorm with the zero-centred weight (1 + w), row by row — the formula: reference/input_norm.py.

    x: [R, D] (row stride ``stride_x``, unit column stride); w: [D] fp32; out: [R, D] contiguous.
    fp32 math, one rounding to out's dtype. Grid: (cdiv(R, BR),); BD = next_pow2(D).
    """
    i_r = tl.program_id(0)
    o_r = i_r * BR + tl.arange(0, BR)
    o_d = tl.arange(0, BD)
    m_r = o_r < n_rows
    m_d = o_d < D
    m_x = m_r[:, None] & m_d[None, :]
    o_row = o_r.to(tl.int64)[:, None]
    b_x = tl.load(p_x + o_row * stride_x + o_d[None, :], mask=m_x, other=0.0).to(tl.float32)
    b_w = 1.0 + tl.load(p_w + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=1) / D + eps)
    b_out = b_x * b_rstd[:, None] * b_w[None, :]
    tl.store(p_out + o_row * D + o_d[None, :], b_out.to(p_out.dtype.element_ty), mask=m_x)


def rows_per_program(x: torch.Tensor, n_rows: int, BD: int) -> int:
    """Rows per program: a whole tile under the interpreter (few programs), few on a GPU."""
    if interpreting(x):
        return min(next_pow2(n_rows), max(1, 16384 // BD))
    return max(1, min(8, 2048 // BD))


def rms_norm_one_plus(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (1 + w) over the last axis of ``x`` [..., D]; returns a new tensor of x's dtype."""
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    R = x2.shape[0]
    out = empty(x.shape, x.dtype, x.device)
    BD = next_pow2(D)
    BR = rows_per_program(x, R, BD)
    rms_norm_kernel[(triton.cdiv(R, BR),)](
        p_x=x2, p_w=weight.to(torch.float32), p_out=out, n_rows=R, D=D, stride_x=x2.stride(0), eps=float(eps),
        BR=BR, BD=BD, num_warps=4 if BD * BR <= 4096 else 8,
    )
    return out


def input_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Stage ``input_norm`` (the formula: reference/input_norm.py).

    x: [..., T, D] in the activation dtype; weight ``input_layernorm.weight``: [D].
    Returns x_norm [..., T, D] in x's dtype.
    """
    return rms_norm_one_plus(x, weight, eps)
