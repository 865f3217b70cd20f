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

from .target import empty, interpreting, kernel, next_pow2, reset_flags


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


@kernel
def conv1d_qk_norm_kernel(p_x, p_s, p_w, p_out, p_conv, p_s_out, p_reset, T, NT, C, Hk, DK, DV, stride_xb,
                          stride_xt, K: tl.constexpr, KP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                          INPLACE: tl.constexpr, STORE_CONV: tl.constexpr, HAS_RESET: tl.constexpr):
    """conv1d + SiLU, then the L2 norm of each q and k head (stage 4) — reference/conv1d.py,
    reference/qk_norm.py.

    One program per head slot: slots [0, Hk) are q heads (dk channels each), [Hk, 2·Hk) k heads,
    then Hv v heads (dv channels, not normalised). qkv (x): [B, T, C] strided; state,
    state_out: [B, C, K]; out: [B, T, C] contiguous holding [q̂ | k̂ | v]; STORE_CONV also writes
    the pre-norm qkv_conv to conv (capture mode; the math is unchanged); HAS_RESET: rows with a
    nonzero reset [B] start from a zero state. Grid:
    (B · NT, 2·Hk + Hv), NT = cdiv(T, BT); BD = next_pow2(max(dk, dv)).
    """
    i_bt, i_s = tl.program_id(0), tl.program_id(1)
    i_b = i_bt // NT
    i_t = i_bt % NT
    keep = _row_kept(p_reset, i_b, HAS_RESET)
    is_qk = i_s < 2 * Hk
    c0 = tl.where(is_qk, i_s * DK, 2 * Hk * DK + (i_s - 2 * Hk) * DV)
    width = tl.where(is_qk, DK, DV)
    o_d = tl.arange(0, BD)
    o_c = c0 + o_d
    m_c = o_d < width
    o_t = i_t * BT + tl.arange(0, BT)
    b_y = _causal_conv_silu(p_x, p_s, p_w, i_b, keep, o_t, o_c, m_c, T, C, stride_xb, stride_xt, K, BT, BD)
    m_out = (o_t < T)[:, None] & m_c[None, :]
    o_out = (i_b.to(tl.int64) * T + o_t[:, None]) * C + o_c[None, :]
    if STORE_CONV:
        tl.store(p_conv + o_out, b_y.to(p_conv.dtype.element_ty), mask=m_out)
    b_rn = 1.0 / tl.sqrt(tl.sum(b_y * b_y, axis=1) + 1e-6)
    b_scale = tl.where(is_qk, b_rn, 1.0)
    tl.store(p_out + o_out, (b_y * b_scale[:, None]).to(p_out.dtype.element_ty), mask=m_out)
    if i_t == NT - 1:
        _next_conv_state(p_x, p_s, p_s_out, i_b, keep, o_c, m_c, T, C, stride_xb, stride_xt, K, KP, INPLACE)


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


def _token_block(qkv: torch.Tensor, T: int, width: int) -> int:
    if interpreting(qkv):
        return min(next_pow2(T), max(1, 8192 // width))
    # 32 tokens × 128 channels for 16-bit inputs, 16 for fp32: larger tiles spill (compile table,
    # docs/gpu.md)
    wide = 32 if qkv.element_size() <= 2 else 16
    return min(next_pow2(T), wide if width <= 128 else wide // 2)


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
    reset: torch.Tensor | None = None,
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
    BT = _token_block(qkv, T, BD)
    if inplace and T > BT:
        raise ValueError(f"conv1d_qk_norm: an in-place state update needs one token block, found T={T} > {BT}")
    NT = triton.cdiv(T, BT)
    conv1d_qk_norm_kernel[(B * NT, 2 * Hk + Hv)](
        p_x=qkv, p_s=conv_state, p_w=w, p_out=out, p_conv=conv, p_s_out=new_state,
        p_reset=conv_state if reset is None else reset_flags(reset), T=T, NT=NT, C=C, Hk=Hk, DK=dk, DV=dv,
        stride_xb=qkv.stride(0), stride_xt=qkv.stride(1), K=K, KP=next_pow2(K), BT=BT, BD=BD, INPLACE=inplace,
        STORE_CONV=capture, HAS_RESET=reset is not None, num_warps=4)
    key_dim = Hk * dk
    q = out[..., :key_dim].unflatten(-1, (Hk, dk))
    k = out[..., key_dim:2 * key_dim].unflatten(-1, (Hk, dk))
    v = out[..., 2 * key_dim:].unflatten(-1, (Hv, dv))
    return q, k, v, (conv if capture else None), new_state
