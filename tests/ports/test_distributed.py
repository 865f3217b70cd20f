"""Sharded runs on torch.distributed (gloo, spawned ranks): the reference and the Triton path rank by rank,
against the unsharded float64 layer; the field's sharding bugs as rank-program faults, each caught at its
rank and stage; a crashing or hanging rank stops the run with one line and leaves no process."""

from __future__ import annotations

import numpy as np
import pytest

import gdncheck.reference as R
from gdncheck.conformance.judge.sharded import judge_cp, judge_tp
from gdncheck.conformance.ports.distributed import DistributedRunError, launch, run_cp, run_tp
from gdncheck.sharding import cp_plan, tp_plan
from gdncheck.synthetic import make_inputs, make_weights
from tests.helpers import tiny_config

pytestmark = pytest.mark.slow

CFG = tiny_config(Hk=2, Hv=4, dk=8, dv=4, D=16, I=12, K=4)
W = dict(make_weights(CFG, seed=11))
X = make_inputs(CFG, 2, 19, seed=12)
CALLS = [(X[:, :13], 0), (X[:, 13:14], 13), (X[:, 14:19], 14)]


def _goldens_tp(cfg=CFG, w=W, calls=CALLS):
    layer = R.Layer(cfg, w)
    state = layer.new_state(calls[0][0].shape[0])
    goldens = []
    for x, pos in calls:
        _, trace = layer.forward(x, state, pos)
        goldens.append({**trace, "conv_state": state.conv_state.copy(), "recurrent_state": state.recurrent_state.copy()})
    return goldens


GOLDENS = _goldens_tp()


@pytest.mark.parametrize("world,counts", [(2, None), (4, None), (3, [2, 1, 1])])
def test_reference_tp_conforms_rank_by_rank(world, counts):
    plan = tp_plan(CFG, world, counts)
    ranks = run_tp(CFG, W, plan, CALLS)
    failures, judged = judge_tp(CFG, plan, ranks, GOLDENS, bound=1e-12, weights=W)
    assert failures == [] and judged >= world * len(CALLS) * 6


def test_triton_tp_conforms_rank_by_rank():
    plan = tp_plan(CFG, 2)
    ranks = run_tp(CFG, W, plan, CALLS, impl="triton", profile="f32")
    failures, judged = judge_tp(CFG, plan, ranks, GOLDENS, bound=2e-5, weights=W)
    assert failures == [] and judged >= 2 * len(CALLS) * 6


@pytest.mark.parametrize("fault,rank,stage,fact", [
    ("partial_not_reduced", 0, "attn_out", "equals its own out_proj partial: the all-reduce did not run"),
    ("partial_reduced_twice", 0, "attn_out", "equals 2× the reduced output: reduced twice"),
    ("ranks_swapped", 0, "qkv", "equals rank 1's share"),
    ("a_sliced_by_key_heads", 1, "g", ""),
    ("conv_weight_one_block", 0, "qkv_conv", ""),
])
def test_tp_faults_caught_at_rank_and_stage(fault, rank, stage, fact):
    plan = tp_plan(CFG, 2)
    ranks = run_tp(CFG, W, plan, CALLS[:1], fault=fault)
    failures, _ = judge_tp(CFG, plan, ranks, GOLDENS[:1], bound=1e-12, weights=W)
    first = [f for f in failures if f.rank == rank][0]
    assert first.stage == stage and first.ratio >= 10 and fact in first.message
    assert f"rank {rank}" in first.message


def _cp_goldens(x, conv0, rec0):
    """Unsharded: the state at every token (one-token calls) and the output of one whole call."""
    layer = R.Layer(CFG, W)
    st = layer.new_state(x.shape[0])
    st.conv_state[:], st.recurrent_state[:] = conv0, rec0
    st.seq_len[:] = 3
    out, _ = layer.forward(x, st, 3)
    st2 = layer.new_state(x.shape[0])
    st2.conv_state[:], st2.recurrent_state[:], st2.seq_len[:] = conv0, rec0, 3
    states = [(conv0.copy(), rec0.copy())]
    for t in range(x.shape[1]):
        layer.forward(x[:, t:t + 1], st2, 3 + t)
        states.append((st2.conv_state.copy(), st2.recurrent_state.copy()))
    return out, states


RNG = np.random.default_rng(13)
CONV0 = RNG.normal(size=(2, CFG.conv_dim, CFG.conv_kernel))
REC0 = 0.2 * RNG.normal(size=(2, CFG.num_v_heads, CFG.head_k_dim, CFG.head_v_dim))
CP_OUT, CP_STATES = _cp_goldens(X, CONV0, REC0)


@pytest.mark.parametrize("world,layout,bounds", [(2, "contiguous", [2]), (4, "zigzag", None)])
def test_reference_cp_conforms_segment_by_segment(world, layout, bounds):
    plan = cp_plan(X.shape[1], world, layout, bounds)
    ranks = run_cp(CFG, W, plan, X, CONV0, REC0)
    failures, judged = judge_cp(CFG, plan, ranks, {"out": CP_OUT}, CP_STATES, bound=1e-12)
    assert failures == [] and judged == 4 * len(plan.segments)


@pytest.mark.parametrize("fault,stage,fact", [
    ("no_halo", "halo", "equals the zero state"),
    ("entry_from_zeros", "entry_state", "equals the zero state: the predecessors' summaries were not applied"),
    ("summaries_reversed", "entry_state", "composed in reverse token order"),
    ("decay_on_both", "summary", ""),
])
def test_cp_faults_caught_at_rank_and_stage(fault, stage, fact):
    plan = cp_plan(X.shape[1], 2, "zigzag")
    ranks = run_cp(CFG, W, plan, X, CONV0, REC0, fault=fault)
    failures, _ = judge_cp(CFG, plan, ranks, {"out": CP_OUT}, CP_STATES, bound=1e-12)
    assert failures, fault
    first = failures[0]
    assert first.stage == stage and first.ratio >= 10 and fact in first.message
    assert "tokens" in first.message and f"rank {first.rank}" in first.message


def test_a_crashing_rank_stops_the_run_in_one_line(tmp_path):
    plan = tp_plan(CFG, 2)
    bad = dict(W)
    bad["linear_attn.A_log"] = bad["linear_attn.A_log"][:1]  # a weight of the wrong shape: every rank raises
    with pytest.raises(DistributedRunError, match=r"^rank \d failed: .*; the other ranks were stopped$"):
        run_tp(CFG, bad, plan, CALLS[:1], folder=tmp_path, timeout_s=120)


def test_unknown_fault_refused():
    with pytest.raises(DistributedRunError, match="fault among none, partial_not_reduced"):
        run_tp(CFG, W, tp_plan(CFG, 2), CALLS[:1], fault="nope")


def test_unknown_program_refused(tmp_path):
    with pytest.raises(DistributedRunError, match="rank program among tp, cp, found 'pp'"):
        launch("pp", 2, {}, tmp_path)
