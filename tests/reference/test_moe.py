"""The float64 mixture-of-experts block (reference/moe.py) against independent computations: a
token-by-token loop in plain Python floats, the dense mixture it reduces to when every expert is
active, hand-worked tie cases, and the layer that composes it."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gdncheck.reference as R
from gdncheck.config import GDNConfig
from gdncheck.experts import EXPERTS_DOWN, EXPERTS_GATE_UP, ROUTER
from gdncheck.stages import MOE_STAGE_INPUTS, MOE_TENSOR_BY_NAME, moe_layer_tensor_names
from gdncheck.synthetic import make_inputs, make_weights
from tests.helpers import rel_err

E, K, D, IM, IS = 7, 3, 10, 6, 5


def _block(rng, E=E, D=D, Im=IM, Is=IS):
    return {
        "w_router": rng.normal(size=(E, D)) * 0.5,
        "w_gate": rng.normal(size=(E, Im, D)) * 0.3,
        "w_up": rng.normal(size=(E, Im, D)) * 0.3,
        "w_down": rng.normal(size=(E, D, Im)) * 0.3,
        "w_shared_gate": rng.normal(size=(Is, D)) * 0.3,
        "w_shared_up": rng.normal(size=(Is, D)) * 0.3,
        "w_shared_down": rng.normal(size=(D, Is)) * 0.3,
        "w_shared_expert_gate": rng.normal(size=(1, D)) * 0.5,
    }


def _call(h, w, top_k, norm=True):
    return R.mlp_moe(h, w["w_router"], w["w_gate"], w["w_up"], w["w_down"], w["w_shared_gate"], w["w_shared_up"],
                     w["w_shared_down"], w["w_shared_expert_gate"], top_k, norm)


def _swiglu_token(x, wg, wu, wd):
    """One token through one SwiGLU, element by element in Python floats."""
    act = []
    for i in range(wg.shape[0]):
        g = math.fsum(float(a) * float(b) for a, b in zip(wg[i], x))
        u = math.fsum(float(a) * float(b) for a, b in zip(wu[i], x))
        act.append(g / (1.0 + math.exp(-g)) * u)
    return [math.fsum(float(wd[d, i]) * act[i] for i in range(len(act))) for d in range(wd.shape[0])]


def _naive_token(x, w, top_k, norm=True):
    logits = [math.fsum(float(a) * float(b) for a, b in zip(row, x)) for row in w["w_router"]]
    z = [math.exp(v) for v in logits]  # small logits here: no shift needed
    total = math.fsum(z)
    p = [v / total for v in z]
    chosen = sorted(range(len(p)), key=lambda e: (-p[e], e))[:top_k]
    weights = [p[e] for e in chosen]
    if norm:
        s = math.fsum(weights)
        weights = [v / s for v in weights]
    mixed = [0.0] * len(x)
    for e, we in zip(chosen, weights):
        y = _swiglu_token(x, w["w_gate"][e], w["w_up"][e], w["w_down"][e])
        mixed = [m + we * v for m, v in zip(mixed, y)]
    gate = math.fsum(float(a) * float(b) for a, b in zip(w["w_shared_expert_gate"][0], x))
    s_out = _swiglu_token(x, w["w_shared_gate"], w["w_shared_up"], w["w_shared_down"])
    shared = [v / (1.0 + math.exp(-gate)) for v in s_out]
    return logits, chosen, weights, mixed, shared


@pytest.mark.parametrize("norm", [True, False], ids=["renormalised", "norm_topk_prob-false"])
def test_block_against_token_loop(norm):
    rng = np.random.default_rng(1)
    w = _block(rng)
    h = rng.normal(size=(2, 5, D))
    logits, weights, selected, experts_out, shared_out, mlp_out = _call(h, w, K, norm)
    assert logits.shape == (2, 5, E) and weights.shape == selected.shape == (2, 5, K)
    assert selected.dtype == np.int64 and experts_out.shape == shared_out.shape == mlp_out.shape == (2, 5, D)
    for b in range(2):
        for t in range(5):
            n_logits, n_chosen, n_weights, n_mixed, n_shared = _naive_token(h[b, t], w, K, norm)
            assert selected[b, t].tolist() == n_chosen
            assert rel_err(logits[b, t], n_logits) < 1e-14
            assert rel_err(weights[b, t], n_weights) < 1e-14
            assert rel_err(experts_out[b, t], n_mixed) < 1e-13
            assert rel_err(shared_out[b, t], n_shared) < 1e-13
    np.testing.assert_array_equal(mlp_out, experts_out + shared_out)
    if norm:
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-15)
    else:
        assert (weights.sum(-1) < 1.0).all()


def test_all_experts_active_is_the_dense_mixture():
    """top_k = E with renormalisation: Σ_e softmax(l)_e · expert_e(x) over every expert."""
    rng = np.random.default_rng(2)
    w = _block(rng)
    h = rng.normal(size=(1, 4, D))
    _, _, selected, experts_out, _, _ = _call(h, w, E)
    assert sorted(selected[0, 0].tolist()) == list(range(E))
    logits = h @ w["w_router"].T
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    dense = sum(p[..., e:e + 1] * R.mlp(h, w["w_gate"][e], w["w_up"][e], w["w_down"][e]) for e in range(E))
    assert rel_err(experts_out, dense) < 1e-14


def test_expert_chosen_by_no_token_is_never_read():
    rng = np.random.default_rng(3)
    w = _block(rng)
    h = rng.normal(size=(1, 2, D))  # 2 tokens x 3 slots < 7 experts: some expert gets no token
    _, _, selected, experts_out, _, _ = _call(h, w, K)
    unused = sorted(set(range(E)) - set(selected.ravel().tolist()))
    for name in ("w_gate", "w_up", "w_down"):
        w[name] = w[name].copy()
        w[name][unused] = np.nan
    np.testing.assert_array_equal(_call(h, w, K)[3], experts_out)


def test_slot_order_does_not_change_the_sum():
    rng = np.random.default_rng(4)
    w = _block(rng)
    h = rng.normal(size=(3, D))
    logits = R.router(h, w["w_router"])
    weights, selected = R.routing(logits, K)
    perm = [2, 0, 1]
    a = R.experts(h, weights, selected, w["w_gate"], w["w_up"], w["w_down"])
    b = R.experts(h, weights[:, perm], selected[:, perm], w["w_gate"], w["w_up"], w["w_down"])
    assert rel_err(b, a) < 1e-15


@pytest.mark.parametrize("logits, top_k, chosen", [
    ([1.0, 3.0, 3.0, 0.0, 3.0], 2, [1, 2]),  # a tie across the k boundary: the lower indices
    ([1.0, 3.0, 3.0, 0.0, 3.0], 3, [1, 2, 4]),
    ([2.0, 5.0, 5.0, 5.0], 4, [1, 2, 3, 0]),  # tied slots in index order
    ([0.0] * 8, 3, [0, 1, 2]),  # all equal (zero router rows)
    ([-1.0, 0.0, -1.0, -1.0, 0.0], 3, [1, 4, 0]),
])
def test_exact_ties_go_to_the_lower_index(logits, top_k, chosen):
    weights, selected = R.routing(np.array([logits]), top_k)
    assert selected[0].tolist() == chosen
    p = np.exp(logits) / np.sum(np.exp(logits))
    np.testing.assert_allclose(weights[0], p[chosen] / p[chosen].sum(), rtol=1e-15)


def test_router_probs_large_logits():
    p = R.router_probs(np.array([[1000.0, 999.0, -1000.0]]))
    np.testing.assert_allclose(p[0], [1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1)), 0.0], rtol=1e-15)


def test_routing_margin():
    logits = np.array([[3.0, 1.0, 2.0, 0.5], [1.0, 1.0, 1.0, 0.0]])
    pm, lm = R.routing_margin(logits, 2)
    np.testing.assert_allclose(lm, [1.0, 0.0])
    p = np.exp(logits[0]) / np.exp(logits[0]).sum()
    np.testing.assert_allclose(pm, [p[2] - p[1], 0.0], atol=1e-16)
    assert np.isinf(R.routing_margin(logits, 4)[0]).all()


def test_vocabulary_block():
    names = moe_layer_tensor_names()
    at = names.index("h_norm")
    assert names[at:] == ("h_norm", "router_logits", "routing_weights", "selected_experts", "experts_out",
                          "shared_out", "mlp_out", "out")
    assert MOE_TENSOR_BY_NAME["selected_experts"].shape == ("T", "top_k")
    assert MOE_STAGE_INPUTS["experts"] == ("h_norm", "routing_weights", "selected_experts")


MOE_CFG = GDNConfig(hidden_size=24, intermediate_size=None, num_k_heads=2, num_v_heads=4, head_k_dim=8,
                    head_v_dim=4, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=10,
                    shared_expert_intermediate_size=14)


def test_layer_runs_the_block_and_traces_it():
    w = make_weights(MOE_CFG, seed=5, router_std=0.3)
    layer = R.Layer(MOE_CFG, w)
    assert layer.mlp_kind == "moe"
    state = layer.new_state(2)
    x = make_inputs(MOE_CFG, 2, 7, seed=6)
    out, trace = layer.forward(x, state, 0)
    assert tuple(trace) == moe_layer_tensor_names()
    gate, up = w[EXPERTS_GATE_UP][:, :10], w[EXPERTS_GATE_UP][:, 10:]
    block = R.mlp_moe(trace["h_norm"], w[ROUTER], gate, up, w[EXPERTS_DOWN], w["mlp.shared_expert.gate_proj.weight"],
                      w["mlp.shared_expert.up_proj.weight"], w["mlp.shared_expert.down_proj.weight"],
                      w["mlp.shared_expert_gate.weight"], 2)
    for name, arr in zip(("router_logits", "routing_weights", "selected_experts", "experts_out", "shared_out",
                          "mlp_out"), block):
        np.testing.assert_array_equal(trace[name], arr, err_msg=name)
    np.testing.assert_array_equal(out, trace["h"] + trace["mlp_out"])
    # the token mixer is the dense layer's: same weights, same h_norm
    dense_cfg = MOE_CFG.replace(num_experts=None, num_experts_per_tok=None, moe_intermediate_size=None,
                                shared_expert_intermediate_size=None, intermediate_size=12)
    dense_w = {**{k: v for k, v in w.items() if not k.startswith("mlp.")},
               **{k: v for k, v in make_weights(dense_cfg).items() if k.startswith("mlp.")}}
    _, dense_trace = R.Layer(dense_cfg, dense_w).forward(x, R.Layer(dense_cfg, dense_w).new_state(2), 0)
    np.testing.assert_array_equal(dense_trace["h_norm"], trace["h_norm"])


def test_mixed_config_picks_the_block_by_layer_index():
    cfg = MOE_CFG.replace(intermediate_size=12, mlp_only_layers=(0,))
    dense = make_weights(cfg, layer=0)
    sparse = make_weights(cfg, layer=1)
    assert R.Layer(cfg, dense, layer_index=0).mlp_kind == "dense"
    assert R.Layer(cfg, sparse, layer_index=1).mlp_kind == "moe"
    x = make_inputs(cfg, 1, 3)
    layer = R.Layer(cfg, dense, layer_index=0)
    _, trace = layer.forward(x, layer.new_state(1), 0)
    assert "router_logits" not in trace and "mlp_out" in trace
