"""The whole layer on the Triton path against the float64 reference layer, per profile: prefill,
decode, prefill + decode, several segments, a batch of two rows with different states and
positions, capture mode, and perturbed weights (known bug classes) that the same bound rejects.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import gdncheck.reference as R
from gdncheck.gpu_impl import Layer
from gdncheck.stages import STAGE_TENSORS
from gdncheck.synthetic import make_inputs, make_weights
from tests.gpu_impl.compare import check, fails, to_np
from tests.gpu_impl.helpers import DEVICE, PROFILE_NAMES
from tests.helpers import tiny_config

CONFIGS = {
    # GVA ratio 2, dk != dv, shared norm weight, chunk 16 (several chunks per prefill)
    "Hk2_Hv4_dk16_dv8": (tiny_config(Hk=2, Hv=4, dk=16, dv=8, D=32, I=48), "shared", 16),
    # ratio 3, dv > dk, per-head norm weight, conv kernel 3, chunk 64 (partial chunks)
    "Hk1_Hv3_dk8_dv16_K3": (tiny_config(Hk=1, Hv=3, dk=8, dv=16, D=24, I=40, K=3), "per_head", 64),
}

#: (start, stop) of consecutive calls: a chunked prefill, two decode steps, a short prefill (the
#: fused recurrent kernel), a chunked prefill again
SEGMENTS = [(0, 37), (37, 38), (38, 39), (39, 44), (44, 70)]


def layers(name: str, profile: str, seed: int = 0, **weight_changes):
    cfg, mode, chunk = CONFIGS[name]
    w = dict(make_weights(cfg, seed=seed, norm_mode=mode))
    ref = R.Layer(cfg, w)
    w.update({k: f(w[k]) for k, f in weight_changes.items()})
    return cfg, ref, Layer(cfg, w, profile=profile, device=DEVICE, chunk_size=chunk)


@pytest.mark.parametrize("profile", PROFILE_NAMES)
@pytest.mark.parametrize("name", CONFIGS)
def test_segments_against_reference(name, profile):
    cfg, ref, layer = layers(name, profile)
    x = make_inputs(cfg, 2, SEGMENTS[-1][1], seed=1)
    ref_state, state = ref.new_state(2), layer.new_state(2)
    for a, b in SEGMENTS:
        want, ref_trace = ref.forward(x[:, a:b], ref_state, a)
        got, trace = layer.forward(x[:, a:b], state, a, capture=True)
        assert got.dtype == layer.dtype and got.device.type == DEVICE.type
        check(got, want, "layer", profile, f"out of tokens {a}:{b}")
        # out alone is dominated by the residual stream: check what the layer adds, stage by stage
        for name in ("core", "attn_out", "mlp_out"):
            check(trace[name], ref_trace[name], "layer", profile, f"{name} of tokens {a}:{b}")
    check(state.recurrent_state, ref_state.recurrent_state, "layer", profile, "final recurrent_state")
    check(state.conv_state, ref_state.conv_state, "layer", profile, "final conv_state")
    assert state.seq_len.tolist() == [70, 70]


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_batch_rows_with_different_states_and_positions(profile, caplog):
    """Row 1 continues after 9 tokens; row 0 says position 0, so it is reset (one warning)."""
    cfg, ref, layer = layers("Hk2_Hv4_dk16_dv8", profile)
    x1, x2 = make_inputs(cfg, 2, 9, seed=2), make_inputs(cfg, 2, 20, seed=3)
    ref_state, state = ref.new_state(2), layer.new_state(2)
    ref.forward(x1, ref_state, 0)
    layer.forward(x1, state, 0)
    with caplog.at_level(logging.WARNING, logger="gdncheck.gpu_impl"):
        got, _ = layer.forward(x2, state, np.array([0, 9]))
        layer.forward(x2[:, :1], state, np.array([20, 0]))  # another mismatch: reset, no second warning
    want, _ = ref.forward(x2, ref_state, np.array([0, 9]))
    check(got, want, "layer", profile, "out, rows at positions 0 and 9")
    warnings = [r for r in caplog.records if r.name == "gdncheck.gpu_impl"]
    assert len(warnings) == 1 and "row 0: state seq_len=9, seq_pos=0" in warnings[0].getMessage()
    assert state.seq_len.tolist() == [21, 1]


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_capture_returns_every_stage_and_changes_nothing(profile):
    cfg, ref, layer = layers("Hk2_Hv4_dk16_dv8", profile)
    x = make_inputs(cfg, 2, 40, seed=4)
    for T in (1, 20, 40):  # decode, recurrent prefill, chunked prefill
        s1, s2 = layer.new_state(2), layer.new_state(2)
        out1, trace1 = layer.forward(x[:, :T], s1, 0)
        out2, trace = layer.forward(x[:, :T], s2, 0, capture=True)
        assert trace1 == {}
        if DEVICE.type == "cuda":
            # compiled, a kernel that also stores its intermediates is a build of its own, whose
            # floating-point contraction may differ (measured on an H200: f32 only): the same
            # numbers within the stage bound, not the same bits
            for a, b, what in ((out2, out1, "out"), (s2.recurrent_state, s1.recurrent_state, "recurrent_state"),
                               (s2.conv_state, s1.conv_state, "conv_state")):
                check(a, to_np(b), "stage", profile, f"capture against no capture: {what}, T={T}")
        else:  # interpreted: every variant runs the same operations, so capture changes no bit
            assert torch.equal(out1, out2), "capture changed the output"
            assert torch.equal(s1.recurrent_state, s2.recurrent_state) and torch.equal(s1.conv_state, s2.conv_state)
        assert torch.equal(trace["out"], out2)
        assert [t.name for t in STAGE_TENSORS] == list(trace)
        _, ref_trace = ref.forward(x[:, :T], ref.new_state(2), 0)
        for spec in STAGE_TENSORS:
            assert tuple(trace[spec.name].shape) == ref_trace[spec.name].shape, spec.name
            check(trace[spec.name], ref_trace[spec.name], "layer", profile, f"trace {spec.name}, T={T}")


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_forced_delta_rule_form(form):
    cfg, ref, layer = layers("Hk1_Hv3_dk8_dv16_K3", "f32")
    x = make_inputs(cfg, 1, 30, seed=5)
    want, _ = ref.forward(x, ref.new_state(1), 0)
    got, _ = layer.forward(x, layer.new_state(1), 0, delta_rule=form, chunk_size=16)
    check(got, want, "layer", "f32", f"out with delta_rule={form}")


WRONG_WEIGHTS = {
    "input norm applied as w": ("input_layernorm.weight", lambda w: w - 1.0),
    "post norm applied as w": ("post_attention_layernorm.weight", lambda w: w - 1.0),
    "gated norm applied as 1 + w": ("linear_attn.norm.weight", lambda w: w + 1.0),
    "conv taps reversed": ("linear_attn.conv1d.weight", lambda w: w[..., ::-1].copy()),
    "dt_bias ignored": ("linear_attn.dt_bias", np.zeros_like),
}


@pytest.mark.parametrize("bug", WRONG_WEIGHTS)
def test_wrong_weights_are_rejected(bug):
    """A port that applies a weight with the wrong convention fails the bf16 layer bound (the
    loosest of the table) on a stage tensor or the state, with the very inputs on which a correct
    port passes every one of them (test_capture_returns_every_stage_and_changes_nothing).

    The residual stream hides such bugs in ``out`` alone: x carries outliers of 20σ while the
    layer adds O(0.1), so a gate checks every stage tensor, as capture mode allows.
    """
    name, change = WRONG_WEIGHTS[bug]
    cfg, ref, layer = layers("Hk2_Hv4_dk16_dv8", "bf16", **{name: change})
    x = make_inputs(cfg, 2, 20, seed=6)
    ref_state, state = ref.new_state(2), layer.new_state(2)
    _, want = ref.forward(x, ref_state, 0)
    _, got = layer.forward(x, state, 0, capture=True)
    ratios = {n: fails(got[n], want[n], "layer", "bf16") for n in want}
    ratios["recurrent_state"] = fails(state.recurrent_state, ref_state.recurrent_state, "layer", "bf16")
    worst = max(ratios, key=ratios.get)
    assert ratios[worst] > 3, f"{bug}: worst stage {worst} only {ratios[worst]:.2f}x the bound"


def test_outputs_are_profile_tensors_on_the_device():
    cfg, _, layer = layers("Hk2_Hv4_dk16_dv8", "bf16")
    state = layer.new_state(3)
    assert state.conv_state.dtype == torch.bfloat16 and state.recurrent_state.dtype == torch.float32
    assert state.seq_len.dtype == torch.int64 and state.conv_state.device.type == DEVICE.type
    out, _ = layer.forward(torch.zeros(3, 2, cfg.hidden_size, dtype=torch.float64), state, 0)
    assert out.shape == (3, 2, cfg.hidden_size) and out.dtype == torch.bfloat16
    assert not torch.isnan(out).any()
    assert to_np(out).shape == (3, 2, cfg.hidden_size)
