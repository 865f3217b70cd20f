"""Elementwise functions and norms several stages share, in float64, written for accuracy first.

``softplus`` is the exact ``log(1 + e^x)`` at every x, never overflowing (torch's threshold-20 shortcut
differs by < 3e-9). ``sigmoid`` is the plain ``1 / (1 + exp(−x))``: one exp, one add and one division, each
correctly rounded or nearly so, with no cancellation, so every value is within a few ulps wherever it is a
normal number, far tails included (tests/reference/test_functions.py checks it against extended
precision). Both come from :mod:`.arith`, as do the sums of the norms, so that they follow its
arithmetic mode. The functions reuse their temporaries in place: they run on [T, 8192]-sized arrays.
"""

from __future__ import annotations

import numpy as np

from . import arith
from .arith import sigmoid, softplus

#: Elements per piece where a function works piece by piece (8 MB of float64): its temporaries stay
#: small and are reused, instead of whole fresh [T, 8192] arrays, which are slow to touch.
PIECE = 1 << 20


__all__ = ["PIECE", "f64", "l2_normalize", "pieces", "rms_norm", "rms_norm_one_plus", "sigmoid", "silu", "softplus"]


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def pieces(n_rows: int, row_size: int):
    """Consecutive slices covering range(n_rows), about PIECE elements each (rows of row_size)."""
    step = max(1, PIECE // max(1, row_size))
    for start in range(0, n_rows, step):
        yield slice(start, min(n_rows, start + step))


def silu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x * sigmoid(x) (for x < -708, where sigmoid(x) is subnormal, |silu(x)| < 1e-304 and may be 0).

    ``out``: a C-contiguous float64 array of x's shape to write to (x itself is allowed). Computed a
    piece of rows at a time, so that the result is the only large array.
    """
    x = f64(x)
    out = np.empty(x.shape) if out is None else out
    if out.shape != x.shape or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float64 array of shape {x.shape}")
    x2 = x.reshape(-1, x.shape[-1] if x.ndim else 1)
    out2 = out.reshape(x2.shape)
    for rows in pieces(*x2.shape):
        s = sigmoid(x2[rows])
        s *= x2[rows]
        out2[rows] = s
    return out


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2, last axis) + eps) * weight (weight applied as given)."""
    x = f64(x)
    y = np.square(x, out=np.empty(x.shape))
    rms = np.sqrt(arith.mean_last(y) + eps)
    np.divide(x, rms, out=y)
    y *= f64(weight)
    return y


def rms_norm_one_plus(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """The layer RMSNorm of Qwen3.5: x / sqrt(mean(x^2) + eps) * (1 + w)."""
    return rms_norm(x, 1.0 + f64(weight), eps)


def l2_normalize(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum(x^2, last axis) + eps), the eps inside the sqrt."""
    x = f64(x)
    y = np.square(x, out=np.empty(x.shape))
    norm = np.sqrt(arith.sum_last(y) + eps)
    return np.divide(x, norm, out=y)
