"""The Triton path sharded (gpu_impl/sharded.py): each tensor-parallel rank, run as a plain Triton layer on its
share, against the float64 reference's rank (reference/sharded.py, a different formulation: keys expanded per
value head, no standalone layer); the sum of the partials against the unsharded reference layer."""

from __future__ import annotations

import numpy as np
import pytest

import gdncheck.reference as R
from gdncheck.gpu_impl.sharded import RankLayer
from gdncheck.reference.sharded import tp_forward
from gdncheck.sharding import state_shards, tp_plan
from gdncheck.synthetic import make_inputs, make_weights
from tests.gpu_impl.compare import check, fails, to_np
from tests.gpu_impl.helpers import DEVICE
from tests.helpers import tiny_config

PLANS = {
    "tp2-even": (dict(Hk=2, Hv=4, dk=16, dv=8, D=32, I=16), "shared", 2, None),
    "tp4-past-key-heads": (dict(Hk=2, Hv=4, dk=16, dv=8, D=32, I=16), "per_head", 4, None),
    "tp3-uneven-cut-group": (dict(Hk=2, Hv=6, dk=8, dv=8, D=24, I=16), "shared", 3, [2, 3, 1]),
}


def _run(name, profile, x_calls, mutate=None):
    kw, mode, world, counts = PLANS[name]
    cfg = tiny_config(**kw)
    w = dict(make_weights(cfg, seed=7, norm_mode=mode))
    plan = tp_plan(cfg, world, counts)
    ref = R.Layer(cfg, w)
    ref_state = ref.new_state(2)
    ranks = [RankLayer(cfg, (mutate or (lambda c, s, w: w))(cfg, s, w), s, profile=profile, device=DEVICE,
                       chunk_size=16) for s in plan.shares]
    states = [r.new_state(*state_shards(cfg, r.share, ref_state.conv_state, ref_state.recurrent_state),
                          ref_state.seq_len) for r in ranks]
    results = []
    pos = 0
    for x in x_calls:
        conv0, rec0 = ref_state.conv_state.copy(), ref_state.recurrent_state.copy()
        want, trace = ref.forward(x, ref_state, pos)
        _, ref_ranks, tail = tp_forward(cfg, w, plan, x, conv0, rec0)
        partials = [r.forward(x, s, pos)[0] for r, s in zip(ranks, states)]
        results.append((trace, ref_ranks, partials, [r.shards(s) for r, s in zip(ranks, states)]))
        pos += x.shape[1]
    return cfg, plan, results, ref_state


@pytest.mark.parametrize("profile", ["f32", "bf16"])
@pytest.mark.parametrize("name", PLANS)
def test_ranks_against_reference_ranks_and_reduced_output(name, profile):
    cfg = tiny_config(**PLANS[name][0])
    x = make_inputs(cfg, 2, 23, seed=8)
    calls = [x[:, :20], x[:, 20:21], x[:, 21:23]]  # a chunked prefill, a decode, a short prefill
    cfg, plan, results, ref_state = _run(name, profile, calls)
    for k, (trace, ref_ranks, partials, shards) in enumerate(results):
        for r, (ref_r, got) in enumerate(zip(ref_ranks, partials)):
            check(got, ref_r["partial"], "layer", profile, f"call {k} rank {r} out_proj partial")
        reduced = sum(to_np(p) for p in partials)
        check(reduced, trace["attn_out"], "layer", profile, f"call {k} all-reduced attn_out")
    for r, (conv, rec) in enumerate(results[-1][3]):
        ref_conv, ref_rec = state_shards(cfg, plan.shares[r], ref_state.conv_state, ref_state.recurrent_state)
        check(rec, ref_rec, "layer", profile, f"rank {r} recurrent_state shard")
        check(conv, ref_conv, "layer", profile, f"rank {r} conv_state shard")


def test_packed_projection_split_as_one_block_is_caught():
    """Megatron-LM PR 1989's bug: rank r takes a contiguous block of in_proj_qkv's rows, [Q | K | V_part],
    instead of its rows of each segment."""

    def one_block(cfg, share, w):
        w = dict(w)
        n = len(share.conv_channels(cfg))
        rows = np.arange(share.rank * n, (share.rank + 1) * n)
        full = np.asarray(w["linear_attn.in_proj_qkv.weight"])
        # hand the standalone rank the block where its own channels would be
        patched = full.copy()
        patched[share.conv_channels(cfg)] = full[rows]
        w["linear_attn.in_proj_qkv.weight"] = patched
        return w

    cfg = tiny_config(**PLANS["tp2-even"][0])
    x = make_inputs(cfg, 2, 6, seed=8)
    _, _, results, _ = _run("tp2-even", "f32", [x], mutate=one_block)
    trace, ref_ranks, partials, _ = results[0]
    assert fails(partials[1], ref_ranks[1]["partial"], "layer", "f32") > 10
    assert fails(sum(to_np(p) for p in partials), trace["attn_out"], "layer", "f32") > 10
