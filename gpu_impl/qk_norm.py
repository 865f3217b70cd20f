"""Stage 4, ``qk_norm``: split the conv output into heads; L2-normalise q and k (q unscaled).

The layer's fast path fuses this into the conv kernel (:func:`.conv1d.conv1d_qk_norm`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .target import empty, interpreting, kernel, next_pow2


@kernel
def l2_norm_heads_kernel(p_x, p_out, n_rows, stride_x, D, BR: tl.constexpr, BD: tl.constexpr):
    """L2 norm of each row (one head) — the formula: reference/qk_norm.py.

    x: [R, D] rows of one head each (row stride ``stride_x``); out: [R, D] contiguous.
    Grid: (cdiv(R, BR),); BD = next_pow2(D).
    """
    i_r = tl.program_id(0)
    o_r = (i_r * BR + tl.arange(0, BR)).to(tl.int64)
    o_d = tl.arange(0, BD)
    m = (o_r < n_rows)[:, None] & (o_d < D)[None, :]
    b_x = tl.load(p_x + o_r[:, None] * stride_x + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    b_rn = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=1) + 1e-6)
    tl.store(p_out + o_r[:, None] * D + o_d[None, :], (b_x * b_rn[:, None]).to(p_out.dtype.element_ty), mask=m)


def _l2_norm_heads(x: torch.Tensor) -> torch.Tensor:
    """L2-normalise the last axis of x [..., H, d] (a view with unit stride on d)."""
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    R = rows.shape[0]
    out = empty(x.shape, x.dtype, x.device)
    BD = next_pow2(d)
    BR = min(next_pow2(R), max(1, 16384 // BD)) if interpreting(x) else max(1, min(16, 2048 // BD))
    l2_norm_heads_kernel[(triton.cdiv(R, BR),)](p_x=rows, p_out=out, n_rows=R, stride_x=rows.stride(0), D=d,
                                                BR=BR, BD=BD, num_warps=4)
    return out


def qk_norm(
    qkv_conv: torch.Tensor, num_k_heads: int, head_k_dim: int, num_v_heads: int, head_v_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage ``qk_norm``: split ``[Q | K | V]``, L2-normalise q and k per head (reference/qk_norm.py).

    qkv_conv: [..., T, conv_dim] (contiguous). Returns q, k [..., T, Hk, dk] (new tensors) and
    v [..., T, Hv, dv] (a view of qkv_conv).
    """
    key_dim = num_k_heads * head_k_dim
    qk = qkv_conv[..., :2 * key_dim].unflatten(-1, (2 * num_k_heads, head_k_dim))
    qk_hat = _l2_norm_heads(qk.contiguous() if qk.stride(-1) != 1 or not qkv_conv.is_contiguous() else qk)
    q, k = qk_hat[..., :num_k_heads, :], qk_hat[..., num_k_heads:, :]
    v = qkv_conv[..., 2 * key_dim:].unflatten(-1, (num_v_heads, head_v_dim))
    return q, k, v
