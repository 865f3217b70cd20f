"""Stage 5, ``gates``: the log-decay g and the write strength beta."""

from __future__ import annotations

import numpy as np

from . import arith
from .functions import f64, sigmoid, softplus


def gates(a: np.ndarray, b: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """g = -exp(A_log) · softplus(a + dt_bias);  beta = sigmoid(b).

    a, b: [..., T, Hv]; A_log, dt_bias: [Hv]. Returns g, beta: [..., T, Hv]. g ≤ 0 always, so the
    per-token decay exp(g) lies in (0, 1]. softplus is the exact log(1 + e^x).
    """
    g = -arith.exp(f64(A_log)) * softplus(f64(a) + f64(dt_bias))
    return g, sigmoid(f64(b))
