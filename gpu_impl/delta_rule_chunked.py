"""Stage 6, `delta_rule`, chunked (WY / UT-transform) prefill: the same function as
`delta_rule.delta_rule_recurrent`, as matrix products over chunks of C tokens (C = 16, 32 or 64).
The formulas are in reference/delta_rule_chunked.py.

Two kernels: `chunk_wu_kernel` (per chunk, in parallel: the masked system, its solve, W, U and the
decayed Q Kᵀ) and `chunk_state_kernel` (per dv block, a loop over the chunks carrying the fp32
state in registers). The fp32 intermediates, `temp_bytes_per_token` per token of a row, are
processed in slices of rows that fit `TEMP_BUDGET`.

Design (the block-recursive solve, the masks, the figures): docs/gpu.md §11.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .delta_rule import check_delta_inputs, check_pool, head_strides, load_state, prepare_state
from .packed import Packed, Snapshots, find_segment
from .target import dot_precision, empty, interpreting, kernel, next_pow2, num_sms, reset_flags

CHUNK_SIZES = (16, 32, 64)


@kernel
def chunk_wu_kernel(
    p_q, p_k, p_v, p_g, p_beta, p_gc, p_gt, p_w, p_u, p_aqk, T, NT, Hv, r, BH0,
    sq_b, sq_t, sq_h, sv_b, sv_t, sv_h, DK, DV,
    BT: tl.constexpr, LOG2_BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
    p_cu=None, p_cuc=None, N=1, n_steps=1, VARLEN: tl.constexpr = False,
):
    """Per chunk: γ, the UT transform (I + A)⁻¹, W, U and Q Kᵀ ⊙ e^D — reference/delta_rule_chunked.py.

    q, k: [B, T, Hk, dk]; v: [B, T, Hv, dv] (strided, unit stride on the head dim); g, beta:
    [B, T, Hv] fp32. Rows (sequence, value head) BH0, BH0 + 1, ... of this launch; out, fp32
    contiguous, indexed by the row within the launch (n): gc (γ_t = Σ_{u≤t} g_u) and gt
    (Σ_{u>t} g_u) [n, T]; w [n, T, dk]; u [n, T, dv]; aqk [n, T, BT] (row t holds its chunk's
    columns). Grid: (n · NT,), NT = cdiv(T, BT), chunks of one row adjacent.
    BK = next_pow2(dk), BV = next_pow2(dv), both ≥ 32: each is used in two halves (tl.dot needs 16).

    VARLEN (packed sequences, gpu_impl/packed.py): B = 1, rows are value heads, and the T tokens
    are N sequences (offsets cu [N + 1]) cut into chunks from each sequence's first token; chunk
    i_n of the stream is found in cuc [N + 1] (chunks before each sequence), NT is the number of
    chunks or a bound of it, and a program past the last chunk stores nothing.
    """
    i_p = tl.program_id(0)
    i_row = i_p // NT
    i_n = i_p % NT
    if VARLEN:
        i_seq = find_segment(p_cuc, i_n, N, n_steps)
        t_start = tl.load(p_cu + i_seq) + (i_n - tl.load(p_cuc + i_seq)) * BT
        # past the last chunk (the grid may be a bound): no token
        t_end = tl.where(i_n < tl.load(p_cuc + N), tl.load(p_cu + i_seq + 1), t_start)
        i_b = i_p * 0
        i_h = BH0 + i_row
    else:
        i_bh = BH0 + i_row
        i_b = i_bh // Hv
        i_h = i_bh % Hv
    i_hk = i_h // r
    o_i = tl.arange(0, BT)
    if VARLEN:
        o_t = t_start + o_i
        m_t = o_t < t_end
    else:
        o_t = i_n * BT + o_i
        m_t = o_t < T
    BK2: tl.constexpr = BK // 2
    BV2: tl.constexpr = BV // 2
    o_k = tl.arange(0, BK2)  # a half of dk (of dv); + BK2 (+ BV2): the other
    o_v = tl.arange(0, BV2)
    m_tk = m_t[:, None] & (o_k < DK)[None, :]
    m_tk2 = m_t[:, None] & (o_k + BK2 < DK)[None, :]
    m_tv = m_t[:, None] & (o_v < DV)[None, :]
    m_tv2 = m_t[:, None] & (o_v + BV2 < DV)[None, :]
    o_row = i_row.to(tl.int64) * T  # this row's first token in the temporaries

    b_g = tl.load(p_g + (i_b.to(tl.int64) * T + o_t) * Hv + i_h, mask=m_t, other=0.0)
    b_beta = tl.load(p_beta + (i_b.to(tl.int64) * T + o_t) * Hv + i_h, mask=m_t, other=0.0)
    b_gc = tl.cumsum(b_g, axis=0)
    m_lower = o_i[:, None] >= o_i[None, :]
    m_strict = o_i[:, None] > o_i[None, :]
    # log-decay between tokens D[t, s] = Σ_{s<u≤t} g_u, summed over the gap rather than taken as
    # γ_t − γ_s (same-sign sums keep every factor accurate when γ itself is large); zero above the
    # diagonal, so no positive exponent reaches exp, and the mask is applied again after it
    b_D = tl.cumsum(tl.where(m_strict, b_g[:, None], 0.0), axis=0)
    b_E = tl.where(m_lower, tl.exp(b_D), 0.0)
    # Σ_{u>t} g_u over the chunk: the last row of D (missing tokens have g = 0)
    b_tail = tl.sum(tl.where(o_i[:, None] == BT - 1, b_D, 0.0), axis=0)
    tl.store(p_gc + o_row + o_t, b_gc, mask=m_t)
    tl.store(p_gt + o_row + o_t, b_tail, mask=m_t)

    # Q Kᵀ and K Kᵀ accumulated over the two halves of dk (BK ≥ 32): no [BT, BK] tile is live, a
    # [BT, BK/2] one at a time (docs/gpu.md §3); q is not needed again, k is loaded again for W
    o_qk = i_b.to(tl.int64) * sq_b + o_t[:, None].to(tl.int64) * sq_t + i_hk * sq_h + o_k[None, :]
    b_k = tl.load(p_k + o_qk, mask=m_tk, other=0.0).to(tl.float32)
    b_qk = tl.dot(tl.load(p_q + o_qk, mask=m_tk, other=0.0).to(tl.float32), tl.trans(b_k), input_precision=PREC)
    b_kk = tl.dot(b_k, tl.trans(b_k), input_precision=PREC)
    b_k = tl.load(p_k + o_qk + BK2, mask=m_tk2, other=0.0).to(tl.float32)
    b_qk += tl.dot(tl.load(p_q + o_qk + BK2, mask=m_tk2, other=0.0).to(tl.float32), tl.trans(b_k),
                   input_precision=PREC)
    b_kk += tl.dot(b_k, tl.trans(b_k), input_precision=PREC)
    tl.store(p_aqk + (o_row + o_t[:, None]) * BT + o_i[None, :], tl.where(m_lower, b_qk * b_E, 0.0),
             mask=m_t[:, None])
    b_A = tl.where(m_strict, b_beta[:, None] * b_kk * b_E, 0.0)

    # (I + A)^-1 by block recursion: X <- X - X (A ⊙ M_s) X for s = 1, 2, ..., BT/2. Level s = 1
    # starts from X = I and gives I - A ⊙ M_1 (inverse of [[1, 0], [a, 1]]): no product needed
    m_1 = ((o_i[:, None] // 2) == (o_i[None, :] // 2)) & (o_i[:, None] > o_i[None, :])
    b_X = tl.where(o_i[:, None] == o_i[None, :], 1.0, 0.0) - tl.where(m_1, b_A, 0.0)
    for i_s in tl.static_range(1, LOG2_BT):
        s = 1 << i_s
        m_s = ((o_i[:, None] // (2 * s)) == (o_i[None, :] // (2 * s))) & (
            ((o_i[:, None] // s) % 2) > ((o_i[None, :] // s) % 2))
        b_XA = tl.dot(b_X, tl.where(m_s, b_A, 0.0), input_precision=PREC)
        b_X = b_X - tl.dot(b_XA, b_X, input_precision=PREC)

    # W = X (β e^γ ⊙ K) and U = X (β ⊙ V), a half of dk (dv) at a time; k again (from L2): not
    # holding it through the solve leaves registers to the C x C tiles
    b_s = (b_beta * tl.exp(b_gc))[:, None]
    o_tw = (o_row + o_t[:, None]) * DK + o_k[None, :]
    b_k = tl.load(p_k + o_qk, mask=m_tk, other=0.0).to(tl.float32)
    tl.store(p_w + o_tw, tl.dot(b_X, b_k * b_s, input_precision=PREC), mask=m_tk)
    b_k = tl.load(p_k + o_qk + BK2, mask=m_tk2, other=0.0).to(tl.float32)
    tl.store(p_w + o_tw + BK2, tl.dot(b_X, b_k * b_s, input_precision=PREC), mask=m_tk2)
    o_v_in = i_b.to(tl.int64) * sv_b + o_t[:, None].to(tl.int64) * sv_t + i_h * sv_h + o_v[None, :]
    o_tu = (o_row + o_t[:, None]) * DV + o_v[None, :]
    b_v = tl.load(p_v + o_v_in, mask=m_tv, other=0.0).to(tl.float32)
    tl.store(p_u + o_tu, tl.dot(b_X, b_v * b_beta[:, None], input_precision=PREC), mask=m_tv)
    b_v = tl.load(p_v + o_v_in + BV2, mask=m_tv2, other=0.0).to(tl.float32)
    tl.store(p_u + o_tu + BV2, tl.dot(b_X, b_v * b_beta[:, None], input_precision=PREC), mask=m_tv2)


@triton.jit
def _rows(m_t, o_kp, DK, J: tl.constexpr, BKP: tl.constexpr):
    """Mask of a [BT, BKP] tile of part J of dk (columns J·BKP + o_kp) for tokens m_t."""
    return m_t[:, None] & (o_kp + J * BKP < DK)[None, :]


@triton.jit
def _part_store(p, o, b_h, o_kp, DK, DV, m_col, J: tl.constexpr, BKP: tl.constexpr):
    """Store part J (rows J·BKP ...) of a state slice; o: offsets of part 0, m_col: [1, BV] columns."""
    tl.store(p + o + J * BKP * DV, b_h, mask=(o_kp + J * BKP < DK)[:, None] & m_col)


@triton.jit
def _state_load(p_h0, o_h, o_kp, DK, DV, m_col, p_reset, i_b, J: tl.constexpr, BKP: tl.constexpr, BV: tl.constexpr,
                HAS_H0: tl.constexpr, HAS_RESET: tl.constexpr):
    return load_state(p_h0, o_h + J * BKP * DV, (o_kp + J * BKP < DK)[:, None] & m_col, p_reset, i_b, BKP, BV,
                      HAS_H0, HAS_RESET)


@triton.jit
def _minus_wh(b_vn, p_w, o_tw, m_t, o_kp, DK, b_h, J: tl.constexpr, BKP: tl.constexpr, PREC: tl.constexpr):
    """V' − W_J S_J: part J of W ([BT, BKP], fp32) times part J of the state."""
    b_w = tl.load(p_w + o_tw + J * BKP, mask=_rows(m_t, o_kp, DK, J, BKP), other=0.0)
    return b_vn - tl.dot(b_w, b_h, input_precision=PREC)


@triton.jit
def _plus_qh(b_o, p_qk, o_tq, m_t, o_kp, DK, b_h, J: tl.constexpr, BKP: tl.constexpr, PREC: tl.constexpr, b_rows=1.0):
    """O + (b_rows ⊙ Q_J) S_J."""
    b_q = tl.load(p_qk + o_tq + J * BKP, mask=_rows(m_t, o_kp, DK, J, BKP), other=0.0).to(tl.float32) * b_rows
    return b_o + tl.dot(b_q, b_h, input_precision=PREC)


@triton.jit
def _kv(p_kk, o_tq, m_t, o_kp, DK, b_vs, J: tl.constexpr, BKP: tl.constexpr, PREC: tl.constexpr, b_rows=1.0):
    """(b_rows ⊙ K_J)ᵀ V_s ([BKP, BV]): part J of a chunk's state update."""
    b_k = tl.load(p_kk + o_tq + J * BKP, mask=_rows(m_t, o_kp, DK, J, BKP), other=0.0).to(tl.float32) * b_rows
    return tl.dot(tl.trans(b_k), b_vs, input_precision=PREC)


@kernel
def chunk_state_kernel(
    p_q, p_k, p_gc, p_gt, p_w, p_u, p_aqk, p_h0, p_ht, p_o, p_reset, T, Hv, r, BH0, scale,
    sq_b, sq_t, sq_h, DK, DV, NV,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
    HAS_H0: tl.constexpr, INPLACE: tl.constexpr, HAS_RESET: tl.constexpr,
    p_cu=None, p_slots=None, p_order=None, NH=1, p_snap=None, p_snap_cu=None, p_snap_off=None, p_snap_dst=None,
    VARLEN: tl.constexpr = False, STORE_FINAL: tl.constexpr = True, SNAPSHOTS: tl.constexpr = False,
    INSIDE: tl.constexpr = False,
):
    """The chunk-state recurrence and the output — reference/delta_rule_chunked.py.

    Inputs as written by :func:`chunk_wu_kernel` for rows BH0, BH0 + 1, ...; h0, ht: [B, Hv, dk,
    dv] fp32 contiguous (ht may be h0: INPLACE); o (core): [B, T, Hv, dv] contiguous; HAS_RESET:
    rows b with reset[b] nonzero start from zeros. Grid:
    (n · NV,) for the launch's n rows, NV = cdiv(dv, BV), the NV programs of a row adjacent (they
    read the same q, k, W and Q Kᵀ of each chunk: adjacent, they share them in L2). Each program
    carries a [BK, BV] slice of the state through the cdiv(T, BT) chunks, as two parts of BK / 2
    ≥ 16 rows of dk: every [BT, dk] operand (W, Q, K) is then loaded and used one half at a time,
    so no [BT, BK] tile is ever live — at dk = 128 that is what keeps the bf16 loop body inside
    255 registers (docs/gpu.md §3; four parts were measured too: more loads in flight, more spills).

    VARLEN (packed sequences): the launch's rows are its NH value heads BH0 .. BH0 + NH - 1 of each
    of the N sequences (cu [N + 1]), taken in the order ``order`` (longest first); grid
    (N · NH · NV,). h0 and ht are a pool [S, Hv, dk, dv]: sequence n reads and writes
    row slots[n] (a slot < 0 is zeros and never written); reset[n] per sequence. STORE_FINAL
    False: the final state is not written. SNAPSHOTS: the state after token snap_off[m] of
    sequence n (m in snap_cu[n] .. snap_cu[n+1] - 1, increasing) goes to row snap_dst[m] of snap
    [R, Hv, dk, dv]: at a chunk's end it is the carried state; inside a chunk (only with INSIDE:
    some offset is not a chunk's end), of its first j tokens, e^{γ_j} S + Σ_{s≤j} e^{γ_j − γ_s}
    k_s v'_sᵀ (the chunk's update cut at j).
    """
    BKP: tl.constexpr = BK // 2
    # with tf32 dots the decays scale rows of the [BT, BV] results, not of the [BT, dk] operands:
    # q and k then go to the tensor cores as loaded (16-bit values exact in tf32; fewer live
    # registers: bf16 BV = 32 spilled 96 B the other way). With tf32x3 the operands' way spills
    # less (328 B at BV = 16, against 496)
    ROWS: tl.constexpr = PREC == "tf32"
    i_p = tl.program_id(0)
    i_row, i_v = i_p // NV, i_p % NV
    if VARLEN:
        i_b = tl.load(p_order + i_row // NH)  # the sequence (its reset flag is reset[i_b])
        i_h = BH0 + i_row % NH
    else:
        i_bh = BH0 + i_row
        i_b = i_bh // Hv
        i_h = i_bh % Hv
        i_hk = i_h // r
    o_i = tl.arange(0, BT)
    o_kp = tl.arange(0, BKP)  # part 0 of dk; part J is o_kp + J · BKP
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < DV
    m_vc = m_v[None, :]
    o_hk = o_kp[:, None] * DV + o_v[None, :]  # part 0 of the state within one head
    if VARLEN:
        t_start = tl.load(p_cu + i_b)
        t_end = tl.load(p_cu + i_b + 1)
        n_chunks = (t_end - t_start + BT - 1) // BT
        slot = tl.load(p_slots + i_b).to(tl.int64)
        # padding: never read, never written (a bound, not a scalar `&`: the interpreter makes that int32)
        m_col = (o_v < DV * (slot >= 0).to(tl.int32))[None, :]
        o_h = (tl.maximum(slot, 0) * Hv + i_h) * DK * DV + o_hk
        o_row = (i_row % NH).to(tl.int64) * T
        p_qk = p_q + i_h // r * sq_h
        p_kk = p_k + i_h // r * sq_h
        p_o = p_o + i_h * DV + o_v[None, :]
    else:
        t_start, t_end = 0, T
        m_col = m_vc
        o_h = i_bh.to(tl.int64) * DK * DV + o_hk
        o_row = i_row.to(tl.int64) * T
        p_qk = p_q + i_b.to(tl.int64) * sq_b + i_hk * sq_h
        p_kk = p_k + i_b.to(tl.int64) * sq_b + i_hk * sq_h
        p_o = p_o + (i_b.to(tl.int64) * T * Hv + i_h) * DV + o_v[None, :]
        n_chunks = (T + BT - 1) // BT
    b_h0 = _state_load(p_h0, o_h, o_kp, DK, DV, m_col, p_reset, i_b, 0, BKP, BV, HAS_H0, HAS_RESET)
    b_h1 = _state_load(p_h0, o_h, o_kp, DK, DV, m_col, p_reset, i_b, 1, BKP, BV, HAS_H0, HAS_RESET)
    if SNAPSHOTS:  # the next requested offset of this sequence (-1: none left)
        i_snap = tl.load(p_snap_cu + i_b)
        snap_end = tl.load(p_snap_cu + i_b + 1)
        snap_next = tl.load(p_snap_off + i_snap, mask=i_snap < snap_end, other=-1)
    for i_n in range(n_chunks):
        if VARLEN:
            o_t = t_start + i_n * BT + o_i
            m_t = o_t < t_end
        else:
            o_t = i_n * BT + o_i
            m_t = o_t < T
        o_tw = (o_row + o_t[:, None]) * DK + o_kp[None, :]  # W's part 0
        o_tq = o_t[:, None].to(tl.int64) * sq_t + o_kp[None, :]  # q's and k's part 0
        # V' = U − W S, one part of dk at a time
        b_vn = tl.load(p_u + (o_row + o_t[:, None]) * DV + o_v[None, :], mask=m_t[:, None] & m_vc, other=0.0)
        b_vn = _minus_wh(b_vn, p_w, o_tw, m_t, o_kp, DK, b_h0, 0, BKP, PREC)
        b_vn = _minus_wh(b_vn, p_w, o_tw, m_t, o_kp, DK, b_h1, 1, BKP, PREC)
        # core = scale · (e^γ ⊙ Q S + (Q Kᵀ ⊙ e^D) V')
        b_aqk = tl.load(p_aqk + (o_row + o_t[:, None]) * BT + o_i[None, :], mask=m_t[:, None], other=0.0)
        b_eg = tl.exp(tl.load(p_gc + o_row + o_t, mask=m_t, other=0.0))[:, None]
        if ROWS:
            b_o = _plus_qh(tl.zeros([BT, BV], dtype=tl.float32), p_qk, o_tq, m_t, o_kp, DK, b_h0, 0, BKP, PREC)
            b_o = _plus_qh(b_o, p_qk, o_tq, m_t, o_kp, DK, b_h1, 1, BKP, PREC)
            b_o = b_o * b_eg + tl.dot(b_aqk, b_vn, input_precision=PREC)
        else:
            b_o = tl.dot(b_aqk, b_vn, input_precision=PREC)
            b_o = _plus_qh(b_o, p_qk, o_tq, m_t, o_kp, DK, b_h0, 0, BKP, PREC, b_eg)
            b_o = _plus_qh(b_o, p_qk, o_tq, m_t, o_kp, DK, b_h1, 1, BKP, PREC, b_eg)
        tl.store(p_o + o_t[:, None].to(tl.int64) * Hv * DV, (b_o * scale).to(p_o.dtype.element_ty),
                 mask=m_t[:, None] & m_vc)
        if SNAPSHOTS:
            c_end = tl.minimum(i_n * BT + BT, t_end - t_start)  # this chunk's end, as an offset
        if INSIDE:  # offsets inside this chunk (before its end): the update cut at the offset
            while (snap_next >= 0) & (snap_next < c_end):
                j = snap_next - i_n * BT  # tokens of this chunk the snapshot includes
                b_gj = tl.load(p_gc + o_row + t_start + snap_next - 1)
                b_gc = tl.load(p_gc + o_row + o_t, mask=m_t, other=0.0)
                # the decays scale the rows of V' ([BT, BV]), not of K: fewer live registers
                b_vj = b_vn * tl.where(o_i < j, tl.exp(tl.minimum(b_gj - b_gc, 0.0)), 0.0)[:, None]
                b_ej = tl.exp(b_gj)
                o_snap = (tl.load(p_snap_dst + i_snap).to(tl.int64) * Hv + i_h) * DK * DV + o_hk
                _part_store(p_snap, o_snap, b_h0 * b_ej + _kv(p_kk, o_tq, m_t, o_kp, DK, b_vj, 0, BKP, PREC),
                            o_kp, DK, DV, m_vc, 0, BKP)
                _part_store(p_snap, o_snap, b_h1 * b_ej + _kv(p_kk, o_tq, m_t, o_kp, DK, b_vj, 1, BKP, PREC),
                            o_kp, DK, DV, m_vc, 1, BKP)
                i_snap += 1
                snap_next = tl.load(p_snap_off + i_snap, mask=i_snap < snap_end, other=-1)
        # S ← e^{γ_last} S + (e^{Σ_{u>t} g_u} ⊙ K)ᵀ V', one part of dk at a time
        if VARLEN:
            b_elast = tl.exp(tl.load(p_gc + o_row + tl.minimum(t_start + i_n * BT + BT, t_end) - 1))
        else:
            b_elast = tl.exp(tl.load(p_gc + o_row + tl.minimum(i_n * BT + BT, T) - 1))
        b_et = tl.exp(tl.load(p_gt + o_row + o_t, mask=m_t, other=0.0))[:, None]
        if ROWS:
            b_vn *= b_et
            b_h0 = b_h0 * b_elast + _kv(p_kk, o_tq, m_t, o_kp, DK, b_vn, 0, BKP, PREC)
            b_h1 = b_h1 * b_elast + _kv(p_kk, o_tq, m_t, o_kp, DK, b_vn, 1, BKP, PREC)
        else:
            b_h0 = b_h0 * b_elast + _kv(p_kk, o_tq, m_t, o_kp, DK, b_vn, 0, BKP, PREC, b_et)
            b_h1 = b_h1 * b_elast + _kv(p_kk, o_tq, m_t, o_kp, DK, b_vn, 1, BKP, PREC, b_et)
        if SNAPSHOTS:
            if snap_next == c_end:  # at the chunk's end: the state carried on
                o_snap = (tl.load(p_snap_dst + i_snap).to(tl.int64) * Hv + i_h) * DK * DV + o_hk
                _part_store(p_snap, o_snap, b_h0, o_kp, DK, DV, m_vc, 0, BKP)
                _part_store(p_snap, o_snap, b_h1, o_kp, DK, DV, m_vc, 1, BKP)
                i_snap += 1
                snap_next = tl.load(p_snap_off + i_snap, mask=i_snap < snap_end, other=-1)
    if STORE_FINAL:
        if INPLACE:
            tl.debug_barrier()  # every thread of this program has read its slice of h0
        _part_store(p_ht, o_h, b_h0, o_kp, DK, DV, m_col, 0, BKP)
        _part_store(p_ht, o_h, b_h1, o_kp, DK, DV, m_col, 1, BKP)
#: Upper bound (bytes) on the fp32 temporaries of one pass of the pipeline. Rows (sequence, value
#: head) are processed in slices that fit it, so B = 64, Hv = 32, T = 32K needs 2 GiB here instead
#: of 86 GB (docs/gpu.md, "Memory").
TEMP_BUDGET = 2 << 30


def temp_bytes_per_token(dk: int, dv: int, chunk: int) -> int:
    """fp32 temporaries per token of one row: γ and the tail sums (2), W (dk), U (dv), Q Kᵀ ⊙ e^D (chunk)."""
    return 4 * (2 + dk + dv + chunk)


def slice_rows(rows: int, per_row: int, budget: int, wave_rows: int) -> int:
    """Rows per slice: all of them if they fit ``budget``; else as many whole waves of the state
    kernel (``wave_rows`` rows each) as fit, at least one row."""
    n = max(1, budget // max(per_row, 1))
    if n >= rows:
        return rows
    return n - n % wave_rows if n >= wave_rows else n


#: Launch options of the state kernel on a GPU: 4 warps, no software pipelining. The compile table
#: (docs/gpu.md §3) shows why: at dk = 128, C = 64 it takes 224-255 registers at any BV, so 4
#: warps (128 threads) let two blocks share an SM; 8 warps do not lower it (each of the two warp
#: groups holds the whole [C, dk/2] operand of a tensor-core product) and two pipeline stages need
#: 140-176 KB of shared memory (one block per SM) and spill more.
STATE_WARPS, STATE_STAGES, STATE_CTAS_PER_SM = 4, 1, 2


def wu_warps(prec: str, big: bool) -> int:
    """Warps of the WU kernel: 4 for small tiles; for C · max(dk, dv) ≥ 4096, 8 with tf32 dots
    (252 registers, no spill at dk = dv = 128, C = 64) and 4 with tf32x3, whose split operands
    two warp groups would each hold in full (880 B of spills per thread at 8 warps, 384 at 4)."""
    return 8 if big and prec == "tf32" else 4


def state_blocks_v(prec: str, varlen: bool = False) -> tuple[int, ...]:
    """dv blocks the state kernel may take on a GPU: those that build without spills at dk = 128,
    C = 64 (docs/gpu.md §3). tf32 dots (bf16): 16 and 32 (64 spills 296 B per thread); in the
    packed variants (slots, snapshots) 16 alone (32 spills 40-152 B). tf32x3 (f32, f16): 16, the
    least spilling (312-408 B; 32 and 64 more). The price: fewer programs than BV = 64 would give
    only where B·Hv > 264, and there the NV programs of a row, adjacent in the grid, share its
    q, k, W reads in L2."""
    return (16, 32) if prec == "tf32" and not varlen else (16,)


def state_block_v(v: torch.Tensor, B: int, Hv: int, dv: int, prec: str = "tf32", varlen: bool = False) -> int:
    """dv columns per program of the state kernel: all of them under the interpreter. On a GPU the
    time is about (waves of the grid) × (one program's chunk loop), so BV ∈
    :func:`state_blocks_v` with the fewest waves on the SMs' 2 blocks each
    (:data:`STATE_CTAS_PER_SM`); among equal waves the smallest BV (a shorter loop body). A
    program's cost grows far less than its BV (the q, k, W and Q Kᵀ loads of a chunk do not
    depend on it), so fewer waves win: B = 1, Hv = 32 takes BV = 16 (256 programs, one wave on
    132 SMs), B = 4 in bf16 BV = 32 (512 programs, 2 waves)."""
    if interpreting(v):
        return next_pow2(dv, 16)
    return gpu_block_v(B, Hv, dv, num_sms(v), prec, varlen)


def gpu_block_v(B: int, Hv: int, dv: int, sms: int, prec: str = "tf32", varlen: bool = False) -> int:
    """:func:`state_block_v` on a GPU of ``sms`` SMs."""
    slots = sms * STATE_CTAS_PER_SM
    options = [bv for bv in state_blocks_v(prec, varlen) if bv <= next_pow2(dv, 16)] or [next_pow2(dv, 16)]
    return min(options, key=lambda bv: (triton.cdiv(B * Hv * triton.cdiv(dv, bv), slots), bv))


def delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
    *,
    out_state: torch.Tensor | None = None,
    precision: str | None = None,
    block_v: int | None = None,
    temp_budget: int | None = None,
    reset: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule in chunked form (reference/delta_rule_chunked.py).

    Same arguments, shapes and results as :func:`.delta_rule.delta_rule_recurrent`, plus
    ``chunk_size`` (16, 32 or 64). ``precision`` overrides ``tl.dot``'s input precision (default
    from the activation dtype, :func:`.target.dot_precision`); ``block_v`` the state kernel's
    dv block (benchmarks); ``temp_budget`` the bytes of fp32 temporaries of one slice of rows
    (default :data:`TEMP_BUDGET`); ``reset`` as for the recurrent form.
    """
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"delta_rule_chunked: chunk_size must be one of {CHUNK_SIZES}, found {chunk_size}")
    B, T, Hk, Hv, dk, dv = check_delta_inputs(q, k, v, g, beta, initial_state)
    scale = dk ** -0.5 if scale is None else float(scale)
    h0, ht, inplace = prepare_state(initial_state, out_state, (B, Hv, dk, dv), v.device)
    prec = precision or dot_precision(v.dtype)
    dev = v.device
    BT = chunk_size
    BK, BV = next_pow2(dk, 16), next_pow2(dv, 16)
    BVS = block_v or state_block_v(v, B, Hv, dv, prec)
    BKS = next_pow2(dk, 32)  # the state kernel's dk block: two halves of at least 16 (tl.dot)
    NT, NV = triton.cdiv(T, BT), triton.cdiv(dv, BVS)
    g, beta = g.to(torch.float32).contiguous(), beta.to(torch.float32).contiguous()
    core = empty((B, T, Hv, dv), v.dtype, dev)
    rows = B * Hv
    n = slice_rows(rows, T * temp_bytes_per_token(dk, dv, BT), TEMP_BUDGET if temp_budget is None else temp_budget,
                   max(1, num_sms(v) * STATE_CTAS_PER_SM // NV))
    gc, gt = empty((n, T), torch.float32, dev), empty((n, T), torch.float32, dev)
    w, u = empty((n, T, dk), torch.float32, dev), empty((n, T, dv), torch.float32, dev)
    aqk = empty((n, T, BT), torch.float32, dev)
    shared = dict(p_q=q, p_k=k, p_gc=gc, p_gt=gt, p_w=w, p_u=u, p_aqk=aqk, T=T, Hv=Hv, r=Hv // Hk,
                  **head_strides(q, "sq"), DK=dk, DV=dv, BT=BT, PREC=prec)
    big = BT * max(BK, BV) >= 4096
    for bh0 in range(0, rows, n):
        m = min(n, rows - bh0)
        chunk_wu_kernel[(m * NT,)](
            **shared, p_v=v, p_g=g, p_beta=beta, NT=NT, BH0=bh0, **head_strides(v, "sv"),
            LOG2_BT=BT.bit_length() - 1, BK=BKS, BV=next_pow2(dv, 32), num_warps=wu_warps(prec, big),
        )
        chunk_state_kernel[(m * NV,)](
            **shared, p_h0=h0 if h0 is not None else ht, p_ht=ht, p_o=core,
            p_reset=ht if reset is None else reset_flags(reset),
            BH0=bh0, scale=scale, NV=NV, BK=BKS, BV=BVS, HAS_H0=h0 is not None, INPLACE=inplace,
            HAS_RESET=reset is not None,
            num_warps=STATE_WARPS, num_stages=STATE_STAGES,
        )
    return core, ht


def delta_rule_chunked_packed(
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
    precision: str | None = None,
    block_v: int | None = None,
    temp_budget: int | None = None,
) -> torch.Tensor:
    """The chunked form over a packed stream of N sequences (docs/serving.md), states in pool slots.

    Arguments as :func:`.delta_rule.delta_rule_recurrent_packed`; the chunk size is
    ``packed.chunk`` (its chunk map). Chunks start at each sequence's first token, so none
    straddles two sequences. The fp32 temporaries are those of :func:`delta_rule_chunked` for one
    row of ``total`` tokens per value head, processed in slices of heads within ``temp_budget``.
    Returns core [1, total, Hv, dv] in v's dtype.
    """
    BT = packed.chunk
    if BT not in CHUNK_SIZES or packed.cu_chunks is None:
        raise ValueError(f"delta_rule_chunked (packed): expected a chunk map of a chunk size in {CHUNK_SIZES}, "
                         f"found chunk {BT}")
    B, total, Hk, Hv, dk, dv = check_delta_inputs(q, k, v, g, beta, None)
    if B != 1 or total != packed.total:
        raise ValueError(f"delta_rule (packed): expected one stream of {packed.total} tokens, found {list(q.shape)}")
    check_pool(pool, Hv, dk, dv)
    scale = dk ** -0.5 if scale is None else float(scale)
    prec = precision or dot_precision(v.dtype)
    dev, N = v.device, packed.n
    BK, BV = next_pow2(dk, 16), next_pow2(dv, 16)
    BVS = block_v or state_block_v(v, N, Hv, dv, prec, varlen=True)
    BKS = next_pow2(dk, 32)  # the state kernel's dk block: two halves of at least 16 (tl.dot)
    NV = triton.cdiv(dv, BVS)
    g, beta = g.to(torch.float32).contiguous(), beta.to(torch.float32).contiguous()
    core = empty((1, total, Hv, dv), v.dtype, dev)
    n = slice_rows(Hv, total * temp_bytes_per_token(dk, dv, BT), TEMP_BUDGET if temp_budget is None else temp_budget,
                   max(1, num_sms(v) * STATE_CTAS_PER_SM // (NV * N)))
    gc, gt = empty((n, total), torch.float32, dev), empty((n, total), torch.float32, dev)
    w, u = empty((n, total, dk), torch.float32, dev), empty((n, total, dv), torch.float32, dev)
    aqk = empty((n, total, BT), torch.float32, dev)
    shared = dict(p_q=q, p_k=k, p_gc=gc, p_gt=gt, p_w=w, p_u=u, p_aqk=aqk, T=total, Hv=Hv, r=Hv // Hk,
                  **head_strides(q, "sq"), DK=dk, DV=dv, BT=BT, PREC=prec, p_cu=packed.cu, VARLEN=True)
    snap = {} if snapshots is None else dict(
        p_snap=snap_out, p_snap_cu=snapshots.cu, p_snap_off=snapshots.off, p_snap_dst=snapshots.dst, SNAPSHOTS=True,
        INSIDE=snapshots.inside)
    big = BT * max(BK, BV) >= 4096
    for h0 in range(0, Hv, n):
        m = min(n, Hv - h0)
        chunk_wu_kernel[(m * packed.n_chunks,)](
            **shared, p_v=v, p_g=g, p_beta=beta, NT=packed.n_chunks, BH0=h0, **head_strides(v, "sv"),
            LOG2_BT=BT.bit_length() - 1, BK=BKS, BV=next_pow2(dv, 32), p_cuc=packed.cu_chunks, N=N,
            n_steps=packed.search_steps, num_warps=wu_warps(prec, big),
        )
        chunk_state_kernel[(N * m * NV,)](
            **shared, p_h0=pool, p_ht=pool, p_o=core, p_reset=pool if packed.reset is None else packed.reset,
            BH0=h0, scale=scale, NV=NV, BK=BKS, BV=BVS, HAS_H0=True, INPLACE=store_final,
            HAS_RESET=packed.reset is not None,
            p_slots=packed.slots, p_order=packed.order, NH=m, STORE_FINAL=store_final, **snap,
            num_warps=STATE_WARPS, num_stages=STATE_STAGES,
        )
    return core
