"""The chunked (WY/UT) delta rule against the recurrent definition: 1e-12 relative, every output
and the final state, for T up to 4096, all head ratios, extreme gates, any chunk size."""

from __future__ import annotations

import numpy as np
import pytest
from gdncheck.reference import delta_rule_chunked, delta_rule_recurrent
from gdncheck.reference.delta_rule_chunked import unit_lower_inverse
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import delta_inputs, rel_err

BOUND = 1e-12


def _check(q, k, v, g, beta, S0, C):
    o_r, s_r = delta_rule_recurrent(q, k, v, g, beta, S0)
    o_c, s_c = delta_rule_chunked(q, k, v, g, beta, S0, chunk_size=C)
    assert o_c.shape == o_r.shape and s_c.shape == s_r.shape
    e_o, e_s = rel_err(o_c, o_r), rel_err(s_c, s_r)
    assert e_o <= BOUND and e_s <= BOUND, (
        f"chunked vs recurrent: core rel err {e_o:.2e}, state rel err {e_s:.2e}, but should be <= {BOUND:g} "
        f"[delta_rule_chunked(T={q.shape[1]}, Hk={q.shape[2]}, Hv={v.shape[2]}, chunk_size={C})]"
    )


@pytest.mark.parametrize("T", [1, 63, 64, 65, 300, 4096])
@pytest.mark.parametrize("ratio", [1, 2, 3, 4])
def test_chunked_equals_recurrent_lengths_and_ratios(T, ratio):
    rng = np.random.default_rng(T * 10 + ratio)
    Hk = 1 if T == 4096 else 2
    q, k, v, g, beta = delta_inputs(rng, 1, T, Hk, Hk * ratio, 8, 6, g_range=(-1.0, 0.0))
    S0 = rng.normal(size=(1, Hk * ratio, 8, 6))
    _check(q, k, v, g, beta, S0, 64)


@pytest.mark.parametrize("regime", ["g_zero", "g_tiny", "g_very_negative", "g_mixed_extreme",
                                    "beta_zero", "beta_one", "beta_one_repeated_keys"])
def test_chunked_equals_recurrent_extreme_gates(regime):
    rng = np.random.default_rng(11)
    B, T, Hk, Hv, dk, dv = 2, 150, 2, 4, 8, 4
    q, k, v, g, beta = delta_inputs(rng, B, T, Hk, Hv, dk, dv)
    if regime == "g_zero":
        g = np.zeros_like(g)
    elif regime == "g_tiny":
        g = -rng.uniform(0, 1e-9, size=g.shape)
    elif regime == "g_very_negative":
        g = -rng.uniform(50, 5000, size=g.shape)
    elif regime == "g_mixed_extreme":
        g = np.where(rng.random(g.shape) < 0.2, -rng.uniform(100, 1e4, size=g.shape), -rng.uniform(0, 1e-3, g.shape))
    elif regime == "beta_zero":
        beta = np.zeros_like(beta)
    elif regime == "beta_one":
        beta = np.ones_like(beta)
        g = np.zeros_like(g)
    elif regime == "beta_one_repeated_keys":
        beta = np.ones_like(beta)
        k = np.repeat(k[:, :1], T, axis=1)
    S0 = rng.normal(size=(B, Hv, dk, dv)) * 10
    _check(q, k, v, g, beta, S0, 64)


@given(
    T=st.integers(1, 200).map(int),
    C=st.sampled_from([1, 2, 5, 16, 32, 48, 64, 100]),
    ratio=st.sampled_from([1, 2, 3, 4]),
    seed=st.integers(0, 2**31 - 1),
    with_state=st.booleans(),
)
def test_chunked_equals_recurrent_property(T, C, ratio, seed, with_state):
    rng = np.random.default_rng(seed)
    q, k, v, g, beta = delta_inputs(rng, 2, T, 1, ratio, 5, 3, g_range=(-3.0, 0.0))
    S0 = rng.normal(size=(2, ratio, 5, 3)) if with_state else None
    _check(q, k, v, g, beta, S0, C)


def test_zero_padding_changes_nothing():
    """Appending tokens with k = v = beta = g = 0 leaves the outputs and the state unchanged."""
    rng = np.random.default_rng(12)
    q, k, v, g, beta = delta_inputs(rng, 1, 10, 1, 2, 4, 3)
    o, s = delta_rule_chunked(q, k, v, g, beta, chunk_size=4)
    pad = lambda x: np.concatenate([x, np.zeros((1, 3, *x.shape[2:]))], axis=1)  # noqa: E731
    o2, s2 = delta_rule_chunked(pad(q), pad(k), pad(v), pad(g), pad(beta), chunk_size=4)
    np.testing.assert_allclose(o2[:, :10], o, rtol=1e-14, atol=1e-16)
    np.testing.assert_allclose(s2, s, rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("C", [1, 2, 7, 16, 64])
def test_unit_lower_inverse(C):
    rng = np.random.default_rng(C)
    A = np.tril(rng.uniform(-1, 1, size=(3, C, C)), -1)
    inv = unit_lower_inverse(A)
    for i in range(3):
        np.testing.assert_allclose(inv[i] @ (np.eye(C) + A[i]), np.eye(C), atol=1e-10)
        np.testing.assert_allclose(np.triu(inv[i], 1), 0.0)
