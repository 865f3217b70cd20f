"""Stage 7, ``gated_norm``: RMSNorm per value head with plain w, then the silu(z) gate."""

from __future__ import annotations

import numpy as np

from .functions import f64, pieces, rms_norm, silu


def gated_norm(core: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """core_gated = core / sqrt(mean_dv(core²) + eps) · w_norm · silu(z)   — norm first, then gate.

    core, z: [..., T, Hv, dv]; weight ``linear_attn.norm.weight``: [dv] (shared by every head) or
    [Hv·dv] (per_head, head j uses elements j·dv:(j+1)·dv). The weight is applied as plain w (not 1+w).
    Returns core_gated [..., T, Hv, dv].
    """
    core = f64(core)
    hv, dv = core.shape[-2:]
    w = f64(weight)
    w = w.reshape(hv, dv) if w.size == hv * dv and w.size != dv else w.reshape(dv)
    out = rms_norm(core, w, eps)  # C-contiguous, [..., T, Hv, dv]
    out2, z2 = out.reshape(-1, hv * dv), f64(z).reshape(-1, hv * dv)
    for rows in pieces(*out2.shape):
        out2[rows] *= silu(z2[rows])
    return out
