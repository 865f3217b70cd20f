"""Stage 11, ``mlp``: the dense SwiGLU MLP; the activation is a Triton kernel, the GEMMs torch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .target import empty, interpreting, kernel, next_pow2


@kernel
def swiglu_kernel(p_gu, p_out, n_rows, I, BR: tl.constexpr, BI: tl.constexpr):
    """The SwiGLU activation of the MLP — the formula: reference/mlp.py.

    gate_up: [R, 2·I] contiguous, gate in columns [0, I), up in [I, 2·I); act: [R, I] contiguous.
    fp32 math, one rounding. Grid: (cdiv(R, BR), cdiv(I, BI)).
    """
    i_r, i_i = tl.program_id(0), tl.program_id(1)
    o_r = (i_r * BR + tl.arange(0, BR)).to(tl.int64)
    o_i = i_i * BI + tl.arange(0, BI)
    m = (o_r < n_rows)[:, None] & (o_i < I)[None, :]
    p_g = p_gu + o_r[:, None] * (2 * I) + o_i[None, :]
    b_g = tl.load(p_g, mask=m, other=0.0).to(tl.float32)
    b_u = tl.load(p_g + I, mask=m, other=0.0).to(tl.float32)
    b_act = b_g / (1.0 + tl.exp(-b_g)) * b_u
    tl.store(p_out + o_r[:, None] * I + o_i[None, :], b_act.to(p_out.dtype.element_ty), mask=m)


def stack_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """[W_gate; W_up]: [2·I, D], the weight of :func:`mlp_stacked`."""
    return torch.cat([w_gate, w_up], dim=0).contiguous()


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """The activation for gate_up [..., 2·I] (gate then up) -> [..., I] in gate_up's dtype."""
    I = gate_up.shape[-1] // 2
    gu = gate_up.reshape(-1, 2 * I).contiguous()
    R = gu.shape[0]
    out = empty((*gate_up.shape[:-1], I), gate_up.dtype, gate_up.device)
    if interpreting(gate_up):
        BI = next_pow2(I)
        BR = min(next_pow2(R), max(1, 16384 // BI))
    else:
        BI = min(1024, next_pow2(I))
        BR = max(1, 2048 // BI)
    swiglu_kernel[(triton.cdiv(R, BR), triton.cdiv(I, BI))](p_gu=gu, p_out=out, n_rows=R, I=I, BR=BR, BI=BI,
                                                             num_warps=4)
    return out


def mlp_stacked(h_norm: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Stage ``mlp`` with the stacked gate/up weight: two GEMMs in the activation dtype, SwiGLU between."""
    return torch.matmul(swiglu(torch.matmul(h_norm, w_gate_up.t())), w_down.t())


def mlp(h_norm: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Stage ``mlp`` (the formula: reference/mlp.py).

    h_norm: [..., T, D]; W_gate, W_up: [I, D]; W_down: [D, I], all one dtype. Returns [..., T, D].
    """
    return mlp_stacked(h_norm, stack_gate_up(w_gate, w_up), w_down)
