"""Stage 3, ``conv1d``: causal depthwise convolution + SiLU with the conv state, for prefill
(T tokens, a new state) and decode (one token, the state updated in place), and the production
form fused with stage 4's L2 norm of q and k.

The conv state [B, conv_dim, K] holds the last K pre-conv ``qkv`` columns, oldest first, in the
activation dtype: they are in_proj outputs, already rounded to that dtype, so nothing is lost.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .packed import Packed, Snapshots, find_segment
from .target import empty, heads_per_program, interpreting, kernel, next_pow2, reset_flags


@triton.jit
def _causal_conv_silu(p_x, p_s, p_w, i_b, keep, o_t, o_c, m_c, T, C, stride_xb, stride_xt, K: tl.constexpr,
                      BT: tl.constexpr, BC: tl.constexpr):
    """silu(Σ_j w[c, j] · X̃[c, t-(K-1)+j]) for tokens o_t, channels o_c of row i_b, in fp32.

    X̃ = the K state columns then the new tokens; token index s < 0 reads state slot K + s, or 0
    where the row is reset (``keep`` 0).
    """
    b_y = tl.zeros([BT, BC], dtype=tl.float32)
    p_xb = p_x + i_b.to(tl.int64) * stride_xb
    p_sb = p_s + i_b.to(tl.int64) * C * K
    for j in tl.static_range(K):
        o_src = o_t - (K - 1) + j
        m_x = ((o_src >= 0) & (o_src < T))[:, None] & m_c[None, :]
        m_s = ((o_src < 0) & (o_src >= -K * keep))[:, None] & m_c[None, :]
        b_xj = tl.load(p_xb + o_src[:, None].to(tl.int64) * stride_xt + o_c[None, :], mask=m_x, other=0.0)
        b_sj = tl.load(p_sb + o_c[None, :] * K + (K + o_src)[:, None], mask=m_s, other=0.0)
        b_wj = tl.load(p_w + o_c * K + j, mask=m_c, other=0.0).to(tl.float32)
        b_y += (b_xj.to(tl.float32) + b_sj.to(tl.float32)) * b_wj[None, :]
    return b_y / (1.0 + tl.exp(-b_y))


@triton.jit
def _next_conv_state(p_x, p_s, p_s_out, i_b, keep, o_c, m_c, T, C, stride_xb, stride_xt, K: tl.constexpr,
                     KP: tl.constexpr, INPLACE: tl.constexpr):
    """Write slots j of the new state: X̃ column T + j, i.e. token T + j - K, or old slot T + j
    (0 where the row is reset)."""
    o_j = tl.arange(0, KP)
    m_j = o_j < K
    o_src = T + o_j - K
    m_x = ((o_src >= 0) & m_j)[None, :] & m_c[:, None]
    m_s = ((o_src < 0) & (o_src >= -K * keep) & m_j)[None, :] & m_c[:, None]
    p_xb = p_x + i_b.to(tl.int64) * stride_xb
    o_state = i_b.to(tl.int64) * C * K + o_c[:, None] * K
    b_x = tl.load(p_xb + o_src[None, :].to(tl.int64) * stride_xt + o_c[:, None], mask=m_x, other=0.0)
    b_s = tl.load(p_s + o_state + (T + o_j)[None, :], mask=m_s, other=0.0)
    b_new = b_x.to(tl.float32) + b_s.to(tl.float32)
    if INPLACE:
        tl.debug_barrier()  # every thread of this program has read the old state
    tl.store(p_s_out + o_state + o_j[None, :], b_new.to(p_s_out.dtype.element_ty), mask=m_j[None, :] & m_c[:, None])


@triton.jit
def _row_kept(p_reset, i_b, HAS_RESET: tl.constexpr):
    """0 where row i_b starts from a zero state (its reset flag is set), else 1 (int32: the masks
    use it as a bound, ``o_src >= -K * keep``; a boolean ``&`` mixes dtypes in the interpreter)."""
    if HAS_RESET:
        return 1 - (tl.load(p_reset + i_b) != 0).to(tl.int32)
    return 1


@kernel
def conv1d_kernel(p_x, p_s, p_w, p_out, p_s_out, p_reset, T, NT, C, stride_xb, stride_xt,
                  K: tl.constexpr, KP: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, INPLACE: tl.constexpr,
                  HAS_RESET: tl.constexpr):
    """qkv_conv = silu(causal depthwise conv) and the new conv state — formula: reference/conv1d.py.

    qkv (x): [B, T, C] (strides stride_xb, stride_xt, 1); state, state_out: [B, C, K] contiguous
    (state_out may be state itself when there is one token block: INPLACE); w: [C, K];
    out: [B, T, C] contiguous; HAS_RESET: reset [B] (nonzero: the row starts from a zero state).
    Grid: (B · NT, cdiv(C, BC)), NT = cdiv(T, BT) token blocks per row (the batch on the x axis,
    which has no 65535 limit); the last token block of a row also writes the new state of its
    channels.
    """
    i_bt, i_c = tl.program_id(0), tl.program_id(1)
    i_b = i_bt // NT
    i_t = i_bt % NT
    keep = _row_kept(p_reset, i_b, HAS_RESET)
    o_t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    b_y = _causal_conv_silu(p_x, p_s, p_w, i_b, keep, o_t, o_c, m_c, T, C, stride_xb, stride_xt, K, BT, BC)
    o_out = (i_b.to(tl.int64) * T + o_t[:, None]) * C + o_c[None, :]
    tl.store(p_out + o_out, b_y.to(p_out.dtype.element_ty), mask=(o_t < T)[:, None] & m_c[None, :])
    if i_t == NT - 1:
        _next_conv_state(p_x, p_s, p_s_out, i_b, keep, o_c, m_c, T, C, stride_xb, stride_xt, K, KP, INPLACE)


@triton.jit
def _causal_conv_silu_packed(p_x, p_s, p_w, p_cu, p_slots, p_reset, o_t, o_c, m_c, T, N, n_steps, C, stride_xt,
                             K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_RESET: tl.constexpr,
                             PER_TOKEN: tl.constexpr):
    """:func:`_causal_conv_silu` over a packed stream (gpu_impl/packed.py): each token's window
    restarts at its own sequence's first token, before which it reads that sequence's slot (0 for
    padding and reset sequences), never the previous sequence's tokens. PER_TOKEN: every sequence
    is one token (token t is sequence t), else a token's sequence is searched in cu."""
    if PER_TOKEN:
        i_seq = o_t
    else:
        i_seq = find_segment(p_cu, tl.minimum(o_t, T - 1), N, n_steps)
    bos = tl.load(p_cu + i_seq)
    slot = tl.load(p_slots + i_seq, mask=o_t < T, other=-1)
    keep = slot >= 0
    if HAS_RESET:
        keep = keep & (tl.load(p_reset + i_seq, mask=o_t < T, other=1) == 0)
    o_sb = tl.maximum(slot, 0).to(tl.int64) * C * K
    b_y = tl.zeros([BT, BC], dtype=tl.float32)
    for j in tl.static_range(K):
        o_src = o_t - (K - 1) + j
        o_rel = o_src - bos  # < 0: before the sequence, column K + o_rel of its state
        m_x = ((o_rel >= 0) & (o_src < T))[:, None] & m_c[None, :]
        m_s = ((o_rel < 0) & keep)[:, None] & m_c[None, :]
        b_xj = tl.load(p_x + o_src[:, None].to(tl.int64) * stride_xt + o_c[None, :], mask=m_x, other=0.0)
        b_sj = tl.load(p_s + o_sb[:, None] + o_c[None, :] * K + (K + o_rel)[:, None], mask=m_s, other=0.0)
        b_wj = tl.load(p_w + o_c * K + j, mask=m_c, other=0.0).to(tl.float32)
        b_y += (b_xj.to(tl.float32) + b_sj.to(tl.float32)) * b_wj[None, :]
    return b_y / (1.0 + tl.exp(-b_y))


@triton.jit
def _conv_window(p_x, p_s, p_dst, bos, n, o_src_state, keep, o_dst, store, o_c, m_c, C, stride_xt,
                 K: tl.constexpr, KP: tl.constexpr, INPLACE: tl.constexpr):
    """The conv state after the first n tokens of a sequence whose first token is packed row bos:
    column j is its token n + j - K where that is >= 0, else column n + j of its entering state
    (at o_src_state; 0 unless keep), written at o_dst of p_dst when ``store`` (int 0 or 1: flags
    enter the masks as bounds, since the interpreter turns a scalar ``&`` into int32)."""
    o_j = tl.arange(0, KP)
    m_j = o_j < K
    o_rel = n + o_j - K
    m_x = ((o_rel >= 0) & m_j)[None, :] & m_c[:, None]
    m_s = ((o_rel < 0) & (o_rel >= -K * keep) & m_j)[None, :] & m_c[:, None]
    b_x = tl.load(p_x + (bos + o_rel)[None, :].to(tl.int64) * stride_xt + o_c[:, None], mask=m_x, other=0.0)
    b_s = tl.load(p_s + o_src_state + o_c[:, None] * K + (n + o_j)[None, :], mask=m_s, other=0.0)
    b_new = b_x.to(tl.float32) + b_s.to(tl.float32)
    if INPLACE:
        tl.debug_barrier()  # every thread of this program has read the old state
    tl.store(p_dst + o_dst + o_c[:, None] * K + o_j[None, :], b_new.to(p_dst.dtype.element_ty),
             mask=(o_j < K * store)[None, :] & m_c[:, None])


@kernel
def conv1d_qk_norm_kernel(p_x, p_s, p_w, p_out, p_conv, p_s_out, p_reset, T, NT, C, Hk, DK, DV, stride_xb,
                          stride_xt, K: tl.constexpr, KP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                          INPLACE: tl.constexpr, STORE_CONV: tl.constexpr, HAS_RESET: tl.constexpr,
                          p_cu=None, p_slots=None, N=1, n_steps=1, VARLEN: tl.constexpr = False,
                          PER_TOKEN: tl.constexpr = False, HB: tl.constexpr = 1):
    """conv1d + SiLU, then the L2 norm of each q and k head (stage 4) — reference/conv1d.py,
    reference/qk_norm.py.

    Head slots: [0, Hk) are q heads (dk channels each), [Hk, 2·Hk) k heads, then Hv v heads (dv
    channels, not normalised); a program takes HB consecutive slots, its channels laid out as HB
    blocks of BD lanes (lanes past a slot's width, and slots past the last, are masked). qkv (x):
    [B, T, C] strided; state, state_out: [B, C, K]; out: [B, T, C] contiguous holding [q̂ | k̂ | v];
    STORE_CONV also writes the pre-norm qkv_conv to conv (capture mode; the math is unchanged);
    HAS_RESET: rows with a nonzero reset [B] start from a zero state. Grid:
    (B · NT, cdiv(2·Hk + Hv, HB)), NT = cdiv(T, BT); BD = next_pow2(max(dk, dv)). On a GPU HB is 1
    (one head slot per program); the interpreter takes every slot in one program (HB: a power of
    two), since there a program's cost is its count of operations, whatever their width.

    VARLEN (packed sequences, gpu_impl/packed.py): B = 1, the T tokens are N sequences (cu [N + 1])
    whose states are rows slots[n] of the pool ``state`` [S, C, K] (reset[n] per sequence); token
    blocks may hold several sequences. The new states are written by :func:`conv_window_kernel`,
    except with PER_TOKEN (N = T, BT = 1: a decode batch), where each program writes its own
    sequence's state to its slot in ``state_out`` (the pool itself: INPLACE), padding never.
    """
    i_bt, i_g = tl.program_id(0), tl.program_id(1)
    i_b = i_bt // NT
    i_t = i_bt % NT
    keep = _row_kept(p_reset, i_b, HAS_RESET)  # the plain path's (unused with VARLEN)
    if HB == 1:  # the GPU form: the slot is the program's (scalars; the compile table's registers)
        is_qk = i_g < 2 * Hk
        o_d = tl.arange(0, BD)
    else:  # each lane's slot and its channel within the slot
        o_hd = tl.arange(0, HB * BD)
        o_s = i_g * HB + o_hd // BD
        o_d = o_hd % BD
        is_qk = o_s < 2 * Hk
    c0 = tl.where(is_qk, (i_g if HB == 1 else o_s) * DK, 2 * Hk * DK + ((i_g if HB == 1 else o_s) - 2 * Hk) * DV)
    width = tl.where(is_qk, DK, DV)
    o_c = c0 + o_d
    m_c = (o_d < width) & (o_c < C)  # slots past the last start at C or beyond
    o_t = i_t * BT + tl.arange(0, BT)
    if VARLEN:
        b_y = _causal_conv_silu_packed(p_x, p_s, p_w, p_cu, p_slots, p_reset, o_t, o_c, m_c, T, N, n_steps, C,
                                       stride_xt, K, BT, HB * BD, HAS_RESET, PER_TOKEN)
    else:
        b_y = _causal_conv_silu(p_x, p_s, p_w, i_b, keep, o_t, o_c, m_c, T, C, stride_xb, stride_xt, K, BT,
                                HB * BD)
    m_out = (o_t < T)[:, None] & m_c[None, :]
    o_out = (i_b.to(tl.int64) * T + o_t[:, None]) * C + o_c[None, :]
    if STORE_CONV:
        tl.store(p_conv + o_out, b_y.to(p_conv.dtype.element_ty), mask=m_out)
    if HB == 1:
        b_rn = 1.0 / tl.sqrt(tl.sum(b_y * b_y, axis=1) + 1e-6)
        b_scale = tl.where(is_qk, b_rn, 1.0)[:, None]
    else:  # each slot's sum of squares over its own BD lanes, spread back over them
        b_ss = tl.sum(tl.reshape(b_y * b_y, (BT, HB, BD)), axis=2)
        b_rn = tl.reshape(tl.broadcast_to((1.0 / tl.sqrt(b_ss + 1e-6))[:, :, None], (BT, HB, BD)), (BT, HB * BD))
        b_scale = tl.where(is_qk[None, :], b_rn, 1.0)
    tl.store(p_out + o_out, (b_y * b_scale).to(p_out.dtype.element_ty), mask=m_out)
    if VARLEN:
        if PER_TOKEN:  # token i_t is sequence i_t: its window after its one token, to its slot
            slot = tl.load(p_slots + i_t).to(tl.int64)
            keep = _row_kept(p_reset, i_t, HAS_RESET) * (slot >= 0).to(tl.int32)
            o_slot = tl.maximum(slot, 0) * C * K
            _conv_window(p_x, p_s, p_s_out, i_t, 1, o_slot, keep, o_slot, (slot >= 0).to(tl.int32), o_c, m_c, C,
                         stride_xt, K, KP, INPLACE)
    elif i_t == NT - 1:
        _next_conv_state(p_x, p_s, p_s_out, i_b, keep, o_c, m_c, T, C, stride_xb, stride_xt, K, KP, INPLACE)


@kernel
def conv_window_kernel(p_x, p_s, p_dst, p_cu, p_slots, p_reset, T, N, C, stride_xt, K: tl.constexpr,
                       KP: tl.constexpr, BC: tl.constexpr, HAS_RESET: tl.constexpr, FINAL: tl.constexpr,
                       p_req_seq=None, p_req_n=None, p_req_dst=None):
    """Conv states of a packed call (gpu_impl/packed.py) — the window of reference/conv1d.py.

    x (qkv): [1, T, C] (token stride stride_xt); state: the pool [S, C, K], row slots[n] entering
    sequence n (zeros for padding and reset[n]); dst: [R, C, K]. FINAL: request i is sequence i
    after all its tokens, to its own slot in the pool (dst is the pool: in place; padding is not
    written). Otherwise request i is sequence req_seq[i] after req_n[i] tokens, to row
    req_dst[i] of dst (prefix snapshots, a verify's steps). Grid: (requests, cdiv(C, BC)).
    """
    i_r, i_c = tl.program_id(0), tl.program_id(1)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    if FINAL:
        i_seq = i_r
    else:
        i_seq = tl.load(p_req_seq + i_r)
    bos = tl.load(p_cu + i_seq)
    slot = tl.load(p_slots + i_seq).to(tl.int64)
    keep = _row_kept(p_reset, i_seq, HAS_RESET) * (slot >= 0).to(tl.int32)
    o_src = tl.maximum(slot, 0) * C * K
    if FINAL:
        _conv_window(p_x, p_s, p_dst, bos, tl.load(p_cu + i_seq + 1) - bos, o_src, keep, o_src,
                     (slot >= 0).to(tl.int32), o_c, m_c, C, stride_xt, K, KP, True)
    else:
        o_dst = tl.load(p_req_dst + i_r).to(tl.int64) * C * K
        _conv_window(p_x, p_s, p_dst, bos, tl.load(p_req_n + i_r), o_src, keep, o_dst, 1, o_c, m_c, C, stride_xt,
                     K, KP, False)


def _check(qkv: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    B, T, C = qkv.shape
    w = weight.reshape(weight.shape[0], weight.shape[-1])
    if conv_state.shape != (B, C, w.shape[1]) or w.shape[0] != C:
        raise ValueError(
            f"conv1d: expected qkv [B, T, C], conv_state [B, C, K], weight [C, 1, K]; found {list(qkv.shape)}, "
            f"{list(conv_state.shape)}, {list(weight.shape)}"
        )
    if qkv.stride(-1) != 1 or not conv_state.is_contiguous():
        raise ValueError("conv1d: expected unit channel stride for qkv and a contiguous conv_state")
    return w.contiguous()


def _token_block(qkv: torch.Tensor, T: int, width: int, packed: bool = False) -> int:
    """Tokens per program (a power of two): under the interpreter as many as fit
    :data:`_INTERPRETER_TILE` elements with ``width`` lanes each, so that a call's tokens are one
    block (each block is a program, and each program costs its count of operations); on a GPU the
    compile table's tiles."""
    if interpreting(qkv):
        return min(next_pow2(T), max(1, _INTERPRETER_TILE // width))
    # 32 tokens × 128 channels for 16-bit inputs, 16 for fp32: larger tiles spill (compile table,
    # docs/gpu.md). A packed call's tokens carry their own sequence start, slot and flags: half as
    # many (at 32, bf16 took 255 registers and spilled)
    wide = (32 if qkv.element_size() <= 2 else 16) // (2 if packed else 1)
    return min(next_pow2(T), wide if width <= 128 else wide // 2)


#: Lanes of one interpreted conv program (head slots × BD): wide enough for Qwen3.5's 80 slots of
#: 128 channels in two programs, small enough that a token block still holds a few tokens.
_INTERPRETER_LANES = 8192

#: Elements of one interpreted conv tile (tokens × lanes): 2^17 holds every call of the default
#: suite in one token block (at most 256 tokens of 512 lanes) and 16 tokens of Qwen3.5's 8192
#: lanes (8 MB of fp32 temporaries per tile). A token block is a program, run in sequence: the
#: former 8192 cut a 61-token prefill of 4 slots of 128 lanes into 4 programs.
_INTERPRETER_TILE = 1 << 17


def _heads_per_program(qkv: torch.Tensor, slots: int, BD: int, asked: int | None) -> int:
    """Head slots per program of :func:`conv1d_qk_norm_kernel` (a power of two): ``asked`` if
    given (tests run both forms), 1 on a GPU (a slot's BD lanes are one tile: the compile table's
    figures, docs/gpu.md), as many as fit ``_INTERPRETER_LANES`` in the interpreter, whose cost is
    one Python step per operation of a program, whatever its width: one program over every slot
    instead of one per slot runs the same arithmetic per element, 2·Hk + Hv times fewer steps."""
    return heads_per_program(qkv, "conv1d_qk_norm", slots, BD, _INTERPRETER_LANES, asked)


def conv1d(qkv: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv_conv and the new conv state (reference/conv1d.py). Pure: conv_state is not modified.

    qkv: [B, T, conv_dim] (unit channel stride); conv_state: [B, conv_dim, K] contiguous;
    weight: [conv_dim, 1, K]. Returns qkv_conv [B, T, conv_dim] in qkv's dtype and the new
    state [B, conv_dim, K] in conv_state's dtype.
    """
    w = _check(qkv, conv_state, weight)
    B, T, C = qkv.shape
    K = w.shape[1]
    out = empty((B, T, C), qkv.dtype, qkv.device)
    new_state = empty(conv_state.shape, conv_state.dtype, conv_state.device)
    BC = next_pow2(C) if interpreting(qkv) else min(128, next_pow2(C))
    BT = _token_block(qkv, T, BC)
    NT = triton.cdiv(T, BT)
    conv1d_kernel[(B * NT, triton.cdiv(C, BC))](
        p_x=qkv, p_s=conv_state, p_w=w, p_out=out, p_s_out=new_state, p_reset=conv_state, T=T, NT=NT, C=C,
        stride_xb=qkv.stride(0), stride_xt=qkv.stride(1), K=K, KP=next_pow2(K), BT=BT, BC=BC, INPLACE=False,
        HAS_RESET=False, num_warps=4)
    return out, new_state


def conv1d_update(qkv: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Decode: one token per sequence; ``conv_state`` is updated in place. Returns qkv_conv [B, 1, C].

    Same math as :func:`conv1d` with T = 1.
    """
    w = _check(qkv, conv_state, weight)
    B, T, C = qkv.shape
    if T != 1:
        raise ValueError(f"conv1d_update: expected one token per sequence, found T={T}")
    K = w.shape[1]
    out = empty((B, 1, C), qkv.dtype, qkv.device)
    BC = next_pow2(C) if interpreting(qkv) else min(256, next_pow2(C))
    conv1d_kernel[(B, triton.cdiv(C, BC))](
        p_x=qkv, p_s=conv_state, p_w=w, p_out=out, p_s_out=conv_state, p_reset=conv_state, T=1, NT=1, C=C,
        stride_xb=qkv.stride(0), stride_xt=qkv.stride(1), K=K, KP=next_pow2(K), BT=1, BC=BC, INPLACE=True,
        HAS_RESET=False, num_warps=4)
    return out


def conv1d_qk_norm(
    qkv: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, num_k_heads: int, head_k_dim: int,
    num_v_heads: int, head_v_dim: int, *, inplace: bool = False, capture: bool = False,
    reset: torch.Tensor | None = None, heads_per_program: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Stages 3 and 4 in one kernel: conv1d + SiLU, split, L2 norm of q and k.

    Shapes as :func:`conv1d` and :func:`.qk_norm.qk_norm`. ``inplace`` (decode, T = 1) updates
    ``conv_state`` itself; otherwise a new state is returned. ``capture`` also returns the
    pre-norm qkv_conv (else None). ``reset`` [B] bool on the device: rows whose state reads as
    zeros (the seq_pos rule, applied here so that no kernel of its own rewrites the state).
    Returns q [B, T, Hk, dk], k [B, T, Hk, dk], v [B, T, Hv, dv] (views of one [B, T, conv_dim]
    tensor), qkv_conv, and the new conv state.
    """
    w = _check(qkv, conv_state, weight)
    B, T, C = qkv.shape
    K = w.shape[1]
    Hk, dk, Hv, dv = num_k_heads, head_k_dim, num_v_heads, head_v_dim
    out = empty((B, T, C), qkv.dtype, qkv.device)
    conv = empty((B, T, C), qkv.dtype, qkv.device) if capture else out
    new_state = conv_state if inplace else empty(conv_state.shape, conv_state.dtype, conv_state.device)
    BD = next_pow2(max(dk, dv))
    HB = _heads_per_program(qkv, 2 * Hk + Hv, BD, heads_per_program)
    BT = _token_block(qkv, T, HB * BD)
    if inplace and T > BT:
        raise ValueError(f"conv1d_qk_norm: an in-place state update needs one token block, found T={T} > {BT}")
    NT = triton.cdiv(T, BT)
    conv1d_qk_norm_kernel[(B * NT, triton.cdiv(2 * Hk + Hv, HB))](
        p_x=qkv, p_s=conv_state, p_w=w, p_out=out, p_conv=conv, p_s_out=new_state,
        p_reset=conv_state if reset is None else reset_flags(reset), T=T, NT=NT, C=C, Hk=Hk, DK=dk, DV=dv,
        stride_xb=qkv.stride(0), stride_xt=qkv.stride(1), K=K, KP=next_pow2(K), BT=BT, BD=BD, INPLACE=inplace,
        STORE_CONV=capture, HAS_RESET=reset is not None, HB=HB, num_warps=4)
    key_dim = Hk * dk
    q = out[..., :key_dim].unflatten(-1, (Hk, dk))
    k = out[..., key_dim:2 * key_dim].unflatten(-1, (Hk, dk))
    v = out[..., 2 * key_dim:].unflatten(-1, (Hv, dv))
    return q, k, v, (conv if capture else None), new_state


def conv1d_qk_norm_packed(
    qkv: torch.Tensor, pool: torch.Tensor, weight: torch.Tensor, num_k_heads: int, head_k_dim: int,
    num_v_heads: int, head_v_dim: int, packed: Packed, *, capture: bool = False, store_final: bool = True,
    heads_per_program: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Stages 3 and 4 over a packed stream (docs/serving.md): each sequence's conv window starts
    from its slot of ``pool`` [S, conv_dim, K] (zeros for padding and reset sequences) and sees
    only its own tokens. ``store_final``: each real sequence's new conv state is written to its
    slot (in place; padding never) — by the conv kernel itself for a decode batch (one token per
    sequence), else by :func:`conv_windows` after it. qkv: [1, total, conv_dim].
    Returns q, k, v (views of one [1, total, conv_dim] tensor) and qkv_conv (``capture``, else None).
    """
    w = _check_packed(qkv, pool, weight, packed)
    _, T, C = qkv.shape
    K = w.shape[1]
    Hk, dk, Hv, dv = num_k_heads, head_k_dim, num_v_heads, head_v_dim
    out = empty((1, T, C), qkv.dtype, qkv.device)
    conv = empty((1, T, C), qkv.dtype, qkv.device) if capture else out
    BD = next_pow2(max(dk, dv))
    HB = _heads_per_program(qkv, 2 * Hk + Hv, BD, heads_per_program)
    per_token = packed.per_token and store_final
    BT = 1 if per_token else _token_block(qkv, T, HB * BD, packed=True)
    NT = triton.cdiv(T, BT)
    conv1d_qk_norm_kernel[(NT, triton.cdiv(2 * Hk + Hv, HB))](
        p_x=qkv, p_s=pool, p_w=w, p_out=out, p_conv=conv, p_s_out=pool,
        p_reset=pool if packed.reset is None else packed.reset, T=T, NT=NT, C=C, Hk=Hk, DK=dk, DV=dv,
        stride_xb=qkv.stride(0), stride_xt=qkv.stride(1), K=K, KP=next_pow2(K), BT=BT, BD=BD, INPLACE=per_token,
        STORE_CONV=capture, HAS_RESET=packed.reset is not None, p_cu=packed.cu, p_slots=packed.slots, N=packed.n,
        n_steps=packed.search_steps, VARLEN=True, PER_TOKEN=per_token, HB=HB, num_warps=4)
    if store_final and not per_token:
        conv_windows(qkv, pool, packed, pool)
    key_dim = Hk * dk
    q = out[..., :key_dim].unflatten(-1, (Hk, dk))
    k = out[..., key_dim:2 * key_dim].unflatten(-1, (Hk, dk))
    v = out[..., 2 * key_dim:].unflatten(-1, (Hv, dv))
    return q, k, v, (conv if capture else None)


def conv_windows(qkv: torch.Tensor, pool: torch.Tensor, packed: Packed, dst: torch.Tensor,
                 requests: Snapshots | None = None) -> None:
    """Conv states of a packed call from its pre-conv ``qkv`` [1, total, conv_dim] and the entering
    states in ``pool``: without ``requests``, each real sequence's state after all its tokens, to
    its slot (``dst`` is the pool; padding is not written); with them, sequence ``seq[m]`` after
    ``off[m]`` tokens to row ``dst[m]`` of ``dst`` [R, conv_dim, K]. Requests read the entering
    states, so they run before the final states are written."""
    _, T, C = qkv.shape
    K = pool.shape[2]
    BC = next_pow2(C) if interpreting(qkv) else min(128, next_pow2(C))
    rows = packed.n if requests is None else requests.count
    if rows == 0:
        return
    req = {} if requests is None else dict(p_req_seq=requests.seq, p_req_n=requests.off, p_req_dst=requests.dst)
    conv_window_kernel[(rows, triton.cdiv(C, BC))](
        p_x=qkv, p_s=pool, p_dst=dst, p_cu=packed.cu, p_slots=packed.slots,
        p_reset=pool if packed.reset is None else packed.reset, **req, T=T, N=packed.n, C=C,
        stride_xt=qkv.stride(1), K=K, KP=next_pow2(K), BC=BC, HAS_RESET=packed.reset is not None,
        FINAL=requests is None, num_warps=4)


def _check_packed(qkv: torch.Tensor, pool: torch.Tensor, weight: torch.Tensor, packed: Packed) -> torch.Tensor:
    w = weight.reshape(weight.shape[0], weight.shape[-1])
    C = w.shape[0]
    if qkv.dim() != 3 or qkv.shape[0] != 1 or qkv.shape[1] != packed.total or qkv.shape[2] != C or \
            pool.dim() != 3 or tuple(pool.shape[1:]) != (C, w.shape[1]):
        raise ValueError(f"conv1d (packed): expected qkv [1, {packed.total}, C], a pool [S, C, K] and weight "
                         f"[C, 1, K]; found {list(qkv.shape)}, {list(pool.shape)}, {list(weight.shape)}")
    if qkv.stride(-1) != 1 or not pool.is_contiguous():
        raise ValueError("conv1d (packed): expected unit channel stride for qkv and a contiguous pool")
    return w.contiguous()
