"""judge_tpcp (conformance/judge/sharded.py) on ranks the float64 reference computed (reference/sharded.py's
tpcp_forward): exact ranks pass; a rank holding another TP rank's heads, every head, the whole call's tokens,
an unreduced output or a foreign segment fails at that rank, naming its segment, tokens, heads and stage."""

from __future__ import annotations

import numpy as np
import pytest

from gdncheck.conformance.judge.sharded import TPCP_STAGES, judge_tpcp
from gdncheck.reference.layer import Params, layer_forward
from gdncheck.reference.sharded import tpcp_forward
from gdncheck.sharding import cp_plan, tp_plan, tpcp_plan
from gdncheck.synthetic import make_inputs, make_weights
from tests.helpers import tiny_config

T = 11


@pytest.fixture(scope="module")
def run():
    cfg = tiny_config(Hk=2, Hv=4, dk=4, dv=3, D=8, I=12, K=4)
    w = {n: np.asarray(a, dtype=np.float64) for n, a in make_weights(cfg, seed=2).items()}
    x = make_inputs(cfg, 1, T, seed=3)
    rng = np.random.default_rng(4)
    conv0 = rng.normal(size=(1, cfg.conv_dim, cfg.conv_kernel))
    rec0 = 0.3 * rng.normal(size=(1, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim))
    plan = tpcp_plan(tp_plan(cfg, 2), cp_plan(T, 2, boundaries=[4]))
    ranks, _ = tpcp_forward(cfg, w, plan, x, conv0, rec0)
    files = [{f"segments.{i}.{n}": np.asarray(v) for i, seg in segs.items() for n, v in (
        ("halo", seg["halo"]), ("M", seg["summary"][0]), ("U", seg["summary"][1]), ("entry_state", seg["entry_state"]),
        ("attn_out_partial", seg["attn_out_partial"]), ("attn_out", seg["attn_out"]))} for segs in ranks]
    # the goldens, unsharded and independent of the ranks: the whole layer, and its state at each boundary
    params = Params(w)
    _, _, _, trace = layer_forward(cfg, params, x, conv0, rec0, delta_rule="recurrent")
    states = [None] * (T + 1)
    states[0] = (conv0, rec0)
    for t in (4, T):
        _, conv, rec, _ = layer_forward(cfg, params, x[:, :t], conv0, rec0, delta_rule="recurrent")
        states[t] = (conv, rec)
    return cfg, plan, files, {n: trace[n] for n in ("core_gated", "attn_out")}, states, w


def _judge(run, edit=None):
    cfg, plan, files, trace, states, w = run
    files = [dict(f) for f in files]
    if edit:
        edit(files)
    return judge_tpcp(cfg, plan, files, trace, states, bound=1e-6, weights=w, nmse_bound=1e-10)


def test_the_reference_ranks_pass_every_share(run):
    failures, judged = _judge(run)
    assert failures == [] and judged == 4 * len(TPCP_STAGES)  # 4 ranks, one segment each


@pytest.mark.parametrize("edit,start,said", [
    (lambda f: f.__setitem__(1, dict(f[0])),
     "rank 1, segment 0 (tokens 0–3), halo (conv channels of key heads 1, value heads 2–3, tp rank 1 of cp rank 0)",
     "equals TP rank 0's share (value heads 0–1)"),
    (lambda f: f[3].update({"segments.1.entry_state": np.concatenate([f[2]["segments.1.entry_state"],
                                                                       f[3]["segments.1.entry_state"]], axis=1)}),
     "rank 3, segment 1 (tokens 4–10), entry_state (value heads 2–3", "shape [1, 4, 4, 3], but its share's is"),
    (lambda f: f[2].update({"segments.1.attn_out_partial": np.zeros((1, T, 8))}),
     "rank 2, segment 1 (tokens 4–10), attn_out_partial (the out_proj partial of value heads 0–1",
     "shape [1, 11, 8], but its share's is [1, 7, 8]"),
    (lambda f: f[0].update({"segments.0.attn_out": f[0]["segments.0.attn_out_partial"]}),
     "rank 0, segment 0 (tokens 0–3), attn_out (the output reduced over its TP group",
     "equals its own out_proj partial: the all-reduce did not run"),
    (lambda f: f[3].update({"segments.1.entry_state": np.zeros_like(f[3]["segments.1.entry_state"])}),
     "rank 3, segment 1 (tokens 4–10), entry_state", "the predecessors' summaries were not applied"),
    (lambda f: f[1].update({"segments.1.halo": f[3]["segments.1.halo"]}), "rank 1 wrote segments [1] its CP rank 0",
     ""),
])
def test_a_rank_with_the_wrong_heads_or_tokens_fails_at_that_rank(run, edit, start, said):
    failures, _ = _judge(run, edit)
    assert failures and failures[0].message.startswith(start) and said in failures[0].message, failures[0].message
    assert failures[0].rank == int(start.split()[1].rstrip(","))
