"""The experts of the mixture-of-experts block as an engine runs them: the (token, slot) pairs
grouped by expert, then two grouped GEMM kernels over the groups (the formulas:
reference/moe.py `experts`).

Grouping runs on the device without host synchronisation: the N·k slots are sorted stably by expert
and cut into blocks of BM rows, listed in a block table of fixed length (`max_blocks`, the most any
routing can need; the extra blocks have no rows). `expert_gate_up_kernel` stores silu(gate) · up in
the activation dtype at the sorted rows; `expert_down_kernel` stores each slot's down projection,
scaled by its routing weight, in fp32 at the slot's own row of a [N·k, D] buffer (no atomics).

Design: docs/moe.md, "The Triton path" ("No host synchronisation", "The grouped GEMMs").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .target import dot_precision, empty, interpreting, kernel, next_pow2


@dataclass(frozen=True)
class Groups:
    """The slots sorted by expert and the block table of the grouped GEMMs (fixed length: the real
    blocks first, in expert order, then blocks of no rows)."""

    order: torch.Tensor  # [N·k] int32: slot ids, grouped by expert
    block_expert: torch.Tensor  # [n_blocks] int32 (0 for a block of no rows)
    block_row0: torch.Tensor  # [n_blocks] int32: first row of the block in ``order``
    block_rows: torch.Tensor  # [n_blocks] int32: real rows of the block (≤ BM; 0 past the real blocks)
    BM: int

    @property
    def n_blocks(self) -> int:
        """The table's length: the grid of the grouped GEMMs (a host number that reads no value)."""
        return int(self.block_expert.shape[0])


def max_blocks(n_slots: int, num_experts: int, BM: int) -> int:
    """The most blocks of BM rows any routing of ``n_slots`` slots over ``num_experts`` experts needs:
    Σ_e ⌈c_e / BM⌉ ≤ Σ_e (c_e + BM − 1) / BM over the at most min(E, n_slots) experts with c_e > 0."""
    return (n_slots + min(num_experts, n_slots) * (BM - 1)) // BM


def group_by_expert(selected_experts: torch.Tensor, num_experts: int, BM: int) -> Groups:
    """Sort the slots of ``selected_experts`` [..., k] by expert and cut each expert's run into BM rows.

    Only fixed-size device operations (a stable argsort, binary searches, a cumulative sum): nothing
    the host must read, and it runs on torch's ``meta`` device too (the compile check)."""
    flat = selected_experts.reshape(-1).to(torch.int64)
    dev, E = flat.device, num_experts
    order = torch.argsort(flat, stable=True)
    bounds = torch.searchsorted(flat[order], torch.arange(E + 1, device=dev))  # each expert's first sorted row
    counts = bounds[1:] - bounds[:-1]
    n_blk = (counts + BM - 1) // BM
    last = torch.cumsum(n_blk, 0)  # blocks of experts 0..e
    b = torch.arange(max_blocks(flat.shape[0], E, BM), device=dev)
    expert = torch.searchsorted(last, b, right=True)  # the first e with last[e] > b; E past the real blocks
    real = expert < E
    e = torch.clamp(expert, max=E - 1)
    local = b - (last[e] - n_blk[e])
    row0 = torch.where(real, bounds[e] + local * BM, 0)
    rows = torch.where(real, torch.clamp(counts[e] - local * BM, 0, BM), 0)
    i32 = torch.int32
    return Groups(order.to(i32), torch.where(real, e, 0).to(i32), row0.to(i32), rows.to(i32), BM)


@kernel
def expert_gate_up_kernel(
    p_x, p_order, p_bexp, p_brow0, p_brows, p_wg, p_wu, p_act, D, I, k,
    s_x, s_ge, s_gi, s_ue, s_ui,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
):
    """act[r] = silu(x[t] W_gate[e]ᵀ) · (x[t] W_up[e]ᵀ) for the block's rows r, t = order[r] // k.

    x: [N, D] (row stride s_x, unit column stride); W_gate, W_up: [E, I, D] (strides (s_ge, s_gi, 1),
    (s_ue, s_ui, 1)); act: [N·k, I] contiguous, activation dtype. fp32 accumulation.
    Grid: (n_blocks, cdiv(I, BN)).
    """
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    n_rows = tl.load(p_brows + i_b)
    if n_rows == 0:  # past the real blocks (the table's fixed length, group_by_expert)
        return
    e = tl.load(p_bexp + i_b).to(tl.int64)
    row0 = tl.load(p_brow0 + i_b).to(tl.int64)
    o_m = tl.arange(0, BM)
    m_m = o_m < n_rows
    o_t = (tl.load(p_order + row0 + o_m, mask=m_m, other=0) // k).to(tl.int64)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < I
    b_g = tl.zeros((BM, BN), dtype=tl.float32)
    b_u = tl.zeros((BM, BN), dtype=tl.float32)
    for i_k in range(0, tl.cdiv(D, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < D
        b_x = tl.load(p_x + o_t[:, None] * s_x + o_k[None, :], mask=m_m[:, None] & m_k[None, :],
                      other=0.0).to(tl.float32)
        m_w = m_k[:, None] & m_n[None, :]
        b_wg = tl.load(p_wg + e * s_ge + o_n[None, :].to(tl.int64) * s_gi + o_k[:, None], mask=m_w,
                       other=0.0).to(tl.float32)
        b_wu = tl.load(p_wu + e * s_ue + o_n[None, :].to(tl.int64) * s_ui + o_k[:, None], mask=m_w,
                       other=0.0).to(tl.float32)
        b_g = tl.dot(b_x, b_wg, b_g, input_precision=PREC)
        b_u = tl.dot(b_x, b_wu, b_u, input_precision=PREC)
    b_act = b_g / (1.0 + tl.exp(-b_g)) * b_u
    o_r = (row0 + o_m).to(tl.int64)
    tl.store(p_act + o_r[:, None] * I + o_n[None, :], b_act.to(p_act.dtype.element_ty),
             mask=m_m[:, None] & m_n[None, :])


@kernel
def expert_down_kernel(
    p_act, p_order, p_bexp, p_brow0, p_brows, p_wd, p_rw, p_out, D, I, s_de, s_dd,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
):
    """out[s] = routing_weight[s] · act[r] W_down[e]ᵀ for the block's rows r, slot s = order[r].

    act: [N·k, I] contiguous; W_down: [E, D, I] (strides (s_de, s_dd, 1)); routing weights: [N·k]
    fp32 in slot order; out: [N·k, D] fp32 contiguous. Grid: (n_blocks, cdiv(D, BN)).
    """
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    n_rows = tl.load(p_brows + i_b)
    if n_rows == 0:
        return
    e = tl.load(p_bexp + i_b).to(tl.int64)
    row0 = tl.load(p_brow0 + i_b).to(tl.int64)
    o_m = tl.arange(0, BM)
    m_m = o_m < n_rows
    o_r = (row0 + o_m).to(tl.int64)
    o_s = tl.load(p_order + o_r, mask=m_m, other=0).to(tl.int64)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < D
    b_y = tl.zeros((BM, BN), dtype=tl.float32)
    for i_k in range(0, tl.cdiv(I, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < I
        b_a = tl.load(p_act + o_r[:, None] * I + o_k[None, :], mask=m_m[:, None] & m_k[None, :],
                      other=0.0).to(tl.float32)
        b_w = tl.load(p_wd + e * s_de + o_n[None, :].to(tl.int64) * s_dd + o_k[:, None],
                      mask=m_k[:, None] & m_n[None, :], other=0.0).to(tl.float32)
        b_y = tl.dot(b_a, b_w, b_y, input_precision=PREC)
    b_rw = tl.load(p_rw + o_s, mask=m_m, other=0.0).to(tl.float32)
    tl.store(p_out + o_s[:, None] * D + o_n[None, :], b_y * b_rw[:, None], mask=m_m[:, None] & m_n[None, :])


def _tiles(x: torch.Tensor, rows_per_expert: float, n: int, k: int, prec: str, accumulators: int = 1
           ) -> tuple[int, int, int]:
    """(BM, BN, BK): BM ≥ 16 (tl.dot), smaller when few tokens reach each expert (decode). tf32x3
    (f32, f16) splits each operand in three: with the gate/up kernel's two accumulators, 64-wide
    tiles spilled on sm_90 (8 B per thread at BM = 16, 192 B at BM = 64; the compile check), so
    its N tile is halved there, and the K tile too at BM = 64."""
    if interpreting(x):
        return 16, min(64, next_pow2(n, 16)), min(64, next_pow2(k, 16))
    BM = 16 if rows_per_expert <= 16 else 32 if rows_per_expert <= 32 else 64
    BN = BK = 64
    if prec == "tf32x3" and accumulators > 1:
        BN, BK = 32, (32 if BM == 64 else 64)
    return BM, min(BN, next_pow2(n, 16)), min(BK, next_pow2(k, 16))


def expert_slots(
    x: torch.Tensor,
    routing_weights: torch.Tensor,
    selected_experts: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    """Every slot's weighted expert output: [N·k, D] fp32, row s = token s // k's (s % k)-th choice.

    x: [N, D] (unit column stride); routing_weights, selected_experts: [N, k]; W_gate, W_up:
    [E, I_moe, D], W_down: [E, D, I_moe] (unit last stride), all but the routing weights in the
    activation dtype.
    """
    N, D = x.shape
    k = selected_experts.shape[-1]
    E, I = w_gate.shape[0], w_gate.shape[1]
    for w in (w_gate, w_up, w_down):
        assert w.stride(-1) == 1, "expert weights need a unit stride on their last axis"
    prec = dot_precision(x.dtype)
    BM, BN, BK = _tiles(x, N * k / E, I, D, prec, accumulators=2)
    groups = group_by_expert(selected_experts, E, BM)
    act = empty((N * k, I), x.dtype, x.device)
    out = empty((N * k, D), torch.float32, x.device)
    g = {"p_order": groups.order, "p_bexp": groups.block_expert, "p_brow0": groups.block_row0,
         "p_brows": groups.block_rows}
    expert_gate_up_kernel[(groups.n_blocks, triton.cdiv(I, BN))](
        p_x=x, **g, p_wg=w_gate, p_wu=w_up, p_act=act, D=D, I=I, k=k, s_x=x.stride(0),
        s_ge=w_gate.stride(0), s_gi=w_gate.stride(1), s_ue=w_up.stride(0), s_ui=w_up.stride(1),
        BM=BM, BN=BN, BK=BK, PREC=prec, num_warps=4, num_stages=2,
    )
    _, BN, BK = _tiles(x, N * k / E, D, I, prec)
    rw = routing_weights.reshape(-1).to(torch.float32).contiguous()
    expert_down_kernel[(groups.n_blocks, triton.cdiv(D, BN))](
        p_act=act, **g, p_wd=w_down, p_rw=rw, p_out=out, D=D, I=I, s_de=w_down.stride(0), s_dd=w_down.stride(1),
        BM=BM, BN=BN, BK=BK, PREC=prec, num_warps=4, num_stages=2,
    )
    del act  # the caller's peak holds the slots, not the activations (gpu_impl/memory.py)
    return out
