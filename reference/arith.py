"""The reference's primitive operations, in one of two arithmetic modes.

Every stage computes its products, reductions and transcendental functions through these functions.
`fast` (the default) is NumPy with BLAS, whose last bits depend on the CPU; `golden` uses the
kernels of `.portable`, every bit the same on every CPU (the fixture builder's). The mode is a
context variable: it holds inside `with arithmetic("golden"):` only (per thread and asyncio task)::

    with arithmetic("golden"):
        out, trace = layer.forward(x, state, seq_pos=0)

Only the recurrent delta rule has a golden form: the chunked form refuses it (`require_fast`).
The two modes, their costs and why: docs/math.md §7; fixtures/FORMAT.md §10.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from gdncheck import portable

MODES = ("fast", "golden")
_MODE: ContextVar[str] = ContextVar("gdncheck_reference_arithmetic", default="fast")


@contextmanager
def arithmetic(mode: str) -> Iterator[None]:
    """Run the enclosed code in arithmetic ``mode`` (``fast`` or ``golden``)."""
    if mode not in MODES:
        raise ValueError(f"arithmetic mode must be one of {MODES}, found {mode!r}")
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)


def mode() -> str:
    """The arithmetic mode in effect."""
    return _MODE.get()


def require_fast(what: str) -> None:
    """Refuse to run ``what`` (a form with no golden version) in golden mode."""
    if _MODE.get() != "fast":
        raise ValueError(f"{what} has no golden-arithmetic form (it needs BLAS products); "
                         "use the recurrent delta rule (delta_rule='recurrent') in golden mode")


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a [..., M, K] · b [..., K, N] -> [..., M, N], leading axes broadcast (``np.matmul`` of two matrices)."""
    if _MODE.get() == "fast":
        return np.matmul(a, b)
    return portable.matmul(a, b)


def sum_last(x: np.ndarray) -> np.ndarray:
    """Σ over the last axis, kept as an axis of length 1."""
    if _MODE.get() == "fast":
        return np.sum(x, axis=-1, keepdims=True)
    return portable.tree_sum_last(x)


def mean_last(x: np.ndarray) -> np.ndarray:
    """The mean over the last axis, kept as an axis of length 1."""
    if _MODE.get() == "fast":
        return np.mean(x, axis=-1, keepdims=True)
    return portable.tree_sum_last(x) / x.shape[-1]


def exp(x: np.ndarray) -> np.ndarray:
    """e^x (inf where it overflows, without a warning)."""
    if _MODE.get() == "fast":
        with np.errstate(over="ignore"):
            return np.exp(x)
    return portable.exp(x)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), exact for all x and never overflowing: max(x, 0) + log1p(e^−|x|)."""
    if _MODE.get() == "fast":
        return np.logaddexp(0.0, x)
    x = np.asarray(x, dtype=np.float64)
    return np.maximum(x, 0.0) + portable.log1p_unit(portable.exp(-np.abs(x)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(−x)); exp(−x) = inf (x < −709.78, where the true value is below the normal range) gives 0."""
    s = np.negative(np.asarray(x, dtype=np.float64))
    if _MODE.get() == "fast":
        with np.errstate(over="ignore"):
            np.exp(s, out=s)
        s += 1.0
        return np.reciprocal(s, out=s)
    s = portable.exp(s)
    s += 1.0
    return np.divide(1.0, s, out=s)
