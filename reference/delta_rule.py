"""Stage 6, ``delta_rule``: the gated delta rule, recurrent form (the definition, docs/spec.md §3).

The chunked form, which computes the same function with matrix products, is in
:mod:`.delta_rule_chunked`. Both take their arguments in the same order: ``q, k, v, g, beta``.
"""

from __future__ import annotations

import numpy as np

from . import arith
from .functions import f64


def expand_heads(x: np.ndarray, num_v_heads: int) -> np.ndarray:
    """[..., T, Hk, d] -> [..., T, Hv, d]: value head j reads key head j // (Hv / Hk).

    This is torch ``repeat_interleave`` on the head axis, never ``tile``.
    """
    r = num_v_heads // x.shape[-2]
    return np.repeat(x, r, axis=-2)


def delta_rule_recurrent(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    initial_state: np.ndarray | None = None,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule, token by token. Per value head h (q, k from key head h // r):

        1. S ← exp(g_t) · S                  decay first
        2. m = k_tᵀ S                        read with the decayed state
        3. δ = β_t · (v_t − m)
        4. S ← S + k_t ⊗ δ                   rank-1 write
        5. core_t = scale · q_tᵀ S           read with the updated state

    Equivalently S_t = e^{g_t} (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ and core_t = scale · S_tᵀ q_t.

    q, k: [B, T, Hk, dk] (L2-normalised, unscaled); v: [B, T, Hv, dv]; g, beta: [B, T, Hv];
    initial_state: [B, Hv, dk, dv] or None (zeros); scale defaults to dk^-0.5.
    Returns core [B, T, Hv, dv] and the final state [B, Hv, dk, dv].
    """
    q, k, v, g, beta = (f64(t) for t in (q, k, v, g, beta))
    B, T, Hv, dv = v.shape
    dk = q.shape[-1]
    scale = dk ** -0.5 if scale is None else scale
    qe, ke = expand_heads(q, Hv), expand_heads(k, Hv)
    S = np.zeros((B, Hv, dk, dv)) if initial_state is None else f64(initial_state).copy()
    core = np.empty((B, T, Hv, dv))
    decay = arith.exp(g)  # [B, T, Hv]
    for t in range(T):
        S *= decay[:, t, :, None, None]
        k_t = ke[:, t]  # [B, Hv, dk]
        m = arith.matmul(k_t[:, :, None, :], S)[:, :, 0, :]  # [B, Hv, dv]
        delta = beta[:, t, :, None] * (v[:, t] - m)
        S += k_t[:, :, :, None] * delta[:, :, None, :]
        core[:, t] = scale * arith.matmul(qe[:, t, :, None, :], S)[:, :, 0, :]
    return core, S
