"""verify's console leads with the failure most cases share (issue 42 item 3): a failure only one case
shows, unrelated to the rest (a commit of spec-prefix-cache beside a gated-norm bug everywhere), comes
after the group, said so, even when its stage is earlier in the layer."""

from __future__ import annotations

from gdncheck.commands.grouping import failure_groups
from gdncheck.commands.verify import pick_details


def _case(i, stage, tensor, op="forward", step=1):
    return {"id": i, "status": "fail", "records": [], "diagnosis": None,
            "first_divergence": {"step": step, "call": 0, "op": op, "stage": stage, "tensor": tensor, "token": 0,
                                 "position": 0, "row": 0, "reason": "elem_bound"}}


def doc():
    cases = [_case("spec-prefix-cache", "conv1d", "conv_state", op="commit", step=3)]
    cases += [_case(f"case-{i}", "gated_norm", "core_gated") for i in range(4)]
    return {"cases": cases}


def test_the_shared_failure_leads_and_the_lone_one_is_said_apart():
    g = failure_groups(doc())
    assert g.lead().label == "gated_norm/core_gated" and g.lead().count == 4
    # the lone commit failure is earlier in the layer (conv1d), but one case: the shared group leads
    assert g.lead_case("spec-prefix-cache") == "case-0"
    shown = pick_details([c["id"] for c in doc()["cases"]], g, 3, earliest=g.lead_case("spec-prefix-cache"))
    assert shown[0] == "case-0" and shown.index("spec-prefix-cache") > 0
    assert "apparently unrelated to the 4 case(s) that first diverge at gated_norm/core_gated" in \
        g.aside("spec-prefix-cache")
    assert g.aside("case-1") is None
    lines = g.lines()
    assert "  (1 case(s) fail alone, apparently unrelated to the 4 that first diverge at gated_norm/core_gated: " \
           "spec-prefix-cache, printed after them)" in lines, lines
    assert "  1 first diverge at state handling at commit/conv_state" in lines  # its count line unchanged


def test_a_lone_case_named_the_same_class_is_related():
    d = {"verdict": "matches", "bug_class": "w instead of 1 + w", "text": "matches: w instead of 1 + w"}
    same = doc()
    for c in same["cases"]:
        c["diagnosis"] = d
    g = failure_groups(same)
    assert g.lead() is not None and g.aside("spec-prefix-cache") is None
    assert not any("fail alone" in x for x in g.lines())


def test_without_a_shared_failure_the_earliest_stage_leads():
    two = {"cases": [_case("a", "gated_norm", "core_gated"), _case("b", "conv1d", "qkv_conv")]}
    g = failure_groups(two)
    assert g.lead() is None and g.lead_case("b") == "b" and g.aside("a") is None
