"""The mixture-of-experts block on the Triton path (gpu_impl/moe.py) against the float64 reference
(reference/moe.py), per precision profile. That every launch it makes compiles for sm_90:
tests/gpu_tools/test_compile_check.py.

The reference gets the very values the Triton path gets (rounded to the profile dtype). Routing is
discontinuous: the cases keep every token's k-th and (k+1)-th router logits at least
:data:`MARGIN` apart — far above what the profile's rounding of a logit can move them (bf16 rounds
logits of magnitude ≲ 4 by ≤ 2^-7) — so both sides must choose the same experts, compared exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gdncheck.reference as R
from gdncheck.gpu_impl import moe as G
from gdncheck.gpu_impl.moe_gemm import group_by_expert, max_blocks
from tests.gpu_impl.compare import check, to_np
from tests.gpu_impl.helpers import PROFILE_NAMES, rng_for, tensor

#: the smallest logit gap at the top-k boundary the cases keep (see the module docstring)
MARGIN = 0.1

CASES = [  # (E, top_k, D, I_moe, I_shared, B, T)
    (8, 2, 32, 24, 20, 2, 9),
    (16, 4, 48, 16, 40, 1, 1),  # one token (decode): most experts get no token
    (5, 5, 24, 20, 16, 1, 6),  # every expert active
]


def _weights(rng, E, D, Im, Is, profile):
    def w(*shape, s=0.25):
        return tensor(rng.normal(size=shape) * s, profile)

    return {
        "w_router": w(E, D, s=0.5), "w_gate": w(E, Im, D), "w_up": w(E, Im, D), "w_down": w(E, D, Im),
        "w_shared_gate": w(Is, D), "w_shared_up": w(Is, D), "w_shared_down": w(D, Is),
        "w_shared_expert_gate": w(1, D, s=0.5),
    }


def _tokens(rng, w, B, T, D, k, profile):
    """B·T tokens whose routing is at least MARGIN from a tie (drawn until enough are found)."""
    router = to_np(w["w_router"])
    picked = []
    while len(picked) < B * T:
        x = to_np(tensor(rng.normal(size=(64, D)), profile))
        _, gap = R.routing_margin(x @ router.T, k)
        picked.extend(x[gap > MARGIN])
    return tensor(np.array(picked[: B * T]).reshape(B, T, D), profile)


def _args(w):
    return [w[n] for n in ("w_router", "w_gate", "w_up", "w_down", "w_shared_gate", "w_shared_up", "w_shared_down",
                           "w_shared_expert_gate")]


@pytest.mark.parametrize("profile", PROFILE_NAMES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "E{}_k{}_D{}_Im{}_Is{}_B{}_T{}".format(*c))
@pytest.mark.parametrize("norm", [True, False], ids=["renormalised", "plain"])
def test_block_matches_reference(profile, case, norm):
    E, k, D, Im, Is, B, T = case
    rng = rng_for("moe", profile, case)
    w = _weights(rng, E, D, Im, Is, profile)
    h = _tokens(rng, w, B, T, D, k, profile)
    got = G.mlp_moe(h, *_args(w), k, norm)
    want = R.mlp_moe(to_np(h), *(to_np(a) for a in _args(w)), k, norm)
    names = ("router_logits", "routing_weights", "selected_experts", "experts_out", "shared_out", "mlp_out")
    for name, g, r in zip(names, got, want):
        assert tuple(g.shape) == r.shape, name
        if name == "selected_experts":
            assert g.dtype == torch.int64
            np.testing.assert_array_equal(g.cpu().numpy(), r, err_msg=f"{profile}: selected experts differ")
        else:
            check(g, r, "stage", profile, name)
    # the stage functions, each on the reference's own inputs
    x = to_np(h)
    check(G.router(h, w["w_router"]), R.router(x, to_np(w["w_router"])), "stage", profile, "router_logits (stage)")
    rw, sel = G.routing(tensor(want[0], profile), k, norm)
    np.testing.assert_array_equal(sel.cpu().numpy(), want[2])
    check(rw, want[1], "stage", profile, "routing_weights (stage)")
    ew = [w[n] for n in ("w_gate", "w_up", "w_down")]
    check(G.experts(h, torch.tensor(want[1], dtype=torch.float32, device=h.device),
                    torch.tensor(want[2], device=h.device), *ew),
          R.experts(x, want[1], want[2], *(to_np(a) for a in ew)), "stage", profile, "experts_out (stage)")
    sw = [w[n] for n in ("w_shared_gate", "w_shared_up", "w_shared_down", "w_shared_expert_gate")]
    check(G.shared_expert(h, *sw), R.shared_expert(x, *(to_np(a) for a in sw)), "stage", profile,
          "shared_out (stage)")


@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_exact_ties_go_to_the_lower_index(profile):
    """Equal logits give equal fp32 probabilities in any profile: the rule decides alone."""
    logits = tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [0.0] * 5, [2.0, 5.0, 5.0, 5.0, -1.0]], profile)
    weights, selected = G.routing(logits, 3)
    np.testing.assert_array_equal(selected.cpu().numpy(), [[1, 2, 4], [0, 1, 2], [1, 2, 3]])
    np.testing.assert_array_equal(selected.cpu().numpy(), R.routing(to_np(logits), 3)[1])
    check(weights, R.routing(to_np(logits), 3)[0], "stage", profile, "routing_weights (ties)")


def test_grouping_covers_every_slot_once():
    selected = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2], [1, 0]])
    g = group_by_expert(selected, num_experts=6, BM=2)
    flat = selected.reshape(-1)
    # expert 0: 3 slots -> 2 blocks, 1: 2 -> 1, 2: 1 -> 1, 3: 4 -> 2; experts 4 and 5: none. The table
    # has the fixed length of the worst routing, (10 slots + 6 experts x (2 - 1)) // 2 = 8: two blocks of no rows
    assert g.n_blocks == max_blocks(10, 6, 2) == 8
    assert g.block_expert.tolist()[:6] == [0, 0, 1, 2, 3, 3]
    assert g.block_rows.tolist() == [2, 1, 2, 1, 2, 2, 0, 0]
    rows = [r for b in range(g.n_blocks) for r in range(g.block_row0[b], g.block_row0[b] + g.block_rows[b])]
    assert sorted(rows) == list(range(10))
    for b in range(g.n_blocks):
        for r in range(g.block_row0[b], g.block_row0[b] + g.block_rows[b]):
            assert flat[g.order[r]] == g.block_expert[b]
    assert g.order.tolist()[:3] == [1, 4, 9]  # expert 0's slots in token order (stable)


@pytest.mark.parametrize("n_slots, E, BM", [(10, 512, 16), (40960, 512, 16), (7, 3, 4), (64, 8, 64)])
def test_the_table_length_bounds_every_routing(n_slots, E, BM):
    """max_blocks against random routings (skewed and even) and the decode-like one (one slot per
    expert): none needs more blocks, and the table's real blocks hold every slot once."""
    rng = np.random.default_rng(n_slots)
    routings = [rng.multinomial(n_slots, rng.dirichlet(np.full(E, a))) for a in (0.05, 1.0, 50.0) for _ in range(50)]
    if n_slots <= E:
        routings.append(np.array([1] * n_slots + [0] * (E - n_slots)))
    for counts in routings:
        need = int(np.sum(-(-counts // BM)))
        assert need <= max_blocks(n_slots, E, BM)
    g = group_by_expert(torch.tensor(np.repeat(np.arange(E), counts)), E, BM)
    assert int(g.block_rows.sum()) == n_slots and int((g.block_rows > 0).sum()) == need


