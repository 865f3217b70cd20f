"""Stage 6, `delta_rule`, chunked (WY / UT-transform) form: the same function as
`.delta_rule.delta_rule_recurrent`, computed with matrix products over chunks of C tokens.

For one chunk of L ≤ C tokens and one value head, with S the state entering the chunk:

    γ_t    = Σ_{u≤t} g_u                                  chunk-local inclusive cumsum
    E_ts   = exp(Σ_{s<u≤t} g_u) for t ≥ s, else 0         (= exp(γ_t − γ_s), masked before exp)
    A_ts   = β_t (k_t·k_s) E_ts for t > s, else 0
    V'     = (I + A)⁻¹ diag(β) (V − diag(e^γ) K S)         the new values, corrected for S
    O      = scale · [diag(e^γ) Q S + (QKᵀ ⊙ E) V']         (E includes the diagonal)
    S_out  = e^{γ_{L−1}} S + Kᵀ diag(e^{γ_{L−1} − γ}) V'    (e^{γ_{L−1} − γ_t} = E_{L−1,t})

Exponents are sums of the g's they span, never differences of cumulative sums. Chunks are taken
`BLOCK_TOKENS` tokens at a time; a last partial chunk is a chunk of its own length.
Why and how it computes: docs/math.md §2.
"""

from __future__ import annotations

import numpy as np

from .arith import require_fast
from .functions import f64

#: Tokens per block of chunks: bounds the working memory independently of T.
BLOCK_TOKENS = 512


def unit_lower_inverse(A: np.ndarray, overwrite_a: bool = False) -> np.ndarray:
    """(I + A)⁻¹ for A [..., C, C], reading only the strictly lower triangle of A (its diagonal and
    upper triangle are taken as zeros).

    Block recursion: level by level, each diagonal block [[L11, 0], [L21, L22]] of size 2s gets its
    lower-left block −L22⁻¹ L21 L11⁻¹ from the inverses of its halves, in place. C is padded to a
    power of two with identity. ``overwrite_a``: A (C-contiguous, C a power of two) may be used as the
    work array, and is then the result.
    """
    C = A.shape[-1]
    P = 1 << max(0, (C - 1).bit_length())
    lead = A.shape[:-2]
    NB = int(np.prod(lead, dtype=np.int64))
    if overwrite_a and P == C and A.flags.c_contiguous:
        X = A.reshape(NB, P, P)
    else:
        X = np.zeros((NB, P, P))
        X[:, :C, :C] = A.reshape(NB, C, C)
    np.copyto(X, np.eye(P), where=~np.tri(P, P, -1, dtype=bool))  # I + the strictly lower triangle of A
    s = 1
    while s < P:
        blocks = _diagonal_blocks(X, 2 * s)
        blocks[..., s:, :s] = -(blocks[..., s:, s:] @ (blocks[..., s:, :s] @ blocks[..., :s, :s]))
        s *= 2
    return X[:, :C, :C].reshape(*lead, C, C)


def _diagonal_blocks(X: np.ndarray, size: int) -> np.ndarray:
    """Writable view [NB, P / size, size, size] of the diagonal blocks of X [NB, P, P] (C-contiguous)."""
    NB, P, _ = X.shape
    item = X.itemsize
    return np.lib.stride_tricks.as_strided(
        X, (NB, P // size, size, size), (X.strides[0], size * (P + 1) * item, P * item, item)
    )


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
    require_fast("the chunked delta rule")
    q, k, v, g, beta = (f64(t) for t in (q, k, v, g, beta))
    B, T, Hv, dv = v.shape
    Hk, dk = q.shape[-2:]
    scale = dk ** -0.5 if scale is None else scale
    C = chunk_size
    S = np.zeros((B, Hv, dk, dv)) if initial_state is None else f64(initial_state).copy()
    S_heads = S.reshape(B, Hk, Hv // Hk, dk, dv)  # a view: updated in place
    out = np.empty((B, T, Hv, dv))
    buffers = _Buffers()
    step = max(1, BLOCK_TOKENS // C) * C
    for t0 in range(0, T, step):
        t1 = min(T, t0 + step)
        whole = t0 + (t1 - t0) // C * C  # whole chunks, then (last block only) a partial one
        for a, b in ((t0, whole), (whole, t1)):
            if b > a:
                _block(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], S_heads, out[:, a:b],
                       min(C, b - a), scale, buffers)
    return out, S


class _Buffers:
    """Scratch arrays by name, reused from block to block (touching fresh memory is slow)."""

    def __init__(self):
        self._arrays: dict[str, np.ndarray] = {}

    def __call__(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        a = self._arrays.get(name)
        if a is None or a.shape != shape:
            a = self._arrays[name] = np.empty(shape)
        return a


def _heads(x: np.ndarray, L: int, Hk: int) -> np.ndarray:
    """View [B, n·L, H, ...] as [B, Hk, H / Hk, n, L, ...]: head h = key head h // r, member h % r."""
    B, TL, H = x.shape[:3]
    return np.moveaxis(x.reshape(B, TL // L, L, Hk, H // Hk, *x.shape[3:]), (3, 4), (1, 2))


def _block(q, k, v, g, beta, S, out, L: int, scale: float, buf: _Buffers) -> None:
    """n whole chunks of L tokens. q, k: [B, n·L, Hk, dk]; v, out: [B, n·L, Hv, dv]; g, beta: [B, n·L, Hv];
    S: [B, Hk, r, dk, dv], the state entering the block, updated in place; ``out`` is written."""
    B, TL, Hk, dk = q.shape
    Hv, dv = v.shape[2:]
    r, n = Hv // Hk, TL // L
    # g = -inf (a full reset) as -1e300: every exp of a sum that holds it is still exactly 0, and the
    # products with 0/1 masks below never meet inf·0
    G, Bt = np.maximum(_heads(g, L, Hk), -1e300), _heads(beta, L, Hk)  # [B, Hk, r, n, L]
    V, O = _heads(v, L, Hk), _heads(out, L, Hk)  # [B, Hk, r, n, L, dv]
    per_key, per_value = (B, Hk, 1, n, L, L), (B, Hk, r, n, L, L)

    # [scale·Q; K] stacked per chunk, so that one product with S gives both Q S and K S
    QK = buf("QK", (B, Hk, 1, n, 2 * L, dk))
    np.multiply(_heads(q, L, Hk), scale, out=QK[..., :L, :])
    QK[..., L:, :] = _heads(k, L, Hk)
    Qs, K = QK[..., :L, :], QK[..., L:, :]
    Kt = np.swapaxes(K, -1, -2)

    # E_ts = exp(Σ_u [u ≤ t] g_u [u > s]) for t ≥ s: the sum as a product of 0/1 masks with g
    lower = np.tri(L)  # [t, u]: u ≤ t
    Gt = np.multiply(G[..., None, :], lower, out=buf("A", per_value))
    E = buf("E", per_value)
    np.matmul(Gt.reshape(-1, L), np.tri(L, L, -1), out=E.reshape(-1, L))  # [u, s]: u > s
    E += np.where(lower > 0, 0.0, -np.inf)  # exp(-inf) = 0 above the diagonal
    np.exp(E, out=E)
    decay_in = np.exp(np.cumsum(G, axis=-1))  # e^{γ_t}
    decay_out = E[..., L - 1, :].copy()  # e^{γ_{L-1} − γ_t}

    KK = np.matmul(K, Kt, out=buf("KK", per_key))
    A = np.multiply(KK, E, out=Gt)
    A *= Bt[..., None]  # β_t (k_t·k_s) E_ts; its diagonal and upper triangle are never read
    T_inv = unit_lower_inverse(A, overwrite_a=True)  # [B, Hk, r, n, L, L]
    QE = np.multiply(np.matmul(Qs, Kt, out=KK), E, out=E)  # scale · QKᵀ ⊙ E

    P = buf("P", (B, Hk, r, 2 * L, dv))
    Y = buf("Y", (B, Hk, r, L, dv))
    Vn = buf("Vn", (B, Hk, r, n, L, dv))  # V' of every chunk of the block
    S_add = buf("S_add", S.shape)
    for j in range(n):
        np.matmul(QK[..., j, :, :], S, out=P)  # [Q S; K S]
        np.multiply(P[..., :L, :], decay_in[..., j, :, None], out=O[..., j, :, :])  # scale · e^γ Q S
        np.multiply(P[..., L:, :], decay_in[..., j, :, None], out=Y)
        np.subtract(V[..., j, :, :], Y, out=Y)
        Y *= Bt[..., j, :, None]  # β (V − e^γ K S)
        np.matmul(T_inv[..., j, :, :], Y, out=Vn[..., j, :, :])  # V'
        np.multiply(Vn[..., j, :, :], decay_out[..., j, :, None], out=Y)
        S *= decay_in[..., j, L - 1, None, None]
        S += np.matmul(Kt[..., j, :, :], Y, out=S_add)  # S_out = e^{γ_{L−1}} S + Kᵀ diag(e^{γ_{L−1}−γ}) V'
    O += np.matmul(QE, Vn, out=buf("QEV", Vn.shape))
