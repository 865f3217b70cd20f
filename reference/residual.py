"""Stages 9 and 12, ``residual`` and ``output``: the two residual adds."""

from __future__ import annotations

import numpy as np

from .functions import f64


def residual(x: np.ndarray, attn_out: np.ndarray) -> np.ndarray:
    """h = x + attn_out.   x, attn_out: [..., T, D] -> h: [..., T, D]."""
    return f64(x) + f64(attn_out)


def output(h: np.ndarray, mlp_out: np.ndarray) -> np.ndarray:
    """out = h + mlp_out.   h, mlp_out: [..., T, D] -> out: [..., T, D]."""
    return f64(h) + f64(mlp_out)
