"""The routing verdict through run and verify (conformance/judge/routing.py; its unit tests on hand-made
routings: tests/judge/test_routing_verdict.py): ports run through the harness on the committed sparse
fixtures and judged by ``verify``: one that flips the routing of the token nearest a tie (the fixtures
keep it far from one: a bug), one that resolves an exact tie to the higher index (CPU torch.topk may: a
convention, so it conforms, the convention reported and its downstream tensors judged against float64
for its own experts), and one that breaks a tie by taking an expert below it (a bug: it fails at the
routing stage, and the JUnit file of the reports says so).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from gdncheck.conformance.earn.emulate import EmulatedLayer, emulated_adapter
from gdncheck.conformance.judge.records import validate_summary
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.manifest import load_manifest
from gdncheck.reports.junit import JUnit, add_verify_summary

FIXTURES = "fixtures/default"


@pytest.fixture(autouse=True)
def _quiet_resets():  # as the judge's, earn's, meta's and ports' tests have it (their conftest.py)
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    yield


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


class TieBelow(EmulatedLayer):
    """At an exact tie on the k boundary, takes the best expert *below* the tie instead of a tied one."""

    def routing(self, router_logits):
        weights, selected = super().routing(router_logits)
        l = np.asarray(router_logits, dtype=np.float64)
        k = self.cfg.num_experts_per_tok
        order = np.argsort(-l, axis=-1, kind="stable")
        kth = np.take_along_axis(l, order[..., k - 1:k], -1)[..., 0]
        nxt = np.take_along_axis(l, order[..., k:k + 1], -1)[..., 0]
        selected = selected.copy()
        for b, t in np.argwhere(kth == nxt):
            below = next(e for e in order[b, t] if l[b, t, e] < kth[b, t])
            selected[b, t, k - 1] = below
        return weights, selected


def _factory(cls):
    def factory(cfg, weights, *, profile="f32", strict=False, **kw):
        return emulated_adapter(cls(cfg, weights, profile=profile, placement="hf", strict=strict), cls.__name__)
    return factory


def _case(prefix):
    return next(c for c in load_manifest(FIXTURES)["cases"] if c["id"].startswith(prefix))


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    out = {}
    for cls in (FlipNearest, TieToHigher, TieBelow):
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


def test_a_port_resolving_ties_upward_conforms_with_the_convention_reported(judged):
    by_id = {c.id: c for c in judged["TieToHigher"].cases}
    assert by_id[_case("moe-e256-k8")["id"]].status == "pass"  # no tie there
    tie = by_id[_case("moe-exact-tie")["id"]]
    assert tie.status == "pass", tie.message
    conv = [r.convention for r in tie.records if r.convention]
    assert conv and all(c["choice"] == "higher index" for c in conv)
    assert sum(c["tokens"] for c in conv) >= 1
    assert any("exact ties on the k boundary" in n for n in tie.notes)
    validate_summary(judged["TieToHigher"].to_json())


def test_the_tie_downstream_is_judged_for_the_ports_own_experts(judged):
    """The higher-index port's experts_out at a tied token differs from the golden's by far more than a
    bound (another expert's output), and still passes: it is judged against float64 for its experts."""
    from gdncheck.harness import call_key
    from gdncheck.safetensors_io import SafetensorsFile

    tie = next(c for c in judged["TieToHigher"].cases if c.id.startswith("moe-exact-tie"))
    rec = next(r for r in tie.records if r.convention)
    tok = rec.convention["first"][0]
    gold = SafetensorsFile(f"{FIXTURES}/{tie.file}")
    outs = SafetensorsFile(tie.outputs_file)
    key = call_key(rec.call, "experts_out")
    g = np.asarray(gold.read(key), dtype=np.float64)[tok["row"], tok["token"]]
    a = np.asarray(outs.read(key), dtype=np.float64)[tok["row"], tok["token"]]
    assert np.linalg.norm(a - g) > 0.05 * np.linalg.norm(g)  # not the golden's token
    assert next(r for r in tie.records if r.tensor == "experts_out" and r.call == rec.call).verdict == "pass"


def test_a_port_breaking_a_tie_below_it_fails_at_routing(judged):
    tie = next(c for c in judged["TieBelow"].cases if c.id.startswith("moe-exact-tie"))
    assert tie.status == "fail" and tie.first_divergence.reason == "routing"
    rec = next(r for r in tie.records if r.reason == "routing")
    assert all(t["exact_tie"] for t in rec.routing["first"])
    assert "not one the exact ordering allows" in tie.message
    junit = JUnit()
    add_verify_summary(junit, judged["TieBelow"])
    assert b'type="routing"' in junit.tostring()


def test_the_likely_cause_of_a_broken_tie_says_tie(tmp_path):
    """Without a mutant of the catalogue that breaks ties below, the diagnosis names no bug class and
    says what the routing verdict knows: an exact tie, resolved outside the tied experts."""
    from gdncheck.conformance.judge.diagnose import Diagnoser

    ids = [_case("moe-exact-tie")["id"]]
    run_impl(_factory(TieBelow), FIXTURES, tmp_path, "f32", cases=ids)
    (case,) = verify(FIXTURES, tmp_path, "f32", cases=ids, diagnose=Diagnoser()).cases
    assert case.first_divergence.tensor == "selected_experts"
    assert case.diagnosis["verdict"] == "none" and "exact tie" in case.diagnosis["text"], case.diagnosis
    assert "closest" not in case.diagnosis["text"]
