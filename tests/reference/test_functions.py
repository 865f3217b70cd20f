"""The shared elementwise functions against extended precision (np.longdouble) and hand-computed values."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gdncheck.reference import functions
from gdncheck.reference.functions import l2_normalize, rms_norm, sigmoid, silu, softplus

EXTENDED = np.finfo(np.longdouble).eps < 1e-18  # 80-bit x87 or quad; not where longdouble is double
ULPS = 4


def _arguments() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([
        np.linspace(-740.0, 740.0, 100_001),
        rng.normal(size=50_000) * 30,
        rng.normal(size=20_000) * 1e-3,
        [0.0, -0.0, 5e-324, -5e-324, 1e-300, -1e-300, 36.7368005696771, -709.78, 709.78],
    ])


def _ulps(value: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|value − exact| in units in the last place of exact (as a float64), where exact is a normal float64."""
    exact64 = exact.astype(np.float64)
    normal = np.abs(exact64) >= np.finfo(np.float64).smallest_normal
    err = np.abs(value.astype(np.longdouble) - exact) / np.spacing(np.abs(exact64)).astype(np.longdouble)
    return np.where(normal, err.astype(np.float64), 0.0)


@pytest.mark.skipif(not EXTENDED, reason="np.longdouble is not wider than float64 here")
@pytest.mark.parametrize("name", ["sigmoid", "silu"])
def test_sigmoid_and_silu_within_a_few_ulps(name):
    x = _arguments()
    xl = x.astype(np.longdouble)
    exact = 1 / (1 + np.exp(-xl))
    if name == "silu":
        exact = xl * exact
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning from exp(-x) either
        value = sigmoid(x) if name == "sigmoid" else silu(x)
    ulps = _ulps(value, exact)
    if name == "silu":  # x < -708: sigmoid(x) is subnormal (0 below -709.78), so |silu(x)| < 1e-304 is all we ask
        tiny = x < -708.0
        assert np.all(np.abs(value[tiny]) < 1e-304)
        ulps[tiny] = 0.0
    worst = int(np.argmax(ulps))
    assert ulps[worst] <= ULPS, (
        f"{name}({x[worst]!r}) = {value[worst]!r} is {ulps[worst]:.2f} ulps from {exact[worst]!r}, "
        f"but should be within {ULPS} [reference.functions.{name}]"
    )


def test_sigmoid_limits_and_symmetry():
    x = np.array([-np.inf, -1000.0, -800.0, 0.0, 800.0, np.inf])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(sigmoid(x), [0.0, 0.0, 0.0, 0.5, 1.0, 1.0])
    y = np.linspace(-30, 30, 601)
    np.testing.assert_allclose(sigmoid(y) + sigmoid(-y), 1.0, rtol=0, atol=4e-16)


def test_functions_do_not_modify_their_input():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 5))
    keep = x.copy()
    for f in (sigmoid, silu, softplus, lambda u: rms_norm(u, np.ones(5), 1e-6), lambda u: l2_normalize(u)):
        f(x)
        np.testing.assert_array_equal(x, keep)


def test_softplus_exact_tail():
    # log(1 + e^x): e^-40 below 1 ulp of 1 at x = -40 is kept; x = 40 gives 40 + log1p(e^-40)
    assert softplus(np.array(-40.0)) == pytest.approx(np.exp(-40.0), rel=1e-15)
    assert softplus(np.array(40.0)) == 40.0 + np.log1p(np.exp(-40.0))


def test_silu_out_in_place_and_checked():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 4, 5)) * 10
    want = silu(x)
    y = x.copy()
    assert silu(y, out=y) is y
    np.testing.assert_array_equal(y, want)
    with pytest.raises(ValueError, match="C-contiguous float64"):
        silu(x, out=np.empty((5, 4, 3)).T)


@pytest.mark.parametrize("piece", [1, 7, 12, 1 << 20])
def test_piecewise_stages_match_whole_array_formulas(piece, monkeypatch):
    """conv1d, gated_norm and silu work a few rows at a time: pieces that cut through the conv history
    (rows < K) and through heads give the same numbers as the whole-array formulas, bit for bit."""
    from gdncheck.reference import conv1d, gated_norm

    monkeypatch.setattr(functions, "PIECE", piece)
    rng = np.random.default_rng(piece)
    B, T, C, K = 2, 11, 3, 4
    qkv, state, w = rng.normal(size=(B, T, C)), rng.normal(size=(B, C, K)), rng.normal(size=(C, 1, K))
    y, new_state = conv1d(qkv, state, w)
    full = np.concatenate([np.swapaxes(state, 1, 2), qkv], axis=1)  # [B, K + T, C], oldest first
    pre = sum(full[:, 1 + j : 1 + j + T] * w[:, 0, j] for j in range(K))
    np.testing.assert_array_equal(y, pre * (1 / (1 + np.exp(-pre))))
    np.testing.assert_array_equal(new_state, np.swapaxes(full[:, -K:], 1, 2))
    core, z = rng.normal(size=(B, T, 2, 3)), rng.normal(size=(B, T, 2, 3))
    norm_w = rng.normal(size=3)
    want = core / np.sqrt(np.mean(core * core, axis=-1, keepdims=True) + 1e-6) * norm_w * (z / (1 + np.exp(-z)))
    np.testing.assert_allclose(gated_norm(core, z, norm_w, 1e-6), want, rtol=4e-16, atol=0)
