"""Each reference stage against an independent formulation: hand-computed values, explicit sums."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gdncheck.reference import (
    conv1d,
    delta_rule_recurrent,
    gated_norm,
    gates,
    in_proj,
    input_norm,
    mlp,
    out_proj,
    output,
    post_norm,
    qk_norm,
    residual,
)
from tests.helpers import delta_inputs


def test_input_norm_hand_computed():
    # x = [3, 4]: mean(x^2) = 12.5; w = [0, 1] -> (1 + w) = [1, 2]
    x = np.array([[[3.0, 4.0]]])
    out = input_norm(x, np.array([0.0, 1.0]), eps=0.0)
    r = math.sqrt(12.5)
    np.testing.assert_allclose(out, [[[3 / r, 8 / r]]], rtol=1e-15)


def test_input_norm_eps_inside_sqrt():
    x = np.zeros((1, 1, 4))
    x[0, 0, 0] = 1e-4
    out = input_norm(x, np.zeros(4), eps=1e-6)
    expected = 1e-4 / math.sqrt(1e-8 / 4 + 1e-6)
    assert out[0, 0, 0] == pytest.approx(expected, rel=1e-14)


def test_post_norm_is_one_plus_w():
    rng = np.random.default_rng(1)
    h = rng.normal(size=(2, 3, 5))
    w = rng.normal(size=5)
    out = post_norm(h, w, 1e-6)
    for idx in np.ndindex(2, 3):
        row = h[idx]
        inv = 1 / math.sqrt(sum(v * v for v in row) / 5 + 1e-6)
        for d in range(5):
            assert out[idx][d] == pytest.approx(row[d] * inv * (1 + w[d]), rel=1e-13)


def test_in_proj_explicit_sums():
    rng = np.random.default_rng(2)
    D, Hv, dv, conv_dim = 5, 2, 3, 7
    x = rng.normal(size=(1, 2, D))
    w_qkv, w_z = rng.normal(size=(conv_dim, D)), rng.normal(size=(Hv * dv, D))
    w_a, w_b = rng.normal(size=(Hv, D)), rng.normal(size=(Hv, D))
    qkv, z, a, b = in_proj(x, w_qkv, w_z, w_a, w_b)
    assert qkv.shape == (1, 2, conv_dim) and z.shape == (1, 2, Hv, dv) and a.shape == b.shape == (1, 2, Hv)
    for t in range(2):
        for c in range(conv_dim):
            assert qkv[0, t, c] == pytest.approx(sum(w_qkv[c, d] * x[0, t, d] for d in range(D)), rel=1e-12)
        for h in range(Hv):
            for e in range(dv):  # value head h owns rows h*dv:(h+1)*dv of in_proj_z
                assert z[0, t, h, e] == pytest.approx(sum(w_z[h * dv + e, d] * x[0, t, d] for d in range(D)),
                                                      rel=1e-12)
            assert a[0, t, h] == pytest.approx(sum(w_a[h, d] * x[0, t, d] for d in range(D)), rel=1e-12)
            assert b[0, t, h] == pytest.approx(sum(w_b[h, d] * x[0, t, d] for d in range(D)), rel=1e-12)


def _silu(u):
    return u / (1 + math.exp(-u))


@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("T", [1, 2, 6])
def test_conv1d_explicit_sum_with_history(K, T):
    rng = np.random.default_rng(3)
    C = 3
    qkv = rng.normal(size=(1, T, C))
    state = rng.normal(size=(1, C, K))  # last K pre-conv columns, oldest first
    w = rng.normal(size=(C, 1, K))
    y, new_state = conv1d(qkv, state, w)
    history = [state[0, :, j] for j in range(K)] + [qkv[0, t] for t in range(T)]  # oldest first
    for t in range(T):
        for c in range(C):
            # w[:, K-1] multiplies the newest token (index K + t in history), w[:, 0] the oldest used
            s = sum(w[c, 0, j] * history[K + t - (K - 1) + j][c] for j in range(K))
            assert y[0, t, c] == pytest.approx(_silu(s), rel=1e-13, abs=1e-15)
    expected_state = np.stack(history[-K:], axis=-1)
    np.testing.assert_array_equal(new_state[0], expected_state)


def test_conv1d_zero_history_first_tokens():
    # From a zero state the first output sees only w[:, K-1] * x_0.
    w = np.array([[[1.0, 2.0, 3.0, 5.0]]])
    y, st = conv1d(np.array([[[0.5], [0.25]]]), np.zeros((1, 1, 4)), w)
    assert y[0, 0, 0] == pytest.approx(_silu(5 * 0.5), rel=1e-15)
    assert y[0, 1, 0] == pytest.approx(_silu(3 * 0.5 + 5 * 0.25), rel=1e-15)
    np.testing.assert_array_equal(st[0, 0], [0.0, 0.0, 0.5, 0.25])


def test_qk_norm_split_order_and_norms():
    Hk, dk, Hv, dv = 2, 3, 4, 2
    conv_dim = 2 * Hk * dk + Hv * dv
    x = np.arange(1, conv_dim + 1, dtype=float).reshape(1, 1, conv_dim)
    q, k, v = qk_norm(x, Hk, dk, Hv, dv)
    for h in range(Hk):
        qraw = x[0, 0, h * dk:(h + 1) * dk]
        kraw = x[0, 0, Hk * dk + h * dk:Hk * dk + (h + 1) * dk]
        np.testing.assert_allclose(q[0, 0, h], qraw / math.sqrt((qraw ** 2).sum() + 1e-6), rtol=1e-15)
        np.testing.assert_allclose(k[0, 0, h], kraw / math.sqrt((kraw ** 2).sum() + 1e-6), rtol=1e-15)
    np.testing.assert_array_equal(v[0, 0].ravel(), x[0, 0, 2 * Hk * dk:])
    # q is not scaled by dk^-0.5 here: its norm is ~1
    assert np.linalg.norm(q[0, 0, 0]) == pytest.approx(1.0, abs=1e-6)


def test_gates_hand_values():
    a = np.array([[[0.0, 25.0, -30.0]]])
    b = np.array([[[0.0, 3.0, -40.0]]])
    A_log = np.log(np.array([1.0, 2.0, 16.0]))
    dt_bias = np.array([0.0, 0.0, 0.0])
    g, beta = gates(a, b, A_log, dt_bias)
    assert g[0, 0, 0] == pytest.approx(-math.log(2.0), rel=1e-15)
    # softplus(25) is the exact log(1 + e^25), not torch's threshold shortcut 25
    assert g[0, 0, 1] == pytest.approx(-2.0 * (25.0 + math.log1p(math.exp(-25.0))), rel=1e-15)
    assert g[0, 0, 1] != -50.0
    assert g[0, 0, 2] == pytest.approx(-16.0 * math.log1p(math.exp(-30.0)), rel=1e-14)
    assert beta[0, 0, 0] == 0.5
    assert beta[0, 0, 1] == pytest.approx(1 / (1 + math.exp(-3.0)), rel=1e-15)
    assert beta[0, 0, 2] == pytest.approx(math.exp(-40.0), rel=1e-12)  # no underflow to 0


def test_gates_dt_bias_added_before_softplus():
    g, _ = gates(np.array([[[1.0]]]), np.zeros((1, 1, 1)), np.array([0.0]), np.array([2.0]))
    assert g[0, 0, 0] == pytest.approx(-math.log1p(math.exp(3.0)), rel=1e-15)


@pytest.mark.parametrize("Hk,Hv", [(1, 1), (2, 4), (1, 3), (2, 8)])
def test_delta_rule_recurrent_closed_form(Hk, Hv):
    """S_t = e^{g_t} (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, core_t = scale · S_tᵀ q_t,
    with value head j reading key head j // (Hv/Hk)."""
    rng = np.random.default_rng(4)
    B, T, dk, dv = 2, 7, 4, 3
    q, k, v, g, beta = delta_inputs(rng, B, T, Hk, Hv, dk, dv)
    S0 = rng.normal(size=(B, Hv, dk, dv))
    core, S = delta_rule_recurrent(q, k, v, g, beta, S0)
    r = Hv // Hk
    scale = dk ** -0.5
    for bi in range(B):
        for h in range(Hv):
            St = S0[bi, h].copy()
            for t in range(T):
                kt = k[bi, t, h // r][:, None]
                St = math.exp(g[bi, t, h]) * (np.eye(dk) - beta[bi, t, h] * kt @ kt.T) @ St \
                    + beta[bi, t, h] * kt @ v[bi, t, h][None, :]
                np.testing.assert_allclose(core[bi, t, h], scale * St.T @ q[bi, t, h // r], rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(S[bi, h], St, rtol=1e-12, atol=1e-14)


def test_delta_rule_interleaved_not_tiled():
    """With Hk=2, Hv=4: value head 1 must read key head 0 (interleave), not key head 1 (tile)."""
    rng = np.random.default_rng(5)
    q, k, v, g, beta = delta_inputs(rng, 1, 3, 2, 4, 4, 2)
    core, _ = delta_rule_recurrent(q, k, v, g, beta)
    # head 1 alone, fed key head 0
    solo, _ = delta_rule_recurrent(q[:, :, :1], k[:, :, :1], v[:, :, 1:2], g[:, :, 1:2], beta[:, :, 1:2])
    np.testing.assert_allclose(core[:, :, 1], solo[:, :, 0], rtol=1e-14)
    tiled, _ = delta_rule_recurrent(q[:, :, 1:2], k[:, :, 1:2], v[:, :, 1:2], g[:, :, 1:2], beta[:, :, 1:2])
    assert np.abs(core[:, :, 1] - tiled[:, :, 0]).max() > 1e-3


def test_delta_rule_delta_property_beta_one():
    """beta = 1, no decay, orthonormal keys: reading with q = k_i returns scale * v_i exactly."""
    dk, dv, T = 4, 3, 4
    keys = np.eye(dk)[:T]
    k = keys[None, :, None, :]
    v = np.arange(T * dv, dtype=float).reshape(1, T, 1, dv)
    _, S = delta_rule_recurrent(k, k, v, np.zeros((1, T, 1)), np.ones((1, T, 1)))
    for i in range(T):
        np.testing.assert_allclose(keys[i] @ S[0, 0], v[0, i, 0], rtol=0, atol=1e-14)


def test_gated_norm_shared_and_per_head():
    rng = np.random.default_rng(6)
    Hv, dv = 3, 4
    core = rng.normal(size=(1, 2, Hv, dv))
    z = rng.normal(size=(1, 2, Hv, dv))
    w_shared = rng.normal(size=dv)
    w_per_head = rng.normal(size=Hv * dv)
    out_s = gated_norm(core, z, w_shared, 1e-6)
    out_p = gated_norm(core, z, w_per_head, 1e-6)
    for t in range(2):
        for h in range(Hv):
            row = core[0, t, h]
            inv = 1 / math.sqrt((row ** 2).mean() + 1e-6)
            for e in range(dv):
                gate = _silu(z[0, t, h, e])
                # norm first (plain w, not 1 + w), then the gate
                assert out_s[0, t, h, e] == pytest.approx(row[e] * inv * w_shared[e] * gate, rel=1e-13)
                assert out_p[0, t, h, e] == pytest.approx(row[e] * inv * w_per_head[h * dv + e] * gate, rel=1e-13)


def test_out_proj_mlp_residual_explicit():
    rng = np.random.default_rng(7)
    D, Hv, dv, I = 3, 2, 2, 4
    cg = rng.normal(size=(1, 1, Hv, dv))
    w_out = rng.normal(size=(D, Hv * dv))
    ao = out_proj(cg, w_out)
    flat = cg[0, 0].ravel()
    for d in range(D):
        assert ao[0, 0, d] == pytest.approx(sum(w_out[d, c] * flat[c] for c in range(Hv * dv)), rel=1e-13)
    x = rng.normal(size=(1, 1, D))
    np.testing.assert_array_equal(residual(x, ao), x + ao)
    wg, wu, wd = rng.normal(size=(I, D)), rng.normal(size=(I, D)), rng.normal(size=(D, I))
    m = mlp(x, wg, wu, wd)
    act = [_silu(sum(wg[i, d] * x[0, 0, d] for d in range(D))) * sum(wu[i, d] * x[0, 0, d] for d in range(D))
           for i in range(I)]
    for d in range(D):
        assert m[0, 0, d] == pytest.approx(sum(wd[d, i] * act[i] for i in range(I)), rel=1e-12)
    np.testing.assert_array_equal(output(x, m), x + m)
