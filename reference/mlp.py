"""Stage 11, ``mlp``: the dense SwiGLU MLP."""

from __future__ import annotations

import numpy as np

from .arith import matmul
from .functions import f64, silu


def mlp(h_norm: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """mlp_out = (silu(h_norm W_gateᵀ) ⊙ (h_norm W_upᵀ)) W_downᵀ.

    h_norm: [..., T, D]; W_gate, W_up: [I, D]; W_down: [D, I]. Returns mlp_out [..., T, D].
    """
    x = f64(h_norm)
    act = matmul(x, f64(w_gate).T)
    silu(act, out=act)
    act *= matmul(x, f64(w_up).T)
    return matmul(act, f64(w_down).T)
