"""The property strategies explore the suite's regimes (conformance/properties/strategies.py): half
of the draws realistic, each edge reachable and reaching its edge (checked with numpy on the drawn
weights, independently of the layer code); a property failure names the first differing tensor in
pipeline order (conformance/properties/check.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdncheck.config import GDNConfig
from gdncheck.conformance.properties.check import assert_identical
from gdncheck.conformance.properties.strategies import (
    GATE_REGIMES,
    REALISTIC,
    InputDraw,
    WeightsDraw,
    build_inputs,
    build_weights,
    weight_draws,
)

CFG = GDNConfig(hidden_size=32, intermediate_size=16, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16,
                conv_kernel=4, rms_norm_eps=1e-6)


def _b_and_softplus_arg(w, x):
    """b and a + dt_bias of every token, from the weights alone (RMSNorm with 1 + w, then the projections)."""
    xn = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + CFG.rms_norm_eps) * (1.0 + w["input_layernorm.weight"])
    return xn @ w["linear_attn.in_proj_b.weight"].T, xn @ w["linear_attn.in_proj_a.weight"].T + w["linear_attn.dt_bias"]


def _draw(regime, seed=3):
    drawn = build_weights(CFG, WeightsDraw(seed, "shared", 0.02, regime))
    w = {k: np.asarray(v, dtype=np.float64) for k, v in drawn.items()}
    x = np.asarray(build_inputs(CFG, 1, 24, InputDraw(seed, REALISTIC)), dtype=np.float64)
    return w, x


def test_half_of_the_draws_are_realistic_and_every_regime_is_drawn():
    seen = []

    @settings(max_examples=300, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(weight_draws())
    def collect(d):
        seen.append(d.regime)

    collect()
    share = seen.count(REALISTIC) / len(seen)
    assert 0.3 < share < 0.7, share
    assert set(seen) >= {REALISTIC, *GATE_REGIMES}


def test_realistic_draws_remember_and_have_unit_order_writes():
    w, x = _draw(REALISTIC)
    b, arg = _b_and_softplus_arg(w, x)
    A = np.exp(w["linear_attn.A_log"])
    decay = np.exp(-A * np.logaddexp(0.0, arg))
    assert np.median(decay) > 0.9 and np.all(np.abs(b) < 15)


@pytest.mark.parametrize("regime,check", [
    ("sigmoid_tails", lambda w, b, arg: 18 < np.median(np.abs(b)) < 26 and np.all(np.abs(b) > 12)),
    ("softplus_edges", lambda w, b, arg: arg.max() > 20 and arg.min() < -20),
    ("decay_one",
     lambda w, b, arg: np.median(np.exp(w["linear_attn.A_log"][0]) * np.logaddexp(0.0, arg[..., 0])) < 1e-7),
    ("f16_state",  # every decay 1 - 2e-4 (within 1.7e-4 and 2.3e-4), writes mostly below 1e-4, a few strong
     lambda w, b, arg: np.all(np.abs(np.exp(w["linear_attn.A_log"]) * np.logaddexp(0.0, arg) - 2e-4) < 3e-5)
     and np.median(1.0 / (1.0 + np.exp(-b))) < 1e-4 and 0.0 < np.mean(b > 0.0) < 0.3),
])
def test_each_gate_edge_reaches_its_edge(regime, check):
    w, x = _draw(regime)
    b, arg = _b_and_softplus_arg(w, x)
    assert check(w, b, arg)


def test_the_qk_eps_edge_brings_a_key_heads_squared_norm_to_eps():
    w, x = _draw("qk_eps")
    xn = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + CFG.rms_norm_eps) * (1.0 + w["input_layernorm.weight"])
    q0 = xn @ w["linear_attn.in_proj_qkv.weight"][: CFG.head_k_dim].T  # key head 0's q, before the conv
    q1 = xn @ w["linear_attn.in_proj_qkv.weight"][CFG.head_k_dim: 2 * CFG.head_k_dim].T
    assert 1e-8 < np.median(np.sum(q0 * q0, axis=-1)) < 1e-4 < np.median(np.sum(q1 * q1, axis=-1))


def test_a_property_failure_names_the_first_tensor_in_pipeline_order():
    """A snapshot that aliases live buffers changes core first and attn_out after it: the message
    names core (docs/spec.md §2 order), not the alphabetically first attn_out."""
    same = {n: np.zeros(3) for n in ("x_norm", "core", "attn_out", "out", "seq_len")}
    other = {**same, "core": np.ones(3), "attn_out": np.ones(3), "out": np.ones(3)}
    with pytest.raises(AssertionError) as e:
        assert_identical(other, same, "replay")
    assert str(e.value).startswith("core")
    with pytest.raises(AssertionError) as e:
        assert_identical({**same, "seq_len": np.ones(3), "out": np.ones(3)}, same, "replay")
    assert str(e.value).startswith("out")  # names outside the stage vocabulary come last


#: Each edge of the fixture suite (fixtures/cases.py EDGES) and what the property draws reach it with:
#: a weights regime, an input kind, or the plain strategy (one head, one-token calls).
EDGE_DRAWS = {"rmsnorm-eps": ("input", "norm_eps"), "qk-eps": ("weights", "qk_eps"),
              "gated-eps": ("weights", "gated_eps"), "softplus": ("weights", "softplus_edges"),
              "sigmoid": ("weights", "sigmoid_tails"), "state-norms": ("weights", "state_norms"),
              "f16-state": ("weights", "f16_state"), "single": ("program", "one head, one token")}


def test_every_edge_of_the_suite_is_drawn():
    """A new edge case must come with its draw (item 6 of issue 13: the properties explore the same
    edges): every EDGES entry maps to a regime or input kind the strategies draw, and the single
    edge (one token, one head) is a program the differential property draws."""
    from gdncheck.conformance.properties.differential import draw_program
    from gdncheck.conformance.properties.strategies import INPUT_KINDS
    from gdncheck.fixtures.cases import EDGES

    assert set(EDGE_DRAWS) == set(EDGES)
    for edge, (kind, name) in EDGE_DRAWS.items():
        if kind == "weights":
            assert name in GATE_REGIMES, edge
        elif kind == "input":
            assert name in INPUT_KINDS, edge
    single = []

    @settings(max_examples=400, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def collect(data):
        p = draw_program(data)
        single.append(p.cfg.num_v_heads == 1 and 1 in p.lengths)

    collect()
    assert any(single)
