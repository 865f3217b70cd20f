"""Partition plans (gdncheck/sharding.py): who owns which heads, channels and tokens, counted by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gdncheck.config import GDNConfig
from gdncheck.errors import ShardPlanError
from gdncheck.sharding import SubGroup, cp_plan, plan_from_json, tp_plan, tpcp_plan


def cfg(Hk=2, Hv=4, dk=4, dv=3):
    return GDNConfig(hidden_size=8, intermediate_size=12, num_k_heads=Hk, num_v_heads=Hv, head_k_dim=dk,
                     head_v_dim=dv, conv_kernel=4)


def test_even_split_owns_contiguous_key_and_value_heads_per_segment():
    c = cfg(Hk=2, Hv=4, dk=4, dv=3)  # key_dim 8, conv_dim 28
    plan = tp_plan(c, 2)
    assert plan.kind == "even"
    r0, r1 = plan.shares
    assert (list(r0.k_heads), list(r0.v_heads)) == ([0], [0, 1])
    assert (list(r1.k_heads), list(r1.v_heads)) == ([1], [2, 3])
    # q: channels 0..3 / 4..7; k: 8..11 / 12..15; v: 16..21 / 22..27 — per segment, never one block
    assert r0.conv_channels(c).tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21]
    assert r1.conv_channels(c).tolist() == [4, 5, 6, 7, 12, 13, 14, 15, 22, 23, 24, 25, 26, 27]
    assert r1.value_channels(c).tolist() == [6, 7, 8, 9, 10, 11]
    # every channel owned exactly once
    assert sorted(np.concatenate([s.conv_channels(c) for s in plan.shares]).tolist()) == list(range(c.conv_dim))


def test_past_the_key_heads_replicates_them():
    c = cfg(Hk=2, Hv=4)
    plan = tp_plan(c, 4)
    assert plan.kind == "replicated_keys"
    assert [list(s.k_heads) for s in plan.shares] == [[0], [0], [1], [1]]
    assert [s.key_of_value(c).tolist() for s in plan.shares] == [[0], [0], [0], [0]]


def test_uneven_split_cutting_a_group():
    c = cfg(Hk=2, Hv=6)  # ratio 3: heads 0-2 read key 0, 3-5 key 1
    plan = tp_plan(c, 3, [3, 2, 1])  # key 1 on ranks 1 and 2
    assert plan.kind == "replicated_keys"
    assert [(s.v_start, s.v_stop, s.k_start, s.k_stop) for s in plan.shares] == [(0, 3, 0, 1), (3, 5, 1, 2),
                                                                                (5, 6, 1, 2)]
    plan = tp_plan(cfg(Hk=3, Hv=6), 2, [4, 2])  # ratio 2: keys 0, 1 | 2
    assert plan.kind == "uneven"
    assert [(list(s.k_heads), list(s.v_heads)) for s in plan.shares] == [([0, 1], [0, 1, 2, 3]), ([2], [4, 5])]
    plan = tp_plan(c, 3, [2, 2, 2])  # even counts but head 2 and 3 straddle: key 0 on ranks 0, 1
    assert plan.kind == "replicated_keys"
    assert plan.shares[1].key_of_value(c).tolist() == [0, 1]  # v2 -> k0, v3 -> k1 among its keys 0..1


@pytest.mark.parametrize("args,match", [
    ((3,), "dividing the 4 value heads"),
    ((0,), r"world size a whole number in \[1, 4\], found 0"),
    ((5,), r"in \[1, 4\], found 5"),
    ((2, [3, 2]), "summing to 4, found"),
    ((2, [4, 0]), "rank 1's value heads"),
    ((2, [1, 2, 1]), "expected 2 value-head counts"),
    ((True,), "world size"),
])
def test_bad_tp_plans_one_line(args, match):
    with pytest.raises(ShardPlanError, match=match) as info:
        tp_plan(cfg(), *args)
    assert "\n" not in str(info.value) and info.value.code == "shard_plan"


def test_cp_contiguous_and_zigzag_segments():
    p = cp_plan(10, 3)
    assert p.segments == ((0, 0, 4), (1, 4, 8), (2, 8, 10))
    p = cp_plan(10, 2, boundaries=[7])
    assert p.ranges(0) == [(0, 7)] and p.ranges(1) == [(7, 10)]
    z = cp_plan(11, 2, "zigzag")  # pieces 3,3,3,2 ; owners 0,1,1,0
    assert z.segments == ((0, 0, 3), (1, 3, 6), (1, 6, 9), (0, 9, 11))
    assert z.ranges(0) == [(0, 3), (9, 11)]


@pytest.mark.parametrize("args,match", [
    ((3, 4), r"token count a whole number in \[4,"),
    ((6, 2, "zigzag"), r"in \[4,"),  # fine: 6 >= 4
    ((10, 2, "ring"), "layout among contiguous, zigzag"),
    ((10, 3, "contiguous", [5, 5]), "strictly increasing"),
    ((10, 2, "contiguous", [10]), r"boundary a whole number in \[1, 9\]"),
    ((10, 2, "zigzag", [4]), "no boundaries"),
])
def test_bad_cp_plans(args, match):
    if args == (6, 2, "zigzag"):
        assert len(cp_plan(*args).segments) == 4
        return
    with pytest.raises(ShardPlanError, match=match):
        cp_plan(*args)


def test_json_round_trip_and_edited_plans_refused():
    c = cfg(Hk=2, Hv=6)
    for plan in (tp_plan(c, 3, [3, 2, 1]), tp_plan(c, 2), cp_plan(13, 2, "zigzag"), cp_plan(13, 3, boundaries=[2, 9])):
        text = json.dumps(plan.to_json())
        assert plan_from_json(text, c) == plan
    edited = tp_plan(c, 2).to_json()
    edited["ranks"][0]["k_heads"] = [0, 2]  # a rank claiming a key head it does not read
    with pytest.raises(ShardPlanError, match="differs"):
        plan_from_json(edited, c)
    for bad, match in [("{", "does not parse"), ({"kind": "pp"}, "kind 'tp', 'cp' or 'tpcp'"),
                       ({"kind": "cp", "format": 9}, "plan format 1"),
                       ({"kind": "cp", "format": 1, "world": 2}, "lacking")]:
        with pytest.raises(ShardPlanError, match=match):
            plan_from_json(bad, c)


def test_tpcp_plan_numbers_ranks_tp_fastest_and_refuses_hand_edits():
    """TP x CP: rank r is TP rank r % tp of CP rank r // tp (Megatron's order), counted by hand; its CP group the
    ranks of its TP rank, its TP group the ranks of its CP rank; a plan edited by hand is refused in one line."""
    c = cfg(Hk=2, Hv=4)
    plan = tpcp_plan(tp_plan(c, 2), cp_plan(14, 2, boundaries=[5]))
    doc = plan.to_json()
    assert doc["kind"] == "tpcp" and doc["world"] == 4 and doc["order"] == "tp_fastest"
    assert [(r["tp_rank"], r["cp_rank"]) for r in doc["ranks"]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [list(plan.share(r).v_heads) for r in range(4)] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    assert [plan.cp.ranges(plan.cp_rank(r)) for r in range(4)] == [[(0, 5)], [(0, 5)], [(5, 14)], [(5, 14)]]
    assert plan.cp_group(3) == [1, 3] and plan.tp_group(3) == [2, 3] and plan.tp_group(0) == [0, 1]
    assert plan_from_json(json.dumps(doc), c) == plan
    edits = [
        (lambda d: d["ranks"][1].update(tp_rank=0, cp_rank=1), "differs"),  # CP fastest: another numbering
        (lambda d: d.update(order="cp_fastest"), "TP rank fastest"),
        (lambda d: d.update(world=2), "differs"),
        (lambda d: d["cp"]["segments"][1].update(rank=0), "differs"),
        (lambda d: d["tp"]["ranks"][1].update(v_heads=[2, 5]), "summing to 4"),
        (lambda d: d.update(cp=d["tp"]), "its cp a context-parallel"),
        (lambda d: d.pop("order"), "lacking"),
    ]
    for edit, match in edits:
        bad = json.loads(json.dumps(doc))
        edit(bad)
        with pytest.raises(ShardPlanError, match=match) as exc:
            plan_from_json(bad, c)
        assert "\n" not in str(exc.value)
    with pytest.raises(ShardPlanError, match="world size"):
        tpcp_plan(tp_plan(cfg(Hk=2, Hv=64), 64), cp_plan(1 << 10, 32))  # 2048 ranks


def test_a_subgroup_keeps_its_members_parts_in_member_order():
    class World:
        def all_gather_object(self, parts, obj):
            parts[:] = [f"r{r}:{obj}" for r in range(len(parts))]

    parts: list = []
    SubGroup(World(), 4, [3, 1]).all_gather_object(parts, "x")
    assert parts == ["r3:x", "r1:x"]
