"""Stage 8, ``out_proj``."""

from __future__ import annotations

import numpy as np

from .arith import matmul
from .functions import f64


def out_proj(core_gated: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """attn_out = core_gated.reshape(T, Hv·dv) · W_outᵀ.

    core_gated: [..., T, Hv, dv]; weight ``linear_attn.out_proj.weight``: [D, Hv·dv].
    Returns attn_out [..., T, D].
    """
    x = f64(core_gated)
    return matmul(x.reshape(*x.shape[:-2], -1), f64(weight).T)
