"""Stage 11, ``mlp``, sparse variant: the mixture-of-experts block on the Triton path. The formulas
and the tie rule live in reference/moe.py; this module mirrors its functions (name, argument order,
return tuple) on torch tensors.

The fused block (:func:`mlp_moe`), as an engine runs it:

1. one GEMM of h_norm with [W_router; w_shared_gate; W_shared_gate; W_shared_up] (router logits,
   the shared expert's gate logit and its gate/up projections at once), activation dtype;
2. :func:`routing_kernel`: softmax in fp32, top-k by repeated arg-max (ties to the lower index),
   renormalisation; routing weights fp32, selected experts int64;
3. the experts (gpu_impl/moe_gemm.py): slots grouped by expert, a grouped gate/up GEMM with the
   SwiGLU fused, a grouped down GEMM scaling each slot by its routing weight (fp32 results);
4. the shared expert: :func:`swiglu_kernel` on its gate/up columns, its down GEMM (torch);
5. :func:`combine_kernel`: each token's k slot rows summed in slot order, the shared expert's output
   scaled by sigmoid(gate logit), their sum; experts_out, shared_out and mlp_out rounded once each
   to the activation dtype from fp32.

Precision: activations, weights and GEMM outputs in the profile dtype; fp32 inside every kernel
(``tl.dot`` at :func:`.target.dot_precision`); routing weights and the slot outputs fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .moe_gemm import expert_slots
from .target import empty, interpreting, kernel, next_pow2


@kernel
def routing_kernel(
    p_l, s_l, p_w, p_sel, N, E,
    BR: tl.constexpr, BE: tl.constexpr, TOP_K: tl.constexpr, BKS: tl.constexpr, NORM: tl.constexpr,
):
    """Stage ``routing`` — the formula and tie rule: reference/moe.py.

    logits: [N, E] (row stride s_l, unit column stride), any float dtype; weights: [N, TOP_K] fp32;
    selected: [N, TOP_K] int64, both contiguous. Grid: (cdiv(N, BR),); BE = next_pow2(E),
    BKS = next_pow2(TOP_K).
    """
    i_r = tl.program_id(0)
    o_r = i_r * BR + tl.arange(0, BR)
    m_r = o_r < N
    o_e = tl.arange(0, BE)
    m_e = o_e < E
    b_l = tl.load(p_l + o_r.to(tl.int64)[:, None] * s_l + o_e[None, :], mask=m_r[:, None] & m_e[None, :],
                  other=float("-inf")).to(tl.float32)
    b_l = tl.where(m_r[:, None], b_l, 0.0)  # rows past N: finite, never stored
    b_x = tl.exp(b_l - tl.max(b_l, axis=1)[:, None])
    b_x = tl.where(m_e[None, :], b_x, 0.0)
    b_p = b_x / tl.sum(b_x, axis=1)[:, None]
    b_p = tl.where(m_e[None, :], b_p, -1.0)  # padding lanes are never chosen (probabilities are ≥ 0)
    o_j = tl.arange(0, BKS)
    b_w = tl.zeros((BR, BKS), dtype=tl.float32)
    b_s = tl.zeros((BR, BKS), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        b_best = tl.max(b_p, axis=1)
        b_idx = tl.min(tl.where(b_p == b_best[:, None], o_e[None, :], BE), axis=1)  # lower index on a tie
        b_w = tl.where(o_j[None, :] == j, b_best[:, None], b_w)
        b_s = tl.where(o_j[None, :] == j, b_idx[:, None], b_s)
        b_p = tl.where(o_e[None, :] == b_idx[:, None], -1.0, b_p)
    if NORM:
        b_w = b_w / tl.sum(b_w, axis=1)[:, None]
    m_o = m_r[:, None] & (o_j < TOP_K)[None, :]
    o_o = o_r.to(tl.int64)[:, None] * TOP_K + o_j[None, :]
    tl.store(p_w + o_o, b_w, mask=m_o)
    tl.store(p_sel + o_o, b_s.to(tl.int64), mask=m_o)


@kernel
def swiglu_kernel(p_g, p_u, s_r, p_out, N, I, BR: tl.constexpr, BI: tl.constexpr):
    """act = silu(gate) · up — reference/mlp.py. gate, up: [N, I] with row stride s_r (columns of
    one wider GEMM output); act: [N, I] contiguous. Grid: (cdiv(N, BR), cdiv(I, BI))."""
    i_r, i_i = tl.program_id(0), tl.program_id(1)
    o_r = (i_r * BR + tl.arange(0, BR)).to(tl.int64)
    o_i = i_i * BI + tl.arange(0, BI)
    m = (o_r < N)[:, None] & (o_i < I)[None, :]
    b_g = tl.load(p_g + o_r[:, None] * s_r + o_i[None, :], mask=m, other=0.0).to(tl.float32)
    b_u = tl.load(p_u + o_r[:, None] * s_r + o_i[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(p_out + o_r[:, None] * I + o_i[None, :], (b_g / (1.0 + tl.exp(-b_g)) * b_u).to(p_out.dtype.element_ty),
             mask=m)


@kernel
def combine_kernel(
    p_slots, p_sh, p_gl, s_gl, p_eo, p_so, p_mo, N, D, k,
    BR: tl.constexpr, BD: tl.constexpr, EXPERTS: tl.constexpr, SHARED: tl.constexpr,
):
    """experts_out = Σ_j slots[t·k + j] (slot order); shared_out = sigmoid(gate_logit) · shared;
    mlp_out = experts_out + shared_out (from fp32, one rounding each) — reference/moe.py.

    slots: [N·k, D] fp32; shared: [N, D] contiguous; gate logits: [N] with stride s_gl; outputs
    [N, D] contiguous, activation dtype. EXPERTS / SHARED: which parts run (both: all three
    outputs). Grid: (cdiv(N, BR), cdiv(D, BD)).
    """
    i_r, i_d = tl.program_id(0), tl.program_id(1)
    o_r = (i_r * BR + tl.arange(0, BR)).to(tl.int64)
    o_d = i_d * BD + tl.arange(0, BD)
    m = (o_r < N)[:, None] & (o_d < D)[None, :]
    o = o_r[:, None] * D + o_d[None, :]
    b_e = tl.zeros((BR, BD), dtype=tl.float32)
    b_s = tl.zeros((BR, BD), dtype=tl.float32)
    if EXPERTS:
        for j in range(0, k):
            b_e += tl.load(p_slots + (o_r[:, None] * k + j) * D + o_d[None, :], mask=m, other=0.0)
        tl.store(p_eo + o, b_e.to(p_eo.dtype.element_ty), mask=m)
    if SHARED:
        b_gl = tl.load(p_gl + o_r * s_gl, mask=o_r < N, other=0.0).to(tl.float32)
        b_s = tl.load(p_sh + o, mask=m, other=0.0).to(tl.float32) / (1.0 + tl.exp(-b_gl))[:, None]
        tl.store(p_so + o, b_s.to(p_so.dtype.element_ty), mask=m)
    if EXPERTS and SHARED:
        tl.store(p_mo + o, (b_e + b_s).to(p_mo.dtype.element_ty), mask=m)


def _rows_cols(x: torch.Tensor, n_rows: int, n_cols: int) -> tuple[int, int]:
    """(BR, BC) of the elementwise kernels: a whole row where it fits, ~4k elements per program."""
    if interpreting(x):
        BC = next_pow2(n_cols)
        return min(next_pow2(n_rows), max(1, 16384 // BC)), BC
    BC = min(1024, next_pow2(n_cols))
    return max(1, 4096 // BC), BC


def combine(slots, shared, gate_logit, n_tokens: int, D: int, k: int, dtype: torch.dtype, device):
    """Launch :func:`combine_kernel`; ``slots`` or ``shared`` may be None (that part skipped).

    Returns (experts_out, shared_out, mlp_out) as [N, D] tensors of ``dtype`` (None where skipped).
    """
    eo = empty((n_tokens, D), dtype, device) if slots is not None else None
    so = empty((n_tokens, D), dtype, device) if shared is not None else None
    mo = empty((n_tokens, D), dtype, device) if slots is not None and shared is not None else None
    anchor = slots if slots is not None else shared
    BR, BD = _rows_cols(anchor, n_tokens, D)
    dummy = anchor  # never read or written when its part is skipped
    combine_kernel[(triton.cdiv(n_tokens, BR), triton.cdiv(D, BD))](
        p_slots=slots if slots is not None else dummy, p_sh=shared if shared is not None else dummy,
        p_gl=gate_logit if gate_logit is not None else dummy,
        s_gl=gate_logit.stride(0) if gate_logit is not None else 0,
        p_eo=eo if eo is not None else dummy, p_so=so if so is not None else dummy,
        p_mo=mo if mo is not None else dummy, N=n_tokens, D=D, k=k,
        BR=BR, BD=BD, EXPERTS=slots is not None, SHARED=shared is not None, num_warps=4,
    )
    return eo, so, mo


def _swiglu(gate_up: torch.Tensor, I: int) -> torch.Tensor:
    """silu(gate_up[:, :I]) · gate_up[:, I:2I] for a [N, ≥ 2I] view with unit column stride."""
    N = gate_up.shape[0]
    out = empty((N, I), gate_up.dtype, gate_up.device)
    BR, BI = _rows_cols(gate_up, N, I)
    swiglu_kernel[(triton.cdiv(N, BR), triton.cdiv(I, BI))](
        p_g=gate_up, p_u=gate_up[:, I:], s_r=gate_up.stride(0), p_out=out, N=N, I=I, BR=BR, BI=BI, num_warps=4)
    return out


# --- the stages, mirroring reference/moe.py ----------------------------------------------------------


def router(h_norm: torch.Tensor, w_router: torch.Tensor) -> torch.Tensor:
    """Stage ``router``: one ``torch.matmul`` in the activation dtype. [..., T, D] -> [..., T, E]."""
    return torch.matmul(h_norm, w_router.t())


def routing(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage ``routing``. [..., T, E] -> routing_weights [..., T, top_k] fp32, selected_experts int64."""
    E = router_logits.shape[-1]
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}], found {top_k}")
    lead = router_logits.shape[:-1]
    logits = router_logits.reshape(-1, E)
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    N = logits.shape[0]
    weights = empty((*lead, top_k), torch.float32, logits.device)
    selected = empty((*lead, top_k), torch.int64, logits.device)
    BE = next_pow2(E)
    BR = min(next_pow2(N), max(1, (16384 if interpreting(logits) else 4096) // BE))
    routing_kernel[(triton.cdiv(N, BR),)](
        p_l=logits, s_l=logits.stride(0), p_w=weights, p_sel=selected, N=N, E=E, BR=BR, BE=BE, TOP_K=top_k,
        BKS=next_pow2(top_k), NORM=bool(norm_topk_prob), num_warps=4 if BR * BE <= 4096 else 8,
    )
    return weights, selected


def experts(
    h_norm: torch.Tensor,
    routing_weights: torch.Tensor,
    selected_experts: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    """Stage ``experts``: the grouped GEMMs, then the slot sum. [..., T, D] -> [..., T, D]."""
    D, k = h_norm.shape[-1], selected_experts.shape[-1]
    x = h_norm.reshape(-1, D).contiguous()
    slots = expert_slots(x, routing_weights.reshape(-1, k), selected_experts.reshape(-1, k), w_gate, w_up, w_down)
    eo, _, _ = combine(slots, None, None, x.shape[0], D, k, x.dtype, x.device)
    return eo.reshape(h_norm.shape)


def shared_expert(
    h_norm: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
    w_shared_expert_gate: torch.Tensor,
) -> torch.Tensor:
    """Stage ``shared_expert``: one GEMM for the gate logit and gate/up, SwiGLU, down GEMM, gate."""
    D, Is = h_norm.shape[-1], w_gate.shape[0]
    x = h_norm.reshape(-1, D).contiguous()
    y = torch.matmul(x, torch.cat([w_shared_expert_gate, w_gate, w_up], 0).t())
    down = torch.matmul(_swiglu(y[:, 1:], Is), w_down.t())
    _, so, _ = combine(None, down, y[:, 0], x.shape[0], D, 1, x.dtype, x.device)
    return so.reshape(h_norm.shape)


def mlp_moe(
    h_norm: torch.Tensor,
    w_router: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    w_shared_gate: torch.Tensor,
    w_shared_up: torch.Tensor,
    w_shared_down: torch.Tensor,
    w_shared_expert_gate: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sparse block, fused as the module docstring says (reference/moe.py ``mlp_moe``).

    h_norm: [..., T, D]; weights in the activation dtype (experts stacked: W_gate, W_up [E, I_moe, D],
    W_down [E, D, I_moe], unit last stride). Returns (router_logits, routing_weights,
    selected_experts, experts_out, shared_out, mlp_out); router_logits is a view of the first GEMM.
    """
    lead, D = h_norm.shape[:-1], h_norm.shape[-1]
    E, Is = w_router.shape[0], w_shared_gate.shape[0]
    x = h_norm.reshape(-1, D).contiguous()
    N = x.shape[0]
    w_in = torch.cat([w_router, w_shared_expert_gate, w_shared_gate, w_shared_up], 0)
    y = torch.matmul(x, w_in.t())  # [N, E + 1 + 2·I_shared]
    logits = y[:, :E]
    weights, selected = routing(logits, top_k, norm_topk_prob)
    slots = expert_slots(x, weights, selected, w_gate, w_up, w_down)
    shared = torch.matmul(_swiglu(y[:, E + 1:], Is), w_shared_down.t())
    eo, so, mo = combine(slots, shared, y[:, E], N, D, top_k, x.dtype, x.device)
    return (logits.unflatten(0, lead), weights.unflatten(0, lead), selected.unflatten(0, lead),
            eo.reshape(h_norm.shape), so.reshape(h_norm.shape), mo.reshape(h_norm.shape))
