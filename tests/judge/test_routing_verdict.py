"""The routing verdict (conformance/judge/routing.py): a sparse call's selected experts judged as sets,
before the numbers, naming the token, both expert sets and the reference's probability margin.

Unit tests on hand-made routings (margins computed here with math.exp). Ports that route wrongly or by
another tie rule, run through the harness and judged by ``verify``: tests/reports/test_routing_ports.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gdncheck.conformance.judge.records import Record
from gdncheck.conformance.judge.routing import judge_routing, probability_margins


def _rec(seq_pos=(0,)):
    return Record(case="c", step=1, op="forward", call=0, tensor="selected_experts", stage="routing", stage_index=11,
                  verdict="pass", seq_pos=list(seq_pos))


def _softmax_margin(row, k):
    z = [math.exp(v) for v in row]
    p = sorted((v / sum(z) for v in z), reverse=True)
    return p[k - 1] - p[k]


LOGITS = np.array([[[2.0, 1.0, 0.5, 0.0], [0.0, 3.0, 1.0, 1.0]]])  # [B 1, T 2, E 4]; token 1 ties 2 and 3 at k = 2
GOLD = np.array([[[0, 1], [1, 2]]], dtype=np.float64)  # token 1: the tie to the lower index (2)


def test_same_sets_in_any_slot_order_pass():
    chk = judge_routing(_rec(), np.array([[[1, 0], [2, 1]]]), "I64", GOLD, LOGITS, subject="s", where="[here]")
    assert chk.record.verdict == "pass" and chk.alike.all()
    w_port, w_gold = np.array([[[0.3, 0.7], [0.4, 0.6]]]), np.array([[[0.7, 0.3], [0.6, 0.4]]])
    a, e = chk.weights(w_port, w_gold)  # by expert: the port's slots reordered like the golden's
    np.testing.assert_array_equal(a, e)


def test_a_flip_beyond_the_margin_names_token_experts_and_margin():
    port = np.array([[[0, 2], [1, 2]]])  # token 0: expert 2 instead of 1
    chk = judge_routing(_rec(seq_pos=(5,)), port, "I64", GOLD, LOGITS, subject="sel", where="[here]")
    rec = chk.record
    assert (rec.verdict, rec.reason) == ("fail", "routing")
    assert chk.alike.tolist() == [[False, True]]
    tok = rec.routing["first"][0]
    assert (tok["row"], tok["token"], tok["position"]) == (0, 0, 5)
    assert (tok["expected"], tok["actual"], tok["only_expected"], tok["only_actual"]) == ([0, 1], [0, 2], [1], [2])
    assert tok["prob_margin"] == pytest.approx(_softmax_margin([2.0, 1.0, 0.5, 0.0], 2), rel=1e-12)
    assert tok["logit_margin"] == pytest.approx(0.5) and tok["exact_tie"] is False
    assert rec.routing["tokens_routed_otherwise"] == 1 and rec.routing["tokens"] == 2
    assert "token 0 (position 5, row 0)" in rec.message and "[0, 2]" in rec.message and "routes wrongly" in rec.message
    assert f"{tok['prob_margin']:.3g}" in rec.message
    # the weights of a token routed otherwise count neither way
    a, e = chk.weights(np.array([[[9.0, 9.0], [0.6, 0.4]]]), np.array([[[0.7, 0.3], [0.6, 0.4]]]))
    np.testing.assert_array_equal(a[0, 0], e[0, 0])


def test_an_exact_tie_resolved_upward_is_a_convention_not_a_failure():
    port = np.array([[[0, 1], [1, 3]]])  # token 1: the higher of the tied experts 2 and 3
    chk = judge_routing(_rec(seq_pos=(7,)), port, "I64", GOLD, LOGITS, subject="sel", where="")
    rec = chk.record
    assert rec.verdict == "pass" and rec.routing is None and chk.alike.all()
    assert chk.tied.tolist() == [[False, True]]
    conv = rec.convention
    assert (conv["kind"], conv["tokens"], conv["choice"]) == ("routing_tie", 1, "higher index")
    assert conv["first"] == [{"row": 0, "token": 1, "position": 8, "actual": [1, 3], "expected": [1, 2]}]
    # the port's weights are judged against its own experts' probabilities (hand-computed softmax)
    z = [math.exp(v) for v in (0.0, 3.0, 1.0, 1.0)]
    want = [z[1] / (z[1] + z[3]), z[3] / (z[1] + z[3])]
    a, e = chk.weights(np.array([[[0.7, 0.3], [want[0], want[1]]]]), np.array([[[0.7, 0.3], [0.6, 0.4]]]))
    np.testing.assert_allclose(e[0, 1], want, rtol=1e-12)
    np.testing.assert_allclose(a[0, 1], want, rtol=1e-12)


def test_a_tie_broken_with_an_expert_below_it_fails_and_says_so():
    logits = np.array([[[3.0, 1.0, 1.0, 0.0]]])  # experts 1 and 2 tie for the second slot
    port = np.array([[[0, 3]]])  # neither tied expert: not a choice the exact ordering allows
    rec = judge_routing(_rec(), port, "I64", np.array([[[0, 1]]]), logits, subject="sel", where="").record
    assert (rec.verdict, rec.reason) == ("fail", "routing") and rec.convention is None
    tok = rec.routing["first"][0]
    assert tok["exact_tie"] is True and "not one the exact ordering allows" in rec.message


def test_tie_choice_names_the_rule():
    from gdncheck.conformance.judge.routing import tie_choice
    assert tie_choice([5], [3]) == "higher index"
    assert tie_choice([3, 7], [5, 6]) == "other"


@pytest.mark.parametrize("port, words", [
    (np.array([[[0, 0], [1, 2]]]), "twice"),
    (np.array([[[0, 4], [1, 2]]]), "not expert indices"),
    (np.array([[[0, 1.5], [1, 2]]]), "not expert indices"),
])
def test_invalid_selections_fail(port, words):
    rec = judge_routing(_rec(), port, "F32", GOLD, LOGITS, subject="sel", where="").record
    assert rec.verdict == "fail" and words in rec.message


def test_missing_selection_is_missing_not_failed():
    chk = judge_routing(_rec(), None, None, GOLD, LOGITS, subject="sel", where="")
    assert chk.record.verdict == "missing" and chk.alike is None


def test_probability_margins_match_a_direct_softmax():
    pm, lm = probability_margins(LOGITS, 2)
    assert pm[0, 0] == pytest.approx(_softmax_margin([2.0, 1.0, 0.5, 0.0], 2), rel=1e-12)
    assert pm[0, 1] == 0.0 and lm[0, 1] == 0.0
