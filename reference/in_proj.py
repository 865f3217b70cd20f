"""Stage 2, ``in_proj``."""

from __future__ import annotations

import numpy as np

from .arith import matmul
from .functions import f64


def in_proj(
    x_norm: np.ndarray, w_qkv: np.ndarray, w_z: np.ndarray, w_a: np.ndarray, w_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """qkv = x_norm W_qkvᵀ, z = x_norm W_zᵀ, a = x_norm W_aᵀ, b = x_norm W_bᵀ.

    x_norm: [..., T, D]; W_qkv: [conv_dim, D] (rows [Q | K | V]); W_z: [Hv·dv, D]; W_a, W_b: [Hv, D].
    Returns qkv [..., T, conv_dim], z [..., T, Hv, dv], a [..., T, Hv], b [..., T, Hv].
    """
    x = f64(x_norm)
    hv = w_a.shape[0]
    qkv = matmul(x, f64(w_qkv).T)
    z = matmul(x, f64(w_z).T).reshape(*x.shape[:-1], hv, w_z.shape[0] // hv)
    a = matmul(x, f64(w_a).T)
    b = matmul(x, f64(w_b).T)
    return qkv, z, a, b
