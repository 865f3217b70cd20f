"""The whole reference layer: against an independent scalar formulation, and its properties
(split invariance, decode = prefill, chunk size, batch independence, snapshots, seq_pos resets).
Input and state errors are the call contract's, tested over every layer in tests/test_call_contract.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gdncheck.errors import SeqPosMismatchError, SnapshotDimensionError
from gdncheck.reference import Layer
from gdncheck.synthetic import make_inputs, make_weights
from tests.helpers import rel_err, tiny_config
from tests.reference.naive_layer import naive_layer

CFG = tiny_config()


def _layer(cfg=CFG, seed=0, **kw):
    return Layer(cfg, make_weights(cfg, seed=seed, **kw))


@pytest.mark.parametrize("norm_mode", ["shared", "per_head"])
@pytest.mark.parametrize("Hk,Hv", [(1, 1), (2, 4), (1, 3)])
def test_layer_against_naive_scalar_formulation(norm_mode, Hk, Hv):
    cfg = tiny_config(Hk=Hk, Hv=Hv, dk=4, dv=3, D=6, I=5, K=3)
    weights = make_weights(cfg, seed=3, norm_mode=norm_mode)
    # gentler decays than the HF init so the state carries information between tokens
    w = dict(weights)
    w["linear_attn.A_log"] = np.full(Hv, -1.0, dtype=np.float32)
    layer = Layer(cfg, w)
    x = make_inputs(cfg, 1, 7, seed=4)
    state = layer.new_state(1)
    out, trace = layer.forward(x, state, 0)
    ref_out, ref_hist, ref_S = naive_layer(cfg, w, x[0].tolist())
    np.testing.assert_allclose(out[0], np.array(ref_out), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(state.recurrent_state[0], np.array(ref_S), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(state.conv_state[0], np.array(ref_hist).T, rtol=0, atol=1e-15)
    assert set(trace) >= {"x", "x_norm", "qkv", "z", "a", "b", "qkv_conv", "q", "k", "v", "g", "beta", "core",
                          "core_gated", "attn_out", "h", "h_norm", "mlp_out", "out"}


def _splits(draw_sizes, T):
    cuts = sorted(set(c for c in draw_sizes if 0 < c < T))
    return list(zip([0, *cuts], [*cuts, T]))


@given(T=st.integers(2, 80), cuts=st.lists(st.integers(1, 79), max_size=4), seed=st.integers(0, 1000))
def test_any_split_equals_one_prefill(T, cuts, seed):
    layer = _layer(seed=seed % 3)
    x = make_inputs(CFG, 2, T, seed=seed)
    ref_state = layer.new_state(2)
    ref, _ = layer.forward(x, ref_state, 0)
    state = layer.new_state(2)
    parts = [layer.forward(x[:, a:b], state, a)[0] for a, b in _splits(cuts, T)]
    got = np.concatenate(parts, axis=1)
    assert rel_err(got, ref) <= 1e-12
    assert rel_err(state.recurrent_state, ref_state.recurrent_state) <= 1e-12
    # matmuls over different row counts round differently in the last bit: compare to rounding
    assert rel_err(state.conv_state, ref_state.conv_state) <= 1e-14
    assert state.seq_len.tolist() == [T, T]


@given(T=st.integers(1, 40), seed=st.integers(0, 1000))
def test_decode_steps_equal_prefill(T, seed):
    layer = _layer()
    x = make_inputs(CFG, 1, T, seed=seed)
    ref, _ = layer.forward(x, layer.new_state(1), 0)
    state = layer.new_state(1)
    steps = [layer.forward(x[:, t:t + 1], state, t)[0] for t in range(T)]
    assert rel_err(np.concatenate(steps, axis=1), ref) <= 1e-12


@given(C=st.sampled_from([1, 3, 16, 33, 64, 128]), seed=st.integers(0, 1000))
def test_chunk_size_does_not_matter(C, seed):
    layer = _layer()
    x = make_inputs(CFG, 2, 70, seed=seed)
    ref, ref_trace = layer.forward(x, layer.new_state(2), 0, delta_rule="recurrent")
    got, trace = layer.forward(x, layer.new_state(2), 0, delta_rule="chunked", chunk_size=C)
    assert rel_err(got, ref) <= 1e-12
    assert rel_err(trace["core"], ref_trace["core"]) <= 1e-12


@given(seed=st.integers(0, 1000), pos=st.lists(st.integers(0, 5), min_size=3, max_size=3))
def test_batch_rows_are_independent(seed, pos):
    layer = _layer()
    x = make_inputs(CFG, 3, 9, seed=seed)
    pre = make_inputs(CFG, 3, 5, seed=seed + 1)
    state = layer.new_state(3)
    # give each row its own history of pos[i] tokens (different states and positions)
    for i in range(3):
        sub = layer.new_state(1)
        if pos[i]:
            layer.forward(pre[i:i + 1, : pos[i]], sub, 0)
        state.conv_state[i], state.recurrent_state[i], state.seq_len[i] = (
            sub.conv_state[0], sub.recurrent_state[0], sub.seq_len[0])
    out, _ = layer.forward(x, state, np.array(pos))
    for i in range(3):
        sub = layer.new_state(1)
        if pos[i]:
            layer.forward(pre[i:i + 1, : pos[i]], sub, 0)
        alone, _ = layer.forward(x[i:i + 1], sub, pos[i])
        assert rel_err(out[i], alone[0]) <= 1e-13


@given(n_more=st.integers(1, 20), n_replay=st.integers(1, 20), seed=st.integers(0, 1000))
def test_snapshot_restore_replay_is_bit_identical(n_more, n_replay, seed):
    layer = _layer()
    x = make_inputs(CFG, 2, 10 + n_more + n_replay, seed=seed)
    state = layer.new_state(2)
    layer.forward(x[:, :10], state, 0)
    snap = state.snapshot()
    first, _ = layer.forward(x[:, 10:10 + n_replay], state, 10)
    layer.forward(x[:, 10 + n_replay:], state, 10 + n_replay)  # more tokens after the snapshot
    state.restore(snap)
    again, _ = layer.forward(x[:, 10:10 + n_replay], state, 10)
    np.testing.assert_array_equal(first, again)
    # the snapshot was not aliased: it still holds the state at 10 tokens
    assert snap.seq_len.tolist() == [10, 10]


def test_snapshot_is_deep_copy_both_ways():
    layer = _layer()
    state = layer.new_state(1)
    layer.forward(make_inputs(CFG, 1, 5, seed=1), state, 0)
    snap = state.snapshot()
    before = snap.recurrent_state.copy()
    state.recurrent_state += 1.0
    np.testing.assert_array_equal(snap.recurrent_state, before)
    state.restore(snap)
    snap.recurrent_state += 1.0
    np.testing.assert_array_equal(state.recurrent_state, before)


def test_snapshot_of_other_dimensions_refused():
    other = tiny_config(Hv=2)
    snap = Layer(other, make_weights(other)).new_state(1).snapshot()
    state = _layer().new_state(1)
    with pytest.raises(SnapshotDimensionError, match="fingerprint"):
        state.restore(snap)
    with pytest.raises(SnapshotDimensionError, match="batch 2"):
        state.restore(_layer().new_state(2).snapshot())


def test_mismatched_seq_pos_resets_and_warns_once(caplog):
    layer = _layer()
    x = make_inputs(CFG, 1, 12, seed=2)
    state = layer.new_state(1)
    layer.forward(x[:, :6], state, 0)
    with caplog.at_level(logging.WARNING, logger="gdncheck.reference"):
        got, _ = layer.forward(x[:, 6:9], state, 3)  # state has 6 tokens, the call says 3
        layer.forward(x[:, 9:10], state, 50)  # a second mismatch: reset again, no second warning
    fresh, _ = layer.forward(x[:, 6:9], layer.new_state(1), 0)
    np.testing.assert_array_equal(got, fresh)  # same as running from a zero state
    assert state.seq_len.tolist() == [51]
    warnings = [r for r in caplog.records if "mismatch" in r.getMessage()]
    assert len(warnings) == 1
    assert "seq_len=6" in warnings[0].getMessage() and "seq_pos=3" in warnings[0].getMessage()


def test_strict_per_call_overrides_the_layer():
    """``forward(strict=...)`` overrides the layer's setting, both ways (the refusal itself, and that it
    changes nothing, is the call contract's: tests/test_call_contract.py)."""
    x = make_inputs(CFG, 1, 5, seed=6)
    layer = _layer()
    state = layer.new_state(1)
    layer.forward(x[:, :3], state, 0)
    with pytest.raises(SeqPosMismatchError, match="seq_len=3, seq_pos=1"):
        layer.forward(x[:, 3:], state, 1, strict=True)
    strict_layer = Layer(CFG, make_weights(CFG), strict=True)
    strict_layer.forward(x[:, 3:], state, 1, strict=False)  # reset, not refused
    assert state.seq_len.tolist() == [3]
