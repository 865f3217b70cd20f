"""The sharded reference (reference/sharded.py) against the unsharded layer and by-hand algebra."""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck.reference import Layer, delta_rule_recurrent
from gdncheck.reference.sharded import apply, compose, cp_forward, summary, tp_forward, tpcp_forward, transition
from gdncheck.sharding import cp_plan, tp_plan, tpcp_plan
from gdncheck.synthetic import make_inputs, make_weights
from tests.helpers import delta_inputs, tiny_config


def _unsharded(cfg, w, x, seed=3):
    layer = Layer(cfg, w)
    state = layer.new_state(batch=x.shape[0])
    rng = np.random.default_rng(seed)  # a non-zero state entering the call
    state.conv_state[:] = rng.normal(size=state.conv_state.shape)
    state.recurrent_state[:] = 0.3 * rng.normal(size=state.recurrent_state.shape)
    state.seq_len[:] = 5
    conv0, rec0 = state.conv_state.copy(), state.recurrent_state.copy()
    out, trace = layer.forward(x, state, seq_pos=5)
    return conv0, rec0, out, trace, state


PLANS = [((2, 4), 2, None), ((2, 4), 4, None), ((2, 6), 3, [3, 2, 1]), ((2, 6), 3, [2, 2, 2]), ((1, 3), 3, None)]


@pytest.mark.parametrize("heads,world,counts", PLANS)
@pytest.mark.parametrize("norm_mode", ["shared", "per_head"])
def test_tp_ranks_are_the_unsharded_layer_sliced_and_partials_sum(heads, world, counts, norm_mode):
    cfg = tiny_config(Hk=heads[0], Hv=heads[1], dk=4, dv=3, D=8, I=12, K=4)
    w = make_weights(cfg, seed=1, norm_mode=norm_mode)
    x = make_inputs(cfg, 2, 7, seed=2)
    conv0, rec0, out, trace, state = _unsharded(cfg, w, x)
    plan = tp_plan(cfg, world, counts)
    out_tp, ranks, tail = tp_forward(cfg, w, plan, x, conv0, rec0)
    assert np.max(np.abs(out_tp - out)) <= 1e-12 * max(1.0, np.max(np.abs(out)))
    assert np.max(np.abs(tail["attn_out"] - trace["attn_out"])) <= 1e-13
    for share, r in zip(plan.shares, ranks):
        ch, heads_v = share.conv_channels(cfg), slice(share.v_start, share.v_stop)
        assert np.allclose(r["trace"]["qkv"], trace["qkv"][..., ch], rtol=0, atol=1e-13)
        assert np.allclose(r["trace"]["core"], trace["core"][..., heads_v, :], rtol=0, atol=1e-12)
        assert np.allclose(r["trace"]["q"], trace["q"][..., share.k_start:share.k_stop, :], rtol=0, atol=1e-13)
        assert np.allclose(r["conv_state"], state.conv_state[:, ch], rtol=0, atol=1e-13)
        assert np.allclose(r["recurrent_state"], state.recurrent_state[:, heads_v], rtol=0, atol=1e-12)
    # a partial alone is not the output (unless one rank): the all-reduce matters
    if world > 1:
        assert np.max(np.abs(ranks[0]["partial"] - trace["attn_out"])) > 1e-6


def test_transition_and_summary_by_hand_two_tokens():
    rng = np.random.default_rng(0)
    q, k, v, g, beta = delta_inputs(rng, 1, 2, 1, 1, 3, 2)
    M = transition(k, g, beta)[0, 0]
    A = [np.exp(g[0, t, 0]) * (np.eye(3) - beta[0, t, 0] * np.outer(k[0, t, 0], k[0, t, 0])) for t in range(2)]
    assert np.allclose(M, A[1] @ A[0], rtol=0, atol=1e-15)
    S0 = rng.normal(size=(1, 1, 3, 2))
    _, S_end = delta_rule_recurrent(q, k, v, g, beta, S0, 1.0)
    assert np.max(np.abs(apply(summary(k, v, g, beta), S0) - S_end)) <= 1e-14


@pytest.mark.parametrize("T,world,layout,bounds", [
    (37, 2, "contiguous", None), (37, 4, "contiguous", [1, 2, 30]), (40, 2, "zigzag", None),
    (37, 4, "zigzag", None), (70, 2, "contiguous", [65])])
def test_cp_composition_equals_unsharded_final_state(T, world, layout, bounds):
    cfg = tiny_config(Hk=2, Hv=4, dk=4, dv=3, D=8, I=12, K=4)
    w = make_weights(cfg, seed=4)
    x = make_inputs(cfg, 2, T, seed=5)
    conv0, rec0, out, trace, state = _unsharded(cfg, w, x)  # chunked form (T > 1): an independent algorithm
    plan = cp_plan(T, world, layout, bounds)
    segs, (conv_end, rec_end) = cp_forward(cfg, w, plan, x, conv0, rec0)
    total = segs[0]["summary"]
    for s in segs[1:]:
        total = compose(s["summary"], total)
    assert np.max(np.abs(apply(total, rec0) - state.recurrent_state)) <= 1e-12
    assert np.max(np.abs(rec_end - state.recurrent_state)) <= 1e-12
    assert np.max(np.abs(conv_end - state.conv_state)) <= 1e-15
    stitched = np.concatenate([s["out"] for s in segs], axis=1)
    assert np.max(np.abs(stitched - out)) <= 1e-12 * max(1.0, np.max(np.abs(out)))
    # a rank that starts from zeros (no predecessor summary) is wrong: the protocol is not vacuous
    later = segs[1]
    assert np.max(np.abs(later["entry_state"])) > 1e-3
    # the halo is the conv state the unsharded call holds at the segment's first token
    a = later["tokens"][0]
    K = cfg.conv_kernel
    cols = np.concatenate([conv0, np.swapaxes(trace["qkv"][:, :a], 1, 2)], axis=-1)[..., -K:]
    assert np.max(np.abs(later["halo"] - cols)) <= 1e-15


@pytest.mark.parametrize("tp_world,counts,cp_world,layout", [(2, None, 2, "zigzag"), (3, [2, 3, 1], 2, "contiguous")])
def test_tp_times_cp_each_tp_rank_split_over_tokens(tp_world, counts, cp_world, layout):
    """TP x CP: every TP rank, as a standalone layer of its heads, runs its tokens context-parallel; the
    stitched partials summed over the TP ranks equal the unsharded attn_out, and each TP rank's composed
    summaries its share of the unsharded final state."""
    from gdncheck.sharding import standalone

    cfg = tiny_config(Hk=2, Hv=6, dk=4, dv=3, D=8, I=12, K=4)
    w = make_weights(cfg, seed=6)
    T = 21
    x = make_inputs(cfg, 1, T, seed=7)
    conv0, rec0, out, trace, state = _unsharded(cfg, w, x)
    plan_tp = tp_plan(cfg, tp_world, counts)
    plan_cp = cp_plan(T, cp_world, layout)
    attn = np.zeros_like(trace["attn_out"])
    for share in plan_tp.shares:
        cfg_r, w_r, conv_index = standalone(cfg, share, w)
        conv_r = conv0[:, share.conv_channels(cfg)][:, conv_index]
        rec_r = rec0[:, share.v_start:share.v_stop]
        segs, (_, rec_end) = cp_forward(cfg_r, w_r, plan_cp, x, conv_r, rec_r)
        attn += np.concatenate([s["trace"]["attn_out"] for s in segs], axis=1)
        assert np.max(np.abs(rec_end - state.recurrent_state[:, share.v_start:share.v_stop])) <= 1e-12
    assert np.max(np.abs(attn - trace["attn_out"])) <= 1e-12 * max(1.0, np.max(np.abs(trace["attn_out"])))


@pytest.mark.parametrize("tp_world,counts,cp_world,layout,bounds", [
    (2, None, 2, "contiguous", [5]), (3, [2, 3, 1], 2, "zigzag", None), (2, None, 3, "contiguous", [1, 9])])
def test_tpcp_ranks_stitch_and_sum_to_the_unsharded_layer(tp_world, counts, cp_world, layout, bounds):
    """tpcp_forward: every rank's halo is its channels of the unsharded conv state at its segment's first token,
    its entry state and its summary applied to it its heads of the unsharded state at its segment's ends, and
    the TP group's partials summed on each segment, stitched, equal the unsharded attn_out (<= 1e-12)."""
    cfg = tiny_config(Hk=2, Hv=6, dk=4, dv=3, D=8, I=12, K=4)
    w = make_weights(cfg, seed=8)
    T = 14
    x = make_inputs(cfg, 2, T, seed=9)
    conv0, rec0, out, trace, state = _unsharded(cfg, w, x)
    plan = tpcp_plan(tp_plan(cfg, tp_world, counts), cp_plan(T, cp_world, layout, bounds))
    ranks, attn_out = tpcp_forward(cfg, w, plan, x, conv0, rec0)
    scale = np.max(np.abs(trace["attn_out"]))
    assert np.max(np.abs(attn_out - trace["attn_out"])) <= 1e-12 * scale

    def state_after(t):  # the unsharded state after the call's first t tokens (an independent run, recurrent)
        if t == 0:
            return conv0, rec0
        from gdncheck.reference.layer import Params, layer_forward
        _, conv, rec, _ = layer_forward(cfg, Params({n: np.asarray(a, np.float64) for n, a in w.items()}),
                                        x[:, :t], conv0, rec0, delta_rule="recurrent")
        return conv, rec

    seen = set()
    for r, segs in enumerate(ranks):
        share = plan.share(r)
        ch, v = share.conv_channels(cfg), slice(share.v_start, share.v_stop)
        assert sorted(segs) == [i for i, (c, _, _) in enumerate(plan.cp.segments) if c == plan.cp_rank(r)]
        for i, seg in segs.items():
            a, b = seg["tokens"]
            (conv_a, rec_a), (_, rec_b) = state_after(a), state_after(b)
            assert np.max(np.abs(seg["halo"] - conv_a[:, ch])) <= 1e-14
            assert np.max(np.abs(seg["entry_state"] - rec_a[:, v])) <= 1e-12
            assert np.max(np.abs(apply(seg["summary"], rec_a[:, v]) - rec_b[:, v])) <= 1e-12
            # the partial: its heads' core_gated times its columns of out_proj, on its tokens
            cg = trace["core_gated"][:, a:b, v]
            cols = np.asarray(w["linear_attn.out_proj.weight"])[:, share.value_channels(cfg)]
            want = cg.reshape(*cg.shape[:2], -1) @ cols.T
            assert np.max(np.abs(seg["attn_out_partial"] - want)) <= 1e-12 * scale
            assert np.max(np.abs(seg["attn_out"] - trace["attn_out"][:, a:b])) <= 1e-12 * scale
            seen.add((plan.tp_rank(r), i))
        if len(plan.cp.segments) > 1 and segs:  # the partial is the rank's heads alone: not the reduced output
            i = next(iter(segs))
            assert np.max(np.abs(segs[i]["attn_out_partial"] - segs[i]["attn_out"])) > 1e-3 * scale
    assert seen == {(t, i) for t in range(tp_world) for i in range(len(plan.cp.segments))}
