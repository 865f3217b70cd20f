"""Float64 kernels whose every bit is the same on every CPU: the golden arithmetic of `.arith`.

Each result is a fixed sequence of IEEE-754 basic operations (`+ − × ÷`, `sqrt`) and exact ones
(`rint`, comparisons, `where`, bit manipulation): no BLAS, no einsum, no `np.exp`/`np.log`, no
fused multiply-add. `matmul` and `tree_sum_last` add in a fixed pairwise tree; `exp`, `log` and
`log1p_unit` are built from basic operations (within 0.9, 1.1 and 1.5 ulp), their constants from
exact rationals and `decimal`.

The algorithms and their error bounds: docs/math.md §7.
"""

from __future__ import annotations

import functools
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np

#: Elements of the largest product array ``matmul`` forms at once (8 MB of float64).
PIECE = 1 << 20


def _ln2() -> Decimal:
    with localcontext() as ctx:
        ctx.prec = 60
        return Decimal(2).ln()


def _head(value: Decimal, bits: int) -> float:
    """value rounded to ``bits`` significant bits (so that n · head is exact for |n| < 2^(53 − bits))."""
    m, e = math.frexp(float(value))
    return math.ldexp(math.floor(m * 2 ** bits), e - bits)


LN2 = _ln2()
LN2_HI = _head(LN2, 32)
LN2_LO = float(LN2 - Decimal(LN2_HI))
INV_LN2 = float(1 / LN2)
SQRT2 = float(Decimal(2).sqrt())


def _bernoulli(count: int) -> list[Fraction]:
    """B_0 .. B_{count-1} (B_1 = -1/2), from Σ_{j<=m} C(m+1, j) B_j = 0 for m >= 1."""
    B = [Fraction(1)]
    for m in range(1, count):
        B.append(-sum(math.comb(m + 1, j) * B[j] for j in range(m)) / (m + 1))
    return B


#: 2·B_2k / (2k)! for k = 6 .. 0, Horner order (highest first): c(z) = r·coth(r/2), z = r²
EXP_COTH = tuple(float(2 * b / math.factorial(2 * k)) for k, b in reversed(list(enumerate(_bernoulli(13)[::2]))))
#: 2/(2k+1) for k = 10 .. 1, Horner order: R = Σ_k 2 z^k / (2k+1), z = s²
LOG_SERIES = tuple(float(Fraction(2, 2 * k + 1)) for k in range(10, 0, -1))

# Constants as 0-d arrays: a ufunc takes them a little faster than Python floats (these kernels run
# on arrays of a few elements, where the per-call cost is what counts)
_EXP_MAX = np.array(710.0)  # e^710 overflows; clamping there keeps n a small integer and still gives inf
_EXP_MIN = np.array(-746.0)  # e^-746 rounds to 0
_C = tuple(np.array(c) for c in EXP_COTH)
_INV_LN2, _LN2_HI, _LN2_LO = np.array(INV_LN2), np.array(LN2_HI), np.array(LN2_LO)
_ONE, _TWO = np.array(1.0), np.array(2.0)
_MANTISSA = np.int64((1 << 52) - 1)
_ONE_BITS = np.int64(1023 << 52)


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _elementwise(f):
    """Let ``f`` (written for arrays of at least one axis: its in-place steps need arrays) take any shape."""

    @functools.wraps(f)
    def wrapper(x) -> np.ndarray:
        x = f64(x)
        return f(x.reshape(1)).reshape(()) if x.ndim == 0 else f(x)

    return wrapper


@_elementwise
def exp(x) -> np.ndarray:
    """e^x: inf above 709.78, 0 below -745.13 (subnormal in between, rounded once), NaN for NaN."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # NaN: its n is garbage, y stays NaN
        xc = np.minimum(np.maximum(x, _EXP_MIN), _EXP_MAX)
        n = np.rint(np.multiply(xc, _INV_LN2))
        r = np.multiply(n, _LN2_HI)  # exact
        np.subtract(xc, r, out=r)  # exact (Sterbenz), or n = 0
        r -= np.multiply(n, _LN2_LO)
        z = np.multiply(r, r)
        q = np.multiply(z, _C[0])
        for ck in _C[1:-1]:
            q += ck
            q *= z  # q = c − 2 = Σ_{k>=1} ..., at most 0.02
        y = np.subtract(r, q)
        q += _TWO
        q -= r  # c − r, in [1.6, 2.4]
        y /= q
        y *= r  # e^r − 1 − r = r·(r − (c − 2)) / (c − r), about r²/2
        y += r
        y += _ONE
        # y · 2^n as y · 2^h · 2^(n − h), h = floor(n / 2): both factors are normal (n is in [-1076, 1024]),
        # the first product is exact, the second the one rounding (to inf, a normal or a subnormal)
        ni = n.astype(np.int64)
        h = ni >> 1
        rest = ni - h
        y *= _pow2(h)
        y *= _pow2(rest)
    return y


def _pow2(n: np.ndarray) -> np.ndarray:
    """2^n (float64, exact) for int64 n in [-1022, 1023] (overwritten), from its bits."""
    n = np.asarray(n)
    n += 1023
    n <<= 52
    return n.view(np.float64)


@_elementwise
def log(x) -> np.ndarray:
    """Natural logarithm: -inf at 0, NaN below 0 and for NaN, inf at inf; subnormals included."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _log(x)


def _log(x: np.ndarray) -> np.ndarray:
    ok = (x > 0) & (x < np.inf)
    xs = np.where(ok, x, 1.0)
    tiny = xs < np.finfo(np.float64).smallest_normal
    xs = np.where(tiny, xs * 2.0 ** 54, xs)  # exact: subnormals become normal
    bits = np.ascontiguousarray(xs).view(np.int64)
    e = ((bits >> 52) - 1023).astype(np.float64) - np.where(tiny, 54.0, 0.0)
    m = ((bits & _MANTISSA) | _ONE_BITS).view(np.float64)  # [1, 2)
    big = m > SQRT2
    m = np.where(big, m * 0.5, m)  # [√½, √2)
    e += big
    y = _log1p_reduced(m - 1.0)  # m − 1 is exact (Sterbenz)
    y += e * LN2_LO
    y += e * LN2_HI  # e · LN2_HI is exact
    y = np.where(ok, y, np.where(x == 0, -np.inf, np.where(x == np.inf, np.inf, np.nan)))
    return y


@_elementwise
def log1p_unit(u) -> np.ndarray:
    """log(1 + u) for u in [0, 1] (accurate for tiny u too), as :func:`log` would give log(w) for
    w = 1 + u rounded (w in [1, 2], so e is 0 or 1 and no bits are needed), plus the rounding error
    of w divided by w: u − (w − 1) is exact (Sterbenz)."""
    u = f64(u)
    w = 1.0 + u
    big = w > SQRT2
    f = w.copy()
    np.multiply(w, 0.5, out=f, where=big)  # in [√½, √2]
    f -= 1.0  # exact (Sterbenz)
    y = _log1p_reduced(f)
    y += big * LN2_LO
    y += big * LN2_HI
    err = w - 1.0  # exact
    np.subtract(u, err, out=err)
    err /= w
    y += err
    return y


def _log1p_reduced(f: np.ndarray) -> np.ndarray:
    """log(1 + f) for f in [√½ − 1, √2 − 1] (f exact)."""
    s = f / (2.0 + f)
    z = s * s
    R = np.full(z.shape, LOG_SERIES[0])
    for c in LOG_SERIES[1:]:
        R *= z
        R += c
    R *= z
    hfsq = 0.5 * f * f
    t = hfsq + R
    t *= s
    t = hfsq - t
    return f - t


def tree_sum_last(x) -> np.ndarray:
    """Σ over the last axis, kept as an axis of length 1, added pairwise in the fixed tree of
    :func:`_tree_reduce_first` (the same order, along the last axis)."""
    x = f64(x)
    n = x.shape[-1]
    if n < 2:
        return np.zeros(x.shape[:-1] + (1,)) if n == 0 else x.copy()
    h = n // 2
    p = np.empty(x.shape[:-1] + (h + n % 2,))
    np.add(x[..., :h], x[..., h : 2 * h], out=p[..., :h])
    if n % 2:
        p[..., h] = x[..., n - 1]
    n = p.shape[-1]
    while n > 1:
        h = n // 2
        np.add(p[..., :h], p[..., h : 2 * h], out=p[..., :h])
        if n % 2:
            p[..., h] = p[..., n - 1]
        n = h + n % 2
    return p[..., :1]


def _tree_reduce_first(p: np.ndarray) -> np.ndarray:
    """Σ over axis 0 of ``p`` (overwritten): the first half plus the second half, element by element,
    until one term is left; an odd last term moves to the end of the kept half."""
    n = p.shape[0]
    while n > 1:
        h = n // 2
        np.add(p[:h], p[h : 2 * h], out=p[:h])
        if n % 2:
            p[h] = p[n - 1]
        n = h + n % 2
    return p[0]


def _first(a: np.ndarray, axis: int) -> np.ndarray:
    """A view of ``a`` with ``axis`` moved to the front (np.moveaxis without its argument checks)."""
    axis %= a.ndim
    return a.transpose((axis,) + tuple(i for i in range(a.ndim) if i != axis))


def matmul(a, b) -> np.ndarray:
    """a [..., M, K] · b [..., K, N] -> [..., M, N] (leading axes broadcast), each element's K products
    summed by :func:`_tree_reduce_first`. The products are formed K first ([K, ..., M, N]), a piece
    of rows (and, for a wide 2-D b, of columns) at a time, so that they stay about :data:`PIECE`
    elements."""
    a, b = f64(a), f64(b)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not chain ([..., M, K] by [..., K, N])")
    K, N = b.shape[-2:]
    if K == 0:
        return np.zeros(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], N))
    if b.ndim == 2:  # a weight matrix: every row of a is independent
        a2 = a.reshape(math.prod(a.shape[:-1]), K)
        R = a2.shape[0]
        if R * K * N <= PIECE:
            p = np.multiply(a2.T[:, :, None], b[:, None, :], out=np.empty((K, R, N)))
            out = _tree_reduce_first(p).copy()
        else:
            out = np.empty((R, N))
            cols = N if K * N <= PIECE else max(1, PIECE // K)
            rows = max(1, PIECE // (K * cols))
            for r0 in range(0, R, rows):
                at = a2[r0 : r0 + rows].T[:, :, None]  # [K, rows, 1]
                for c0 in range(0, N, cols):
                    p = np.multiply(at, b[:, None, c0 : c0 + cols])  # [K, rows, cols]: K first
                    out[r0 : r0 + rows, c0 : c0 + cols] = _tree_reduce_first(p)
        return out.reshape(a.shape[:-1] + (N,))
    nd = max(a.ndim, b.ndim)
    a = a.reshape((1,) * (nd - a.ndim) + a.shape)
    b = b.reshape((1,) * (nd - b.ndim) + b.shape)
    at = _first(a, -1)[..., None]  # [K, ..., M, 1]
    bt = _first(b, -2)[..., None, :]  # [K, ..., 1, N]
    M = a.shape[-2]
    shape = np.broadcast_shapes(at.shape, bt.shape)
    size = math.prod(shape)  # of all the products
    if size <= PIECE:
        return _tree_reduce_first(np.multiply(at, bt, out=np.empty(shape))).copy()
    out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (M, N))
    rows = max(1, PIECE * M // size)
    for r0 in range(0, M, rows):
        out[..., r0 : r0 + rows, :] = _tree_reduce_first(np.multiply(at[..., r0 : r0 + rows, :], bt))
    return out
