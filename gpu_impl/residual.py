"""Stages 9 and 12, ``residual`` and ``output``, and the residual add fused with ``post_norm``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .input_norm import rows_per_program
from .target import empty, kernel, next_pow2


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # torch adds bf16/f16 tensors in fp32 and rounds once, like the fused kernel below
    return torch.add(a, b)


def residual(x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
    """Stage ``residual`` (reference/residual.py). [..., T, D] -> [..., T, D], one rounding."""
    return _add(x, attn_out)


def output(h: torch.Tensor, mlp_out: torch.Tensor) -> torch.Tensor:
    """Stage ``output`` (reference/residual.py). [..., T, D] -> [..., T, D], one rounding."""
    return _add(h, mlp_out)


@kernel
def residual_post_norm_kernel(p_x, p_a, p_w, p_h, p_hn, n_rows, D, eps, BR: tl.constexpr, BD: tl.constexpr):
    """Stages ``residual`` then ``post_norm`` — the formulas: reference/residual.py, reference/post_norm.py.

    x, attn_out, h, h_norm: [R, D] contiguous; w: [D] fp32. h is rounded to its dtype first and
    the norm reads the rounded h, so the result equals ``post_norm(residual(x, attn_out))``.
    Grid: (cdiv(R, BR),); BD = next_pow2(D).
    """
    i_r = tl.program_id(0)
    o_r = i_r * BR + tl.arange(0, BR)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_x = (o_r < n_rows)[:, None] & m_d[None, :]
    o_x = o_r.to(tl.int64)[:, None] * D + o_d[None, :]
    b_x = tl.load(p_x + o_x, mask=m_x, other=0.0).to(tl.float32)
    b_a = tl.load(p_a + o_x, mask=m_x, other=0.0).to(tl.float32)
    b_h = (b_x + b_a).to(p_h.dtype.element_ty)
    tl.store(p_h + o_x, b_h, mask=m_x)
    b_h = b_h.to(tl.float32)
    b_w = 1.0 + tl.load(p_w + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_rstd = 1.0 / tl.sqrt(tl.sum(b_h * b_h, axis=1) / D + eps)
    tl.store(p_hn + o_x, (b_h * b_rstd[:, None] * b_w[None, :]).to(p_hn.dtype.element_ty), mask=m_x)


def residual_post_norm(
    x: torch.Tensor, attn_out: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, h_norm) = (residual(x, attn_out), post_norm(h, weight, eps)) in one kernel.

    x, attn_out: [..., T, D] of one dtype; weight: [D]. Returns h and h_norm in that dtype.
    """
    D = x.shape[-1]
    x2, a2 = x.reshape(-1, D).contiguous(), attn_out.reshape(-1, D).contiguous()
    R = x2.shape[0]
    h = empty(x.shape, x.dtype, x.device)
    h_norm = empty(x.shape, x.dtype, x.device)
    BD = next_pow2(D)
    BR = rows_per_program(x, R, BD)
    residual_post_norm_kernel[(triton.cdiv(R, BR),)](
        p_x=x2, p_a=a2, p_w=weight.to(torch.float32), p_h=h, p_hn=h_norm, n_rows=R, D=D, eps=float(eps),
        BR=BR, BD=BD, num_warps=4 if BD * BR <= 4096 else 8,
    )
    return h, h_norm
