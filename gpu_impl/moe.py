"""Stage 11, `mlp`, sparse variant: the mixture-of-experts block on the Triton path. The formulas
and the tie rule live in reference/moe.py; this module mirrors its functions (name, argument order,
return tuple) on torch tensors.

`moe_block` is the fused block as the Triton `Layer` runs it (weights stacked once, `MoEWeights`;
one GEMM for the router and the shared expert's projections, `routing_kernel`, the grouped expert
GEMMs of gpu_impl/moe_gemm.py, `shared_swiglu_kernel`, `combine_kernel`; token slices fitting
`MOE_BUDGET`; no host synchronisation); `mlp_moe` is the same code returning every tensor.
Activations, weights and GEMM outputs in the profile dtype, fp32 inside every kernel; routing
weights and the slot outputs fp32.

The steps, tiles, compile table and memory: docs/moe.md, "The Triton path".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdncheck.config import GDNConfig
from gdncheck.experts import (
    EXPERTS_DOWN,
    EXPERTS_GATE_UP,
    ROUTER,
    SHARED_DOWN,
    SHARED_EXPERT_GATE,
    SHARED_GATE,
    SHARED_UP,
)

from .moe_gemm import expert_slots
from .target import empty, interpreting, kernel, next_pow2

#: Bytes the per-slot buffers of one pass over the experts may take (the fp32 slot outputs and the
#: activations, :func:`slot_bytes_per_token`); a call with more tokens runs them in slices of tokens.
#: A token's rows meet no other token's in any sum, so slicing changes nothing but the tile shapes
#: the grouped GEMMs pick (tests/gpu_impl/test_layer_moe.py: within the bound of two forms).
MOE_BUDGET = 2 << 30


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
def shared_swiglu_kernel(p_g, p_u, s_r, p_out, N, I, BR: tl.constexpr, BI: tl.constexpr):
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
    BR: tl.constexpr, BD: tl.constexpr, EXPERTS: tl.constexpr, SHARED: tl.constexpr, PARTS: tl.constexpr,
):
    """experts_out = Σ_j slots[t·k + j] (slot order); shared_out = sigmoid(gate_logit) · shared;
    mlp_out = experts_out + shared_out (from fp32, one rounding each) — reference/moe.py.

    slots: [N·k, D] fp32; shared: [N, D] contiguous; gate logits: [N] with stride s_gl; outputs
    [N, D] contiguous, activation dtype. EXPERTS / SHARED: which parts run; with both, mlp_out is
    stored, and experts_out and shared_out too where PARTS (one part alone is always stored).
    Grid: (cdiv(N, BR), cdiv(D, BD)).
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
        if PARTS:
            tl.store(p_eo + o, b_e.to(p_eo.dtype.element_ty), mask=m)
    if SHARED:
        b_gl = tl.load(p_gl + o_r * s_gl, mask=o_r < N, other=0.0).to(tl.float32)
        b_s = tl.load(p_sh + o, mask=m, other=0.0).to(tl.float32) / (1.0 + tl.exp(-b_gl))[:, None]
        if PARTS:
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


def combine(slots, shared, gate_logit, n_tokens: int, D: int, k: int, dtype: torch.dtype, device, *,
            parts: bool = True, outputs: tuple | None = None):
    """Launch :func:`combine_kernel`; ``slots`` or ``shared`` may be None (that part skipped).

    Returns (experts_out, shared_out, mlp_out) as [N, D] tensors of ``dtype`` (None where skipped,
    and experts_out, shared_out None with both parts run and ``parts`` false). ``outputs``: the
    three tensors to write (contiguous [N, D], None where not written) instead of new ones.
    """
    both = slots is not None and shared is not None
    keep = parts or not both

    def out(i, wanted):
        if not wanted:
            return None
        return outputs[i] if outputs is not None else empty((n_tokens, D), dtype, device)

    eo, so, mo = out(0, slots is not None and keep), out(1, shared is not None and keep), out(2, both)
    anchor = slots if slots is not None else shared
    BR, BD = _rows_cols(anchor, n_tokens, D)
    dummy = anchor  # never read or written when its part is skipped
    combine_kernel[(triton.cdiv(n_tokens, BR), triton.cdiv(D, BD))](
        p_slots=slots if slots is not None else dummy, p_sh=shared if shared is not None else dummy,
        p_gl=gate_logit if gate_logit is not None else dummy,
        s_gl=gate_logit.stride(0) if gate_logit is not None else 0,
        p_eo=eo if eo is not None else dummy, p_so=so if so is not None else dummy,
        p_mo=mo if mo is not None else dummy, N=n_tokens, D=D, k=k,
        BR=BR, BD=BD, EXPERTS=slots is not None, SHARED=shared is not None, PARTS=keep, num_warps=4,
    )
    return eo, so, mo


def _swiglu(gate_up: torch.Tensor, I: int) -> torch.Tensor:
    """silu(gate_up[:, :I]) · gate_up[:, I:2I] for a [N, ≥ 2I] view with unit column stride."""
    N = gate_up.shape[0]
    out = empty((N, I), gate_up.dtype, gate_up.device)
    BR, BI = _rows_cols(gate_up, N, I)
    shared_swiglu_kernel[(triton.cdiv(N, BR), triton.cdiv(I, BI))](
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


def moe_sum(experts_out: torch.Tensor, shared_out: torch.Tensor) -> torch.Tensor:
    """Stage ``mlp`` of a layer with the sparse block (reference/moe.py ``moe_sum``): one add, one
    rounding (torch adds bf16/f16 in fp32, as the combine kernel does)."""
    return torch.add(experts_out, shared_out)


# --- the block as the Triton Layer runs it -------------------------------------------------------------


@dataclass(frozen=True)
class MoEWeights:
    """The sparse block's weights in the layout :func:`moe_block` reads (stacked once, not per call)."""

    w_in: torch.Tensor  # [E + 1 + 2·I_shared, D]: W_router; w_shared_expert_gate; W_shared_gate; W_shared_up
    w_gate: torch.Tensor  # [E, I_moe, D]: a view of gate_up_proj (unit last stride)
    w_up: torch.Tensor  # [E, I_moe, D]: a view of gate_up_proj
    w_down: torch.Tensor  # [E, D, I_moe]
    w_shared_down: torch.Tensor  # [D, I_shared]
    top_k: int
    norm_topk_prob: bool

    @property
    def num_experts(self) -> int:
        return int(self.w_gate.shape[0])

    @property
    def shared_size(self) -> int:
        return int(self.w_shared_down.shape[1])

    @classmethod
    def stack(cls, w_router, w_gate, w_up, w_down, w_shared_gate, w_shared_up, w_shared_down, w_shared_expert_gate,
              top_k: int, norm_topk_prob: bool = True) -> MoEWeights:
        w_in = torch.cat([w_router, w_shared_expert_gate, w_shared_gate, w_shared_up], 0).contiguous()
        return cls(w_in, w_gate, w_up, w_down, w_shared_down, int(top_k), bool(norm_topk_prob))

    @classmethod
    def from_params(cls, p: Mapping[str, torch.Tensor], cfg: GDNConfig) -> MoEWeights:
        """From the canonical weights (gdncheck/experts.py names), as the Layer holds them."""
        Im, gate_up = cfg.moe_intermediate_size, p[EXPERTS_GATE_UP]
        return cls.stack(p[ROUTER], gate_up[:, :Im], gate_up[:, Im:], p[EXPERTS_DOWN], p[SHARED_GATE], p[SHARED_UP],
                         p[SHARED_DOWN].contiguous(), p[SHARED_EXPERT_GATE], cfg.num_experts_per_tok,
                         cfg.norm_topk_prob)


def slot_bytes_per_token(top_k: int, D: int, I_moe: int, element_bytes: int) -> int:
    """Bytes of one token's per-slot buffers in a pass over the experts: k fp32 slot rows of D and
    k activation rows of I_moe (released before the combine)."""
    return top_k * (4 * D + element_bytes * I_moe)


def token_slice(n_tokens: int, top_k: int, D: int, I_moe: int, element_bytes: int, budget: int | None = None) -> int:
    """Tokens per pass over the experts: all of them, or as many as :data:`MOE_BUDGET` holds (≥ 1)."""
    per = slot_bytes_per_token(top_k, D, I_moe, element_bytes)
    return max(1, min(n_tokens, (MOE_BUDGET if budget is None else budget) // per))


def moe_block(h_norm: torch.Tensor, mw: MoEWeights, capture: bool = False) -> tuple[torch.Tensor, dict]:
    """The sparse block of one call: returns mlp_out [..., T, D] and, with ``capture``, the block's
    other tensors by name (router_logits, routing_weights, selected_experts, experts_out,
    shared_out); without it, {} and only mlp_out is ever stored.

    The first GEMM's output (router logits, the shared expert's gate logit and gate/up) lives until
    the combine has read the gate logit; the shared activation until its down GEMM; the slot
    buffers of a slice of tokens until their combine (gpu_impl/memory.py counts each).
    """
    lead, D = h_norm.shape[:-1], h_norm.shape[-1]
    E, Is, k = mw.num_experts, mw.shared_size, mw.top_k
    x = h_norm.reshape(-1, D).contiguous()
    N, dtype, dev = x.shape[0], x.dtype, x.device
    y = torch.matmul(x, mw.w_in.t())  # [N, E + 1 + 2·I_shared]
    weights, selected = routing(y[:, :E], k, mw.norm_topk_prob)
    act = _swiglu(y[:, E + 1:], Is)
    shared = torch.matmul(act, mw.w_shared_down.t())
    del act
    outs = (empty((N, D), dtype, dev) if capture else None, empty((N, D), dtype, dev) if capture else None,
            empty((N, D), dtype, dev))
    step = token_slice(N, k, D, mw.w_gate.shape[1], x.element_size())
    for t0 in range(0, N, step):
        t = slice(t0, min(N, t0 + step))
        slots = expert_slots(x[t], weights[t], selected[t], mw.w_gate, mw.w_up, mw.w_down)
        combine(slots, shared[t], y[t, E], t.stop - t0, D, k, dtype, dev, parts=capture,
                outputs=tuple(o[t] if o is not None else None for o in outs))
        del slots
    eo, so, mo = outs
    if not capture:
        return mo.reshape(h_norm.shape), {}
    parts = {"router_logits": y[:, :E].unflatten(0, lead), "routing_weights": weights.unflatten(0, lead),
             "selected_experts": selected.unflatten(0, lead), "experts_out": eo.reshape(h_norm.shape),
             "shared_out": so.reshape(h_norm.shape)}
    return mo.reshape(h_norm.shape), parts


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
    mw = MoEWeights.stack(w_router, w_gate, w_up, w_down, w_shared_gate, w_shared_up, w_shared_down,
                          w_shared_expert_gate, top_k, norm_topk_prob)
    mlp_out, t = moe_block(h_norm, mw, capture=True)
    return (t["router_logits"], t["routing_weights"], t["selected_experts"], t["experts_out"], t["shared_out"],
            mlp_out)
