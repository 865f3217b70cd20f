"""Stage 6, ``delta_rule``: the gated delta rule, fused recurrent kernel (decode, short prefills).

The chunked prefill pipeline is in :mod:`.delta_rule_chunked`. Both take ``q, k, v, g, beta`` in
that order, as the reference does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .packed import Packed, Snapshots
from .target import empty, heads_per_program, interpreting, kernel, next_pow2, num_sms, reset_flags


@kernel
def delta_rule_recurrent_kernel(
    p_q, p_k, p_v, p_g, p_beta, p_h0, p_ht, p_o, p_reset, T, Hv, r, scale,
    sq_b, sq_t, sq_h, sv_b, sv_t, sv_h, DK, DV,
    BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr, INPLACE: tl.constexpr, HAS_RESET: tl.constexpr,
    p_cu=None, p_slots=None, p_snap=None, p_snap_cu=None, p_snap_off=None, p_snap_dst=None,
    VARLEN: tl.constexpr = False, STORE_FINAL: tl.constexpr = True, SNAPSHOTS: tl.constexpr = False,
    HB: tl.constexpr = 1, NBH=1,
):
    """The gated delta rule token by token — the formula: reference/delta_rule.py.

    q, k: [B, T, Hk, dk] (strides sq_*; unit stride on dk; value head h reads key head h // r);
    v: [B, T, Hv, dv] (strides sv_*); g, beta: [B, T, Hv] fp32 contiguous; h0, ht: [B, Hv, dk, dv]
    fp32 contiguous (ht may be h0: INPLACE); o (core): [B, T, Hv, dv] contiguous; HAS_RESET:
    rows b with reset[b] nonzero start from zeros instead of h0.
    Grid: (B·Hv, cdiv(dv, BV)) with HB = 1: the batch on the x axis, which has no 65535 limit. Each
    program keeps its [BK, BV] slice of the state of HB value heads in fp32 registers and loops
    over the T tokens. On a GPU HB is 1 (the compile table's form); the interpreter takes every head
    of every row in one program (its cost is its count of operations): the (row, head) pairs then
    sit side by side on the value axis, HB blocks of BV lanes, each lane with its own row, head,
    gate, key and query; grid (cdiv(NBH, HB), cdiv(dv, BV)), NBH = B·Hv pairs (a last group's lanes
    past NBH are masked).

    VARLEN (packed sequences, docs/serving.md): B = 1 and the T tokens are N sequences, sequence n
    being rows cu[n] .. cu[n+1] - 1; "rows" b of the grid are sequences. h0 and ht are a pool
    [S, Hv, dk, dv]: sequence n reads and writes row slots[n], and a slot < 0 (padding) is read as
    zeros and never written; reset[n] is per sequence. STORE_FINAL False: the final state is not
    written (a speculative verify). SNAPSHOTS: the state after token snap_off[m] of sequence n,
    for m in snap_cu[n] .. snap_cu[n+1] - 1 (offsets increasing), goes to row snap_dst[m] of
    snap [R, Hv, dk, dv]. With HB > 1 a program's heads are those of one sequence (grid
    (N·cdiv(Hv, HB), cdiv(dv, BV))): sequences differ in length.
    """
    i_bh, i_v = tl.program_id(0), tl.program_id(1)
    NG = (Hv + HB - 1) // HB
    i_b = i_bh // NG
    o_k = tl.arange(0, BK)
    m_k = o_k < DK
    if HB == 1:  # one head: scalars, and the key and query vectors broadcast over the value axis
        i_h = i_bh % NG
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < DV
        o_hk = (i_h // r) * sq_h
        o_kk = o_k
    else:  # lane l of the value axis: head i_h[l], column o_v[l]; its key and query are [BK, lanes]
        o_l = tl.arange(0, HB * BV)
        o_v = i_v * BV + o_l % BV
        if VARLEN:  # the heads of sequence i_b
            i_h = (i_bh % NG) * HB + o_l // BV
            m_v = (o_v < DV) & (i_h < Hv)
        else:  # (row, head) pairs of the whole batch, row i_b[l]; lanes past the last pair read pair
            # NBH - 1 (valid addresses) and store nothing
            o_bh = i_bh * HB + o_l // BV
            m_v = (o_v < DV) & (o_bh < NBH)
            o_bh = tl.minimum(o_bh, NBH - 1)
            i_b = o_bh // Hv
            i_h = o_bh % Hv
        o_hk = (i_h // r)[None, :] * sq_h
        o_kk = o_k[:, None]
    m_h = m_k[:, None] & m_v[None, :]
    m_qk = m_k if HB == 1 else m_h
    if VARLEN:
        bos = tl.load(p_cu + i_b).to(tl.int64)
        n_tok = tl.load(p_cu + i_b + 1).to(tl.int64) - bos
        slot = tl.load(p_slots + i_b).to(tl.int64)
        # padding: never read, never written (a bound, not a scalar `&`: the interpreter makes that int32)
        m_slot = m_k[:, None] & (o_v < DV * (slot >= 0).to(tl.int32))[None, :]
        if HB > 1:
            m_slot = m_slot & m_v[None, :]
        o_h = _state_offsets((tl.maximum(slot, 0) * Hv + i_h) * DK * DV, o_k, o_v, DV, HB)
        b_h = load_state(p_h0, o_h, m_slot, p_reset, i_b, BK, HB * BV, HAS_H0, HAS_RESET)
        p_qt = p_q + bos * sq_t + o_hk + o_kk
        p_kt = p_k + bos * sq_t + o_hk + o_kk
        p_vt = p_v + bos * sv_t + i_h * sv_h + o_v
        p_gt = p_g + bos * Hv + i_h
        p_bt = p_beta + bos * Hv + i_h
        p_ot = p_o + (bos * Hv + i_h) * DV + o_v
    else:
        n_tok = T
        m_slot = m_h
        o_h = _state_offsets((i_b.to(tl.int64) * Hv + i_h) * DK * DV, o_k, o_v, DV, HB)
        b_h = load_state(p_h0, o_h, m_h, p_reset, i_b, BK, HB * BV, HAS_H0, HAS_RESET)
        # pointers of token 0, advanced by one token per step
        if HB == 1:
            o_bq = i_b.to(tl.int64) * sq_b
        else:
            o_bq = (i_b.to(tl.int64) * sq_b)[None, :]
        p_qt = p_q + o_bq + o_hk + o_kk
        p_kt = p_k + o_bq + o_hk + o_kk
        p_vt = p_v + i_b.to(tl.int64) * sv_b + i_h * sv_h + o_v
        p_gt = p_g + i_b.to(tl.int64) * T * Hv + i_h
        p_bt = p_beta + i_b.to(tl.int64) * T * Hv + i_h
        p_ot = p_o + (i_b.to(tl.int64) * T * Hv + i_h) * DV + o_v
    if SNAPSHOTS:  # the next requested offset of this sequence (-1: none left)
        i_snap = tl.load(p_snap_cu + i_b)
        snap_end = tl.load(p_snap_cu + i_b + 1)
        snap_next = tl.load(p_snap_off + i_snap, mask=i_snap < snap_end, other=-1)
    for t in range(n_tok):
        b_q = tl.load(p_qt, mask=m_qk, other=0.0).to(tl.float32)
        b_k = tl.load(p_kt, mask=m_qk, other=0.0).to(tl.float32)
        b_v = tl.load(p_vt, mask=m_v, other=0.0).to(tl.float32)
        if HB == 1:
            b_g = tl.load(p_gt)
            b_beta = tl.load(p_bt)
            b_q = b_q[:, None]
            b_k = b_k[:, None]
        else:
            b_g = tl.load(p_gt, mask=m_v, other=0.0)[None, :]
            b_beta = tl.load(p_bt, mask=m_v, other=0.0)
        b_h *= tl.exp(b_g)
        b_delta = b_beta * (b_v - tl.sum(b_h * b_k, axis=0))
        b_h += b_k * b_delta[None, :]
        b_o = tl.sum(b_h * b_q, axis=0) * scale
        tl.store(p_ot, b_o.to(p_o.dtype.element_ty), mask=m_v)
        p_qt += sq_t
        p_kt += sq_t
        p_vt += sv_t
        p_gt += Hv
        p_bt += Hv
        p_ot += Hv * DV
        if SNAPSHOTS:
            if t + 1 == snap_next:
                dst = tl.load(p_snap_dst + i_snap).to(tl.int64)
                o_snap = _state_offsets((dst * Hv + i_h) * DK * DV, o_k, o_v, DV, HB)
                tl.store(p_snap + o_snap, b_h, mask=m_h)
                i_snap += 1
                snap_next = tl.load(p_snap_off + i_snap, mask=i_snap < snap_end, other=-1)
    if STORE_FINAL:
        if INPLACE:
            tl.debug_barrier()  # every thread of this program has read its slice of h0
        tl.store(p_ht + o_h, b_h, mask=m_slot)


@triton.jit
def _state_offsets(o_head, o_k, o_v, DV, HB: tl.constexpr):
    """Offsets of a [BK, lanes] state slice: o_head is the head's first element (a scalar with one
    head per program, one per lane with several)."""
    if HB == 1:
        o_head2 = o_head
    else:
        o_head2 = o_head[None, :]
    return o_head2 + o_k[:, None] * DV + o_v[None, :]


@triton.jit
def load_state(p_h0, o_h, m_h, p_reset, i_b, BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
               HAS_RESET: tl.constexpr):
    """A [BK, BV] slice of the initial state in fp32: zeros without one, or where row i_b is reset."""
    if HAS_H0:
        b_h = tl.load(p_h0 + o_h, mask=m_h, other=0.0).to(tl.float32)
        if HAS_RESET:  # a select, not a product: a reset row's NaN or inf must not survive
            b_h = tl.where(tl.load(p_reset + i_b) == 0, b_h, 0.0)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    return b_h


def head_strides(t: torch.Tensor, prefix: str) -> dict[str, int]:
    """Strides of a [B, T, H, d] tensor as the kernels name them: {prefix_b, prefix_t, prefix_h}."""
    return {f"{prefix}_b": t.stride(0), f"{prefix}_t": t.stride(1), f"{prefix}_h": t.stride(2)}


def check_delta_inputs(q, k, v, g, beta, initial_state):
    """Shapes of the delta rule's arguments; returns B, T, Hk, Hv, dk, dv."""
    B, T, Hv, dv = v.shape
    Hk, dk = q.shape[-2:]
    if q.shape != (B, T, Hk, dk) or k.shape != q.shape or g.shape != (B, T, Hv) or beta.shape != g.shape:
        raise ValueError(
            f"delta_rule: expected q, k [B, T, Hk, dk], v [B, T, Hv, dv], g, beta [B, T, Hv]; found "
            f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}, {list(g.shape)}, {list(beta.shape)}"
        )
    if Hv % Hk:
        raise ValueError(f"delta_rule: Hv={Hv} is not a multiple of Hk={Hk}")
    if q.stride() != k.stride() or q.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("delta_rule: expected q and k with equal strides and unit stride on the head dims")
    if initial_state is not None and initial_state.shape != (B, Hv, dk, dv):
        raise ValueError(f"delta_rule: expected initial_state [B, Hv, dk, dv] = {[B, Hv, dk, dv]}, "
                         f"found {list(initial_state.shape)}")
    return B, T, Hk, Hv, dk, dv


def prepare_state(initial_state, out_state, shape, device):
    """(h0 to read or None, ht to write, in place?) as fp32 contiguous tensors."""
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    if out_state is None:
        return h0, empty(shape, torch.float32, device), False
    if out_state.dtype != torch.float32 or not out_state.is_contiguous() or out_state.shape != shape:
        raise ValueError(f"delta_rule: out_state must be a contiguous fp32 tensor of shape {list(shape)}")
    return h0, out_state, h0 is not None and h0.data_ptr() == out_state.data_ptr()


#: Elements of one interpreted program's state slice (dk × heads × dv): Qwen3.5's heads of 128 × 128
#: sixteen at a time.
_INTERPRETER_STATE = 1 << 18


def recurrent_heads(v: torch.Tensor, Hv: int, BK: int, BV: int, asked: int | None = None) -> int:
    """Value heads (``Hv``: those of the whole batch, B·Hv, in a padded call; of one sequence in a
    packed call) per program of :func:`delta_rule_recurrent_kernel` (a power of two): ``asked``
    if given (tests run each form), 1 on a GPU (the compile table's form), in the interpreter as
    many as fit ``_INTERPRETER_STATE``: its cost is one Python step per operation of a program,
    whatever the width of its tiles, and a token step of one head costs what one of all does."""
    return heads_per_program(v, "delta_rule", Hv, BK * BV, _INTERPRETER_STATE, asked)


def recurrent_block_v(v: torch.Tensor, B: int, Hv: int, dv: int) -> int:
    """dv columns per program: all of them under the interpreter (fewest programs); on a GPU the
    widest block that still gives every SM two programs (more parallelism for small batches)."""
    if interpreting(v):
        return next_pow2(dv)
    for bv in (64, 32, 16):
        if bv <= next_pow2(dv) and B * Hv * triton.cdiv(dv, bv) >= 2 * num_sms(v):
            return bv
    return min(8, next_pow2(dv))


def delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    *,
    out_state: torch.Tensor | None = None,
    block_v: int | None = None,
    reset: torch.Tensor | None = None,
    heads_per_program: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule, one token at a time (reference/delta_rule.py).

    q, k: [B, T, Hk, dk] (L2-normalised, unscaled); v: [B, T, Hv, dv]; g, beta: [B, T, Hv] (fp32);
    initial_state: [B, Hv, dk, dv] or None (zeros); scale defaults to dk^-0.5. Returns core
    [B, T, Hv, dv] in v's dtype and the final state [B, Hv, dk, dv] fp32. ``out_state`` receives
    the final state (it may be ``initial_state`` itself: an in-place update); ``block_v`` overrides
    the dv block (benchmarks); ``reset`` [B] bool: rows that start from zeros instead of
    ``initial_state`` (the layer's seq_pos rule, read by the kernel, so no pass rewrites the state);
    ``heads_per_program`` overrides :func:`recurrent_heads` (tests).
    """
    B, T, Hk, Hv, dk, dv = check_delta_inputs(q, k, v, g, beta, initial_state)
    scale = dk ** -0.5 if scale is None else float(scale)
    h0, ht, inplace = prepare_state(initial_state, out_state, (B, Hv, dk, dv), v.device)
    core = empty((B, T, Hv, dv), v.dtype, v.device)
    BK = next_pow2(dk)
    BV = block_v or recurrent_block_v(v, B, Hv, dv)
    HB = recurrent_heads(v, B * Hv, BK, BV, heads_per_program)
    g, beta = g.to(torch.float32).contiguous(), beta.to(torch.float32).contiguous()
    fold = {} if HB == 1 else {"NBH": B * Hv}  # HB > 1: the batch's (row, head) pairs, HB per program
    delta_rule_recurrent_kernel[(triton.cdiv(B * Hv, HB), triton.cdiv(dv, BV))](
        p_q=q, p_k=k, p_v=v, p_g=g, p_beta=beta, p_h0=h0 if h0 is not None else ht, p_ht=ht, p_o=core,
        p_reset=ht if reset is None else reset_flags(reset), T=T, Hv=Hv, r=Hv // Hk, scale=scale,
        **head_strides(q, "sq"), **head_strides(v, "sv"), DK=dk, DV=dv, BK=BK, BV=BV, HAS_H0=h0 is not None,
        INPLACE=inplace, HAS_RESET=reset is not None, HB=HB, **fold, num_warps=max(1, min(8, BK * BV // 1024)),
    )
    return core, ht


def delta_rule_recurrent_packed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    pool: torch.Tensor,
    scale: float | None,
    packed: Packed,
    *,
    store_final: bool = True,
    snapshots: Snapshots | None = None,
    snap_out: torch.Tensor | None = None,
    block_v: int | None = None,
    heads_per_program: int | None = None,
) -> torch.Tensor:
    """The recurrent form over a packed stream of N sequences (docs/serving.md), states in pool slots.

    q, k: [1, total, Hk, dk]; v: [1, total, Hv, dv]; g, beta: [1, total, Hv]; pool: the recurrent
    states [S, Hv, dk, dv] fp32 contiguous, read at ``packed.slots`` (zeros for padding and reset
    sequences) and, with ``store_final``, written there in place (padding never). ``snapshots``:
    states after given tokens, to rows of ``snap_out`` [R, Hv, dk, dv] fp32. Returns core
    [1, total, Hv, dv] in v's dtype.
    """
    B, total, Hk, Hv, dk, dv = check_delta_inputs(q, k, v, g, beta, None)
    if B != 1 or total != packed.total:
        raise ValueError(f"delta_rule (packed): expected one stream of {packed.total} tokens, found {list(q.shape)}")
    check_pool(pool, Hv, dk, dv)
    scale = dk ** -0.5 if scale is None else float(scale)
    core = empty((1, total, Hv, dv), v.dtype, v.device)
    N = packed.n
    BK = next_pow2(dk)
    BV = block_v or recurrent_block_v(v, N, Hv, dv)
    HB = recurrent_heads(v, Hv, BK, BV, heads_per_program)
    g, beta = g.to(torch.float32).contiguous(), beta.to(torch.float32).contiguous()
    snap = {} if snapshots is None else dict(
        p_snap=snap_out, p_snap_cu=snapshots.cu, p_snap_off=snapshots.off, p_snap_dst=snapshots.dst, SNAPSHOTS=True)
    delta_rule_recurrent_kernel[(N * triton.cdiv(Hv, HB), triton.cdiv(dv, BV))](
        p_q=q, p_k=k, p_v=v, p_g=g, p_beta=beta, p_h0=pool, p_ht=pool, p_o=core,
        p_reset=pool if packed.reset is None else packed.reset, T=total, Hv=Hv, r=Hv // Hk, scale=scale,
        **head_strides(q, "sq"), **head_strides(v, "sv"), DK=dk, DV=dv, BK=BK, BV=BV, HAS_H0=True,
        INPLACE=store_final, HAS_RESET=packed.reset is not None, p_cu=packed.cu, p_slots=packed.slots,
        VARLEN=True, STORE_FINAL=store_final, **snap, HB=HB, num_warps=max(1, min(8, BK * BV // 1024)),
    )
    return core


def check_pool(pool: torch.Tensor, Hv: int, dk: int, dv: int) -> None:
    if pool.dim() != 4 or tuple(pool.shape[1:]) != (Hv, dk, dv) or pool.dtype != torch.float32 or \
            not pool.is_contiguous():
        raise ValueError(f"delta_rule (packed): expected a contiguous fp32 pool [S, {Hv}, {dk}, {dv}], found "
                         f"{pool.dtype} {list(pool.shape)}")
