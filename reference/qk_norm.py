"""Stage 4, ``qk_norm``: split the conv output into heads; L2-normalise q and k."""

from __future__ import annotations

import numpy as np

from .functions import f64, l2_normalize

QK_L2_EPS = 1e-6


def qk_norm(
    qkv_conv: np.ndarray, num_k_heads: int, head_k_dim: int, num_v_heads: int, head_v_dim: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split ``[Q | K | V]``; q, k ← u / sqrt(Σ_dk u² + 1e-6) per head. q is **not** scaled here.

    qkv_conv: [..., T, conv_dim] with conv_dim = 2·Hk·dk + Hv·dv.
    Returns q [..., T, Hk, dk], k [..., T, Hk, dk], v [..., T, Hv, dv].
    """
    x = f64(qkv_conv)
    key_dim = num_k_heads * head_k_dim
    lead = x.shape[:-1]
    q = x[..., :key_dim].reshape(*lead, num_k_heads, head_k_dim)
    k = x[..., key_dim : 2 * key_dim].reshape(*lead, num_k_heads, head_k_dim)
    v = x[..., 2 * key_dim :].reshape(*lead, num_v_heads, head_v_dim)
    return l2_normalize(q, QK_L2_EPS), l2_normalize(k, QK_L2_EPS), np.ascontiguousarray(v)
