"""Stage 7, ``gated_norm``: RMSNorm per value head with plain w, then the silu(z) gate."""

from __future__ import annotations

import numpy as np

from .functions import f64, rms_norm, silu


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
    return rms_norm(core, w, eps) * silu(f64(z))
