"""The golden arithmetic (gdncheck/portable.py, reference/arith.py): accuracy against correctly rounded
decimal values, the documented summation order against scalar Python arithmetic, and the mode switch."""

from __future__ import annotations

import math
import threading
import warnings
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from gdncheck import portable
from gdncheck.reference import arith, delta_rule_chunked
from gdncheck.reference.functions import silu
from tests.helpers import delta_inputs, rel_err

ULPS = 2.0  # exp, log, log1p_unit: each measured at about one ulp at worst
ULPS_COMPOSED = 3.0  # softplus, sigmoid, silu: an exp, then one or two more roundings
TINY = 2.0 ** -1022


def _ulps(values, exact: list[Decimal]) -> np.ndarray:
    """|value − exact| in ulps of exact (as a float64); in units of the smallest subnormal below the
    normal range."""
    out = []
    for v, e in zip(np.asarray(values, dtype=np.float64).ravel().tolist(), exact):
        ef = float(e)
        unit = math.ulp(ef) if abs(ef) >= TINY else 5e-324
        out.append(float(abs(Decimal(v) - e) / Decimal(unit)) if math.isfinite(v) else math.inf)
    return np.array(out)


def _worst(name, x, values, exact, bound):
    ulps = _ulps(values, exact)
    i = int(np.argmax(ulps))
    assert ulps[i] <= bound, (
        f"{name}({x[i]!r}) = {float(values.ravel()[i])!r} is {ulps[i]:.2f} ulps from {exact[i]}, "
        f"but should be within {bound} [gdncheck.portable]"
    )


def _decimal(f, x):
    with localcontext() as ctx:
        ctx.prec = 50
        return [f(Decimal(v)) for v in np.asarray(x, dtype=np.float64).tolist()]


def _exp_arguments() -> np.ndarray:
    rng = np.random.default_rng(0)
    ln2 = math.log(2.0)
    halfway = (np.arange(-1070, 1020, 7) + 0.5) * ln2  # |r| at its largest, both signs
    return np.concatenate([
        rng.uniform(-745.0, 709.78, 2000), rng.normal(size=500), rng.normal(size=200) * 1e-9,
        halfway[(halfway > -745) & (halfway < 709.7)], np.nextafter(halfway[(halfway > -745) & (halfway < 709.7)], 0),
        [0.0, -0.0, 5e-324, -1e-300, 1.0, -1.0, 709.78, -708.39, -720.0, -744.4, -745.1],
    ])


def test_exp_within_two_ulps_subnormals_included():
    x = _exp_arguments()
    _worst("exp", x, portable.exp(x), _decimal(Decimal.exp, x), ULPS)


def test_exp_limits_without_warnings():
    x = np.array([np.inf, -np.inf, np.nan, 709.8, 1000.0, -746.0, -1e6, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = portable.exp(x)
    np.testing.assert_array_equal(y, [np.inf, 0.0, np.nan, np.inf, np.inf, 0.0, 0.0, 1.0])
    assert portable.exp(np.array(1.0)).shape == () and portable.exp(np.zeros((2, 0))).shape == (2, 0)


def test_log_within_two_ulps_subnormals_included():
    rng = np.random.default_rng(1)
    x = np.concatenate([
        np.exp(rng.uniform(-744.0, 709.0, 2000)), rng.uniform(0.5, 2.0, 500), 1.0 + rng.normal(size=200) * 1e-9,
        [5e-324, 1e-310, TINY, 1.0, 2.0, 0.5, math.sqrt(2.0), np.nextafter(math.sqrt(2.0), 2), 1.7976931348623157e308],
    ])
    _worst("log", x, portable.log(x), _decimal(Decimal.ln, x), ULPS)


def test_log_limits():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = portable.log(np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan, 1.0]))
    np.testing.assert_array_equal(y, [-np.inf, -np.inf, np.nan, np.inf, np.nan, np.nan, 0.0])


def test_log1p_unit_within_two_ulps_tiny_arguments_included():
    rng = np.random.default_rng(2)
    u = np.concatenate([np.exp(rng.uniform(-745.0, 0.0, 2000)), rng.uniform(0.0, 1.0, 1000),
                        [0.0, 5e-324, 1e-17, 1.0, math.sqrt(2.0) - 1.0, np.nextafter(math.sqrt(2.0) - 1.0, 1)]])
    with localcontext() as ctx:
        ctx.prec = 50
        # ln(1 + u) by its series where 1 + u would need more than 50 digits
        exact = [(1 + Decimal(v)).ln() if v > 1e-20 else Decimal(v) - Decimal(v) ** 2 / 2 for v in u.tolist()]
    _worst("log1p_unit", u, portable.log1p_unit(u), exact, ULPS)


def _golden(f, x):
    with arith.arithmetic("golden"):
        return f(x)


def test_golden_softplus_sigmoid_silu_within_three_ulps():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-740.0, 740.0, 1500), rng.normal(size=500) * 20, [0.0, 20.0, -20.0, 36.7]])
    with localcontext() as ctx:
        ctx.prec = 50
        ex = [Decimal(v).exp() for v in x.tolist()]
        soft = [(1 + e).ln() if e > Decimal("1e-20") else e - e * e / 2 for e in ex]
        sig = [e / (1 + e) for e in ex]
        slu = [Decimal(v) * s for v, s in zip(x.tolist(), sig)]
    _worst("softplus", x, _golden(arith.softplus, x), soft, ULPS_COMPOSED)
    keep = x > -708.0  # sigmoid is subnormal below (0 below -709.78); silu's is below 1e-304 there
    _worst("sigmoid", x[keep], _golden(arith.sigmoid, x)[keep], [s for s, k in zip(sig, keep) if k], ULPS_COMPOSED)
    _worst("silu", x[keep], _golden(silu, x)[keep], [s for s, k in zip(slu, keep) if k], ULPS_COMPOSED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(_golden(arith.sigmoid, np.array([-np.inf, -800.0, 0.0, 800.0, np.inf])),
                                      [0.0, 0.0, 0.5, 1.0, 1.0])
        np.testing.assert_array_equal(_golden(arith.softplus, np.array([-np.inf, -800.0, 800.0, np.inf])),
                                      [0.0, 0.0, 800.0, np.inf])


# --- sums and products: the documented order, exactly ------------------------------------------------
def _scalar_tree(terms: list[float]) -> float:
    """The order of gdncheck/portable.py's docstring, in scalar Python floats (IEEE double, one
    rounding per operation): first half plus second half, element by element; an odd last term is
    carried to the end of the kept half."""
    t = list(terms)
    while len(t) > 1:
        h = len(t) // 2
        t = [t[i] + t[i + h] for i in range(h)] + ([t[-1]] if len(t) % 2 else [])
    return t[0]


@pytest.mark.parametrize("K", [1, 2, 3, 5, 7, 16, 33, 100])
def test_matmul_and_sums_follow_the_documented_order_bit_for_bit(K):
    """Scalar Python arithmetic does not depend on SIMD widths or BLAS: the vectorised kernels must give
    the same bits."""
    rng = np.random.default_rng(K)
    a, b = rng.normal(size=(2, 3, K)), rng.normal(size=(K, 4))
    got = portable.matmul(a, b)
    for i in np.ndindex(2, 3):
        for n in range(4):
            want = _scalar_tree([a[i][k] * b[k, n] for k in range(K)])
            assert got[i][n] == want, f"matmul{i, n}: {got[i][n]!r}, but the documented order gives {want!r}"
    s = rng.normal(size=(2, 3, 4, K))  # batched: [..., M, K] · [..., K, N]
    got = portable.matmul(s[:, :, :1], s.swapaxes(-1, -2)[:, :1])
    for i in np.ndindex(2, 3):
        for n in range(4):
            want = _scalar_tree([s[i][0][k] * s[i[0], 0][n][k] for k in range(K)])
            assert got[i][0][n] == want
    sums = portable.tree_sum_last(s)
    assert sums.shape == (2, 3, 4, 1)
    for i in np.ndindex(2, 3, 4):
        assert sums[i][0] == _scalar_tree(list(s[i]))


def test_matmul_error_bound_against_exact_sums():
    """|error| <= (ceil(log2 K) + 1) · 2^-53 · Σ|a_k b_k| (one rounding per product, one per tree level)."""
    rng = np.random.default_rng(7)
    K = 300
    a = rng.normal(size=(5, K)) * np.exp(rng.uniform(-5, 5, size=(5, K)))
    b = rng.normal(size=(K, 3))
    got = portable.matmul(a, b)
    for m in range(5):
        for n in range(3):
            exact = sum(Fraction(float(a[m, k])) * Fraction(float(b[k, n])) for k in range(K))
            bound = (math.ceil(math.log2(K)) + 1) * 2.0 ** -53 * float(np.sum(np.abs(a[m] * b[:, n])))
            assert abs(Fraction(float(got[m, n])) - exact) <= Fraction(bound), (m, n)


def test_matmul_pieces_do_not_change_the_result(monkeypatch):
    rng = np.random.default_rng(8)
    a, b, s = rng.normal(size=(3, 7, 9)), rng.normal(size=(9, 11)), rng.normal(size=(3, 9, 5))
    whole = portable.matmul(a, b), portable.matmul(a, s)
    monkeypatch.setattr(portable, "PIECE", 20)  # a piece of rows and of columns at a time
    parts = portable.matmul(a, b), portable.matmul(a, s)
    for w, p in zip(whole, parts):
        np.testing.assert_array_equal(w, p)
    assert portable.matmul(np.ones((2, 0)), np.ones((0, 3))).tolist() == [[0.0] * 3] * 2
    with pytest.raises(ValueError, match="do not chain"):
        portable.matmul(np.ones((2, 3)), np.ones((4, 2)))


# --- the mode switch -------------------------------------------------------------------------------
def test_the_mode_is_fast_by_default_and_scoped():
    assert arith.mode() == "fast"
    with arith.arithmetic("golden"):
        assert arith.mode() == "golden"
        with arith.arithmetic("fast"):
            assert arith.mode() == "fast"
        assert arith.mode() == "golden"
        seen = []
        t = threading.Thread(target=lambda: seen.append(arith.mode()))
        t.start()
        t.join()
        assert seen == ["fast"]  # a context variable: another thread has its own
    assert arith.mode() == "fast"
    with pytest.raises(ValueError, match="fast"):
        with arith.arithmetic("exact"):
            pass


def test_fast_mode_is_numpy_as_it_was():
    rng = np.random.default_rng(9)
    x, w = rng.normal(size=(4, 6)) * 30, rng.normal(size=(6, 5))
    np.testing.assert_array_equal(arith.matmul(x, w), x @ w)
    np.testing.assert_array_equal(arith.exp(x), np.exp(x))
    np.testing.assert_array_equal(arith.softplus(x), np.logaddexp(0.0, x))
    np.testing.assert_array_equal(arith.sum_last(x), np.sum(x, axis=-1, keepdims=True))
    np.testing.assert_array_equal(arith.mean_last(x), np.mean(x, axis=-1, keepdims=True))


def test_golden_mode_agrees_with_fast_mode():
    rng = np.random.default_rng(10)
    x, w = rng.normal(size=(4, 33)), rng.normal(size=(33, 5))
    for f in (lambda u: arith.matmul(u, w), arith.sum_last, arith.mean_last):
        assert rel_err(_golden(f, x), f(x)) <= 1e-14  # sums cancel: normwise
    for f in (arith.exp, arith.softplus, arith.sigmoid):
        np.testing.assert_allclose(_golden(f, x * 20), f(x * 20), rtol=1e-14, atol=0)


def test_the_chunked_delta_rule_refuses_golden_mode():
    q, k, v, g, beta = delta_inputs(np.random.default_rng(11), 1, 5, 1, 2, 4, 3)
    with arith.arithmetic("golden"), pytest.raises(ValueError, match="recurrent"):
        delta_rule_chunked(q, k, v, g, beta)
