"""The routing verdict (conformance/judge/routing.py): a sparse call's selected experts judged as sets,
before the numbers, naming the token, both expert sets and the reference's probability margin.

Unit tests on hand-made routings (margins computed here with math.exp), then two ports run through the
harness on the committed sparse fixtures and judged by ``verify``: one that flips the routing of the
token nearest a tie (the fixtures keep it far from one: a bug), one that resolves an exact tie to the
higher index (CPU torch.topk may: it must still fail the exact-tie case, with the tie named).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gdncheck.conformance.earn.emulate import EmulatedLayer, emulated_adapter
from gdncheck.conformance.judge.records import Record, validate_summary
from gdncheck.conformance.judge.routing import judge_routing, probability_margins
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.manifest import load_manifest
from gdncheck.reports.junit import JUnit, add_verify_summary

FIXTURES = "fixtures/default"


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
    chk = judge_routing(_rec(), np.array([[[1, 0], [2, 1]]]), "I64", GOLD, LOGITS, subject="s", loc="[here]")
    assert chk.record.verdict == "pass" and chk.alike.all()
    w_port, w_gold = np.array([[[0.3, 0.7], [0.4, 0.6]]]), np.array([[[0.7, 0.3], [0.6, 0.4]]])
    a, e = chk.weights(w_port, w_gold)  # by expert: the port's slots reordered like the golden's
    np.testing.assert_array_equal(a, e)


def test_a_flip_beyond_the_margin_names_token_experts_and_margin():
    port = np.array([[[0, 2], [1, 2]]])  # token 0: expert 2 instead of 1
    chk = judge_routing(_rec(seq_pos=(5,)), port, "I64", GOLD, LOGITS, subject="sel", loc="[here]")
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


def test_an_exact_tie_flipped_is_named_a_tie():
    port = np.array([[[0, 1], [1, 3]]])  # token 1: the higher of the tied experts 2 and 3
    rec = judge_routing(_rec(), port, "I64", GOLD, LOGITS, subject="sel", loc="").record
    tok = rec.routing["first"][0]
    assert tok["token"] == 1 and tok["exact_tie"] is True and tok["prob_margin"] == 0.0
    assert "exact tie" in rec.message and "lower expert index" in rec.message


@pytest.mark.parametrize("port, words", [
    (np.array([[[0, 0], [1, 2]]]), "twice"),
    (np.array([[[0, 4], [1, 2]]]), "not expert indices"),
    (np.array([[[0, 1.5], [1, 2]]]), "not expert indices"),
])
def test_invalid_selections_fail(port, words):
    rec = judge_routing(_rec(), port, "F32", GOLD, LOGITS, subject="sel", loc="").record
    assert rec.verdict == "fail" and words in rec.message


def test_missing_selection_is_missing_not_failed():
    chk = judge_routing(_rec(), None, None, GOLD, LOGITS, subject="sel", loc="")
    assert chk.record.verdict == "missing" and chk.alike is None


def test_probability_margins_match_a_direct_softmax():
    pm, lm = probability_margins(LOGITS, 2)
    assert pm[0, 0] == pytest.approx(_softmax_margin([2.0, 1.0, 0.5, 0.0], 2), rel=1e-12)
    assert pm[0, 1] == 0.0 and lm[0, 1] == 0.0


# --- two ports through run and verify ------------------------------------------------------------------
class FlipNearest(EmulatedLayer):
    """Routes every token right, except the one of each call nearest a tie (not an exact one): there it
    takes the (k+1)-th expert instead of the k-th."""

    def routing(self, router_logits):
        weights, selected = super().routing(router_logits)
        l = np.asarray(router_logits, dtype=np.float64)
        k = self.cfg.num_experts_per_tok
        order = np.argsort(-l, axis=-1, kind="stable")
        gap = np.take_along_axis(l, order[..., k - 1:k], -1) - np.take_along_axis(l, order[..., k:k + 1], -1)
        gap = np.where(gap[..., 0] > 0, gap[..., 0], np.inf)
        b, t = np.unravel_index(int(np.argmin(gap)), gap.shape)
        selected = selected.copy()
        slot = int(np.flatnonzero(selected[b, t] == order[b, t, k - 1])[0])
        selected[b, t, slot] = order[b, t, k]
        return weights, selected


class TieToHigher(EmulatedLayer):
    """Resolves exact ties at the k boundary to the higher expert index (as CPU torch.topk may)."""

    def routing(self, router_logits):
        weights, _ = super().routing(router_logits)
        l = np.asarray(router_logits, dtype=np.float32)
        E, k = l.shape[-1], self.cfg.num_experts_per_tok
        rev = np.argsort(-l[..., ::-1], axis=-1, kind="stable")[..., :k]  # stable on the reversed index
        return weights, (E - 1 - rev).astype(np.int64)


def _factory(cls):
    def factory(cfg, weights, *, profile="f32", strict=False, **kw):
        return emulated_adapter(cls(cfg, weights, profile=profile, placement="hf", strict=strict), cls.__name__)
    return factory


def _case(prefix):
    return next(c for c in load_manifest(FIXTURES)["cases"] if c["id"].startswith(prefix))


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    out = {}
    for cls in (FlipNearest, TieToHigher):
        d = tmp_path_factory.mktemp(cls.__name__)
        ids = [_case("moe-e256-k8")["id"], _case("moe-exact-tie")["id"]]
        run_impl(_factory(cls), FIXTURES, d, "f32", cases=ids)
        out[cls.__name__] = verify(FIXTURES, d, "f32", cases=ids)
    return out


def test_a_port_flipping_the_nearest_token_fails_routing_first(judged):
    summary = judged["FlipNearest"]
    for c in summary.cases:
        assert c.status == "fail"
        fd = c.first_divergence
        assert (fd.stage, fd.tensor, fd.reason) == ("routing", "selected_experts", "routing")
        rec = next(r for r in c.records if r.reason == "routing")
        tok = rec.routing["first"][0]
        assert tok["exact_tie"] is False and tok["prob_margin"] > 0
        assert "routes wrongly" in c.message and f"token {tok['token']}" in c.message
        # routing_weights of the tokens routed alike still pass; the flip shows downstream, after the routing
        assert all(r.verdict == "pass" for r in c.records if r.tensor in ("router_logits", "routing_weights"))
        assert any(r.verdict == "fail" for r in c.records if r.tensor == "experts_out")
    validate_summary(summary.to_json())


def test_a_port_resolving_ties_upward_fails_the_exact_tie_case_only(judged):
    by_id = {c.id: c for c in judged["TieToHigher"].cases}
    assert by_id[_case("moe-e256-k8")["id"]].status == "pass"  # no tie there
    tie = by_id[_case("moe-exact-tie")["id"]]
    assert tie.status == "fail" and tie.first_divergence.reason == "routing"
    rec = next(r for r in tie.records if r.reason == "routing")
    assert all(t["exact_tie"] for t in rec.routing["first"])
    assert "exact tie" in tie.message
    junit = JUnit()
    add_verify_summary(junit, judged["TieToHigher"])
    assert b'type="routing"' in junit.tostring()
