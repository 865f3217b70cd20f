"""Stage 6, ``delta_rule``, chunked (WY / UT-transform) form: the same function as
:func:`.delta_rule.delta_rule_recurrent`, computed with matrix products over chunks of C tokens.

For one chunk of L ≤ C tokens and one value head, with S the state entering the chunk
(research/gdn-spec.md §4):

    γ_t    = Σ_{s≤t} g_s                       chunk-local inclusive cumsum
    E_ts   = exp(γ_t − γ_s) for t ≥ s, else 0  (masked before exp)
    A_ts   = β_t (k_t·k_s) E_ts for t > s, else 0
    W      = (I + A)⁻¹ diag(β ⊙ e^γ) K
    U      = (I + A)⁻¹ diag(β) V
    V'     = U − W S
    O      = scale · [diag(e^γ) Q S + (QKᵀ ⊙ E) V']          (E includes the diagonal)
    S_out  = e^{γ_{L−1}} S + Kᵀ diag(e^{γ_{L−1} − γ}) V'

Exponents are formed as sums of the g's they span (all g ≤ 0, so these sums never cancel) rather
than as differences of cumulative sums: that keeps every decay factor to a few ulps even when the
cumulative log-decay is huge (g ≪ 0). The last chunk is zero-padded (k = v = β = g = 0), which
changes neither the state nor the real outputs.
"""

from __future__ import annotations

import numpy as np

from .delta_rule import expand_heads
from .functions import f64

#: Tokens processed per block of chunks; bounds working memory independently of T.
BLOCK_TOKENS = 2048


def unit_lower_inverse(A: np.ndarray) -> np.ndarray:
    """(I + A)⁻¹ for strictly lower-triangular A [..., C, C], by block recursion.

    Level by level, each diagonal block [[L11, 0], [L21, L22]] of size 2s gets its lower-left block
    −L22⁻¹ L21 L11⁻¹ from the inverses of its halves. C is padded to a power of two with identity.
    """
    C = A.shape[-1]
    P = 1 << max(0, (C - 1).bit_length())
    lead = A.shape[:-2]
    NB = int(np.prod(lead, dtype=np.int64))
    L = np.zeros((NB, P, P))
    L[:, :C, :C] = A.reshape(NB, C, C)
    inv = np.zeros((NB, P, P))
    inv[:, np.arange(P), np.arange(P)] = 1.0
    s = 1
    while s < P:
        m = P // (2 * s)
        ar = np.arange(m)
        Lr = L.reshape(NB, m, 2 * s, m, 2 * s)
        Ir = inv.reshape(NB, m, 2 * s, m, 2 * s)
        l21 = Lr[:, ar, s:, ar, :s]  # [m, NB, s, s]
        i11 = Ir[:, ar, :s, ar, :s]
        i22 = Ir[:, ar, s:, ar, s:]
        Ir[:, ar, s:, ar, :s] = -(i22 @ (l21 @ i11))
        s *= 2
    return inv[:, :C, :C].reshape(*lead, C, C)


def delta_rule_chunked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    initial_state: np.ndarray | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule in chunked form. Same arguments, shapes and results as
    :func:`.delta_rule.delta_rule_recurrent`, plus ``chunk_size`` (any positive integer).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, found {chunk_size}")
    q, k, v, g, beta = (f64(t) for t in (q, k, v, g, beta))
    B, T, Hv, dv = v.shape
    dk = q.shape[-1]
    scale = dk ** -0.5 if scale is None else scale
    C = chunk_size
    N = -(-T // C)
    Tp = N * C

    def heads_first(x: np.ndarray) -> np.ndarray:  # [B, T, Hv, ...] -> [B, Hv, N, C, ...] zero-padded
        x = np.moveaxis(x, 2, 1)
        pad = [(0, 0)] * x.ndim
        pad[2] = (0, Tp - T)
        x = np.pad(x, pad)
        return x.reshape(B, Hv, N, C, *x.shape[3:])

    Q = heads_first(expand_heads(q, Hv))
    K = heads_first(expand_heads(k, Hv))
    V = heads_first(v)
    G = heads_first(g)
    Bt = heads_first(beta)

    S = np.zeros((B, Hv, dk, dv)) if initial_state is None else f64(initial_state).copy()
    out = np.empty((B, Hv, N, C, dv))
    strict = np.tri(C, C, -1, dtype=bool)  # t > s
    lower = np.tri(C, C, 0, dtype=bool)  # t >= s
    per_block = max(1, BLOCK_TOKENS // C)
    for n0 in range(0, N, per_block):
        n1 = min(N, n0 + per_block)
        Qb, Kb, Vb, gb, bb = Q[:, :, n0:n1], K[:, :, n0:n1], V[:, :, n0:n1], G[:, :, n0:n1], Bt[:, :, n0:n1]
        # log-decay between tokens: D[t, s] = Σ_{s<u≤t} g_u (t ≥ s), sums of same-sign terms
        D = np.cumsum(np.where(strict, gb[..., :, None], 0.0), axis=-2)
        E = np.where(lower, np.exp(np.where(lower, D, 0.0)), 0.0)
        gamma = np.cumsum(gb, axis=-1)  # Σ_{u≤t} g_u
        rev = np.cumsum(gb[..., ::-1], axis=-1)[..., ::-1]  # Σ_{u≥t} g_u
        tail = np.concatenate([rev[..., 1:], np.zeros_like(rev[..., :1])], axis=-1)  # Σ_{u>t} g_u
        decay_in = np.exp(gamma)
        decay_out = np.exp(tail)
        chunk_decay = np.exp(rev[..., 0])  # Σ over the whole chunk
        KKt = Kb @ np.swapaxes(Kb, -1, -2)
        A = np.where(strict, bb[..., :, None] * KKt * E, 0.0)
        Tinv = unit_lower_inverse(A)
        W = Tinv @ ((bb * decay_in)[..., None] * Kb)
        U = Tinv @ (bb[..., None] * Vb)
        QKt = (Qb @ np.swapaxes(Kb, -1, -2)) * E
        Qd = Qb * decay_in[..., None]
        Kd = np.swapaxes(Kb * decay_out[..., None], -1, -2)  # [.., dk, C]
        for j in range(n1 - n0):
            Vp = U[:, :, j] - W[:, :, j] @ S
            out[:, :, n0 + j] = scale * (Qd[:, :, j] @ S + QKt[:, :, j] @ Vp)
            S = chunk_decay[:, :, j, None, None] * S + Kd[:, :, j] @ Vp
    core = np.moveaxis(out.reshape(B, Hv, Tp, dv)[:, :, :T], 1, 2)
    return np.ascontiguousarray(core), S
