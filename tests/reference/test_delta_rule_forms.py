"""The chunked (WY/UT) delta rule against the recurrent definition: 1e-12 relative, every output
and the final state, for T up to 4096, all head ratios, extreme gates, any chunk size."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gdncheck.reference import delta_rule_chunked, delta_rule_recurrent
from gdncheck.reference.delta_rule_chunked import BLOCK_TOKENS, unit_lower_inverse
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


@pytest.mark.parametrize("regime", ["g_zero", "g_tiny", "g_very_negative", "g_mixed_extreme", "g_minus_inf",
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
    elif regime == "g_minus_inf":  # exp(g) = 0: a full reset of the state at some tokens
        g = np.where(rng.random(g.shape) < 0.05, -np.inf, g)
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


# The chunked form works a block of chunks at a time (BLOCK_TOKENS tokens, rounded down to whole chunks),
# and a last partial chunk alone: lengths around those boundaries, chunk sizes that do not divide the block.
@pytest.mark.parametrize(("T", "C"), [
    (BLOCK_TOKENS - 1, 64), (BLOCK_TOKENS, 64), (BLOCK_TOKENS + 1, 64), (2 * BLOCK_TOKENS + 63, 64),
    (3 * BLOCK_TOKENS // 2, 48), (BLOCK_TOKENS + 5, 100), (2 * BLOCK_TOKENS + 7, BLOCK_TOKENS + 3),
    (1100, 1), (700, 13),
])
def test_chunked_equals_recurrent_across_blocks(T, C):
    rng = np.random.default_rng(T + C)
    q, k, v, g, beta = delta_inputs(rng, 2, T, 2, 6, 8, 5, g_range=(-1.0, 0.0))
    S0 = rng.normal(size=(2, 6, 8, 5))
    _check(q, k, v, g, beta, S0, C)


@pytest.mark.parametrize("regime", ["g_mixed_extreme", "beta_one_repeated_keys"])
def test_chunked_equals_recurrent_extreme_gates_many_blocks(regime, monkeypatch):
    """Small blocks (two chunks each), so that the extreme regimes cross many block boundaries."""
    monkeypatch.setattr(importlib.import_module("gdncheck.reference.delta_rule_chunked"), "BLOCK_TOKENS", 32)
    rng = np.random.default_rng(5)
    q, k, v, g, beta = delta_inputs(rng, 1, 203, 1, 3, 8, 4)
    if regime == "g_mixed_extreme":
        g = np.where(rng.random(g.shape) < 0.2, -rng.uniform(100, 1e4, size=g.shape), -rng.uniform(0, 1e-3, g.shape))
    else:
        beta = np.ones_like(beta)
        k = np.repeat(k[:, :1], k.shape[1], axis=1)
    _check(q, k, v, g, beta, rng.normal(size=(1, 3, 8, 4)) * 10, 16)


def test_chunked_reads_views_and_leaves_its_inputs_alone():
    """Strided and float32 inputs give the result of their contiguous float64 copies; nothing is written."""
    rng = np.random.default_rng(8)
    q, k, v, g, beta = delta_inputs(rng, 2, 90, 2, 4, 8, 6)
    S0 = rng.normal(size=(2, 4, 8, 6))
    qs = np.swapaxes(np.swapaxes(q, 1, 2).copy(), 1, 2)  # same values, time-minor layout
    vs = np.asfortranarray(v)
    keep = [x.copy() for x in (qs, k, vs, g, beta, S0)]
    o_c, s_c = delta_rule_chunked(qs, k.astype(np.float32), vs, g, beta, S0, chunk_size=32)
    for before, after in zip(keep, (qs, k, vs, g, beta, S0)):
        np.testing.assert_array_equal(before, after)
    o_r, s_r = delta_rule_recurrent(q, k.astype(np.float32).astype(np.float64), v, g, beta, S0)
    assert rel_err(o_c, o_r) <= BOUND and rel_err(s_c, s_r) <= BOUND
    assert o_c.flags.c_contiguous and s_c.flags.c_contiguous


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
@pytest.mark.parametrize("overwrite", [False, True])
def test_unit_lower_inverse(C, overwrite):
    """(I + A)⁻¹ from the strictly lower triangle only: the diagonal and upper triangle of A are ignored."""
    rng = np.random.default_rng(C)
    A = np.tril(rng.uniform(-1, 1, size=(2, 3, C, C)), -1)
    noisy = A + np.triu(rng.uniform(-5, 5, size=A.shape))  # garbage on and above the diagonal
    inv = unit_lower_inverse(noisy.copy() if overwrite else noisy, overwrite_a=overwrite)
    assert inv.shape == A.shape
    for idx in np.ndindex(2, 3):
        np.testing.assert_allclose(inv[idx] @ (np.eye(C) + A[idx]), np.eye(C), atol=1e-10)
        np.testing.assert_array_equal(np.triu(inv[idx], 1), 0.0)
        np.testing.assert_array_equal(np.diag(inv[idx]), 1.0)
