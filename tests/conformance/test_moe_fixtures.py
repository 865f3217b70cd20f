"""The committed sparse (MoE) fixture cases (fixtures/moe_cases.py): what they cover, that their goldens
route as the rule says (checked here with a plain stable sort), and that no conforming port can route
them otherwise: every token keeps its experts under the worst perturbation the margin allows (h_norm
moved by the earned bound against the token's decision, logits rounded to bf16), the earned h_norm
bounds stay within the margin's assumption, and the builder refuses a case with a near tie."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gdncheck.config import GDNConfig
from gdncheck.conformance.judge.tolerances import load_table, recipe_of
from gdncheck.dtypes import round_to
from gdncheck.experts import ROUTER
from gdncheck.fixtures.build import build_case
from gdncheck.fixtures.moe_cases import MOE_CASES, TAU_H, groups_of, moe_weights
from gdncheck.harness import call_key, call_steps
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.safetensors_io import SafetensorsFile


def _sparse(manifest):
    return [c for c in manifest["cases"] if "moe" in c["tags"] and c["kind"] == "forward"]


def _calls(fixtures_dir, entry):
    f = SafetensorsFile(fixtures_dir / entry["file"])
    w = f.read(f"weights.{ROUTER}")
    for step in call_steps(entry["program"]):
        k = step["call"]
        yield k, w, {n: np.asarray(f.read(call_key(k, n))) for n in
                     ("h_norm", "router_logits", "selected_experts", "routing_weights")}



def test_the_sparse_cases_cover_what_issue_15_asks(manifest):
    cases = {c["id"].split("_")[0]: c for c in _sparse(manifest)}
    assert set(cases) == {"moe-e512-k10", "moe-e256-k8", "moe-exact-tie", "moe-no-renorm"}
    sizes = {n: (c["config"]["num_experts"], c["config"]["num_experts_per_tok"]) for n, c in cases.items()}
    assert sizes["moe-e512-k10"] == (512, 10) and sizes["moe-e256-k8"] == (256, 8)
    for c in cases.values():
        ops = [s["op"] for s in c["program"] if s["op"] in ("forward", "decode")]
        assert len(ops) >= 2  # a prefill, then decode steps or continuations
    assert cases["moe-no-renorm"]["config"]["norm_topk_prob"] is False and "no-renorm" in cases["moe-no-renorm"]["tags"]
    errors = [c for c in manifest["cases"] if c["kind"] == "error" and "moe" in c["tags"]]
    assert {c["expected_error"]["code"] for c in errors} == {"moe_top_k", "expert_count", "moe_config",
                                                            "missing_config_key", "weight_shape", "missing_weight"}


def test_goldens_select_the_top_k_by_a_stable_sort_with_idle_experts_and_shared_sets(fixtures_dir, manifest):
    for entry in _sparse(manifest):
        k_top = entry["config"]["num_experts_per_tok"]
        used, shared_neighbours = set(), 0
        for _, _, t in _calls(fixtures_dir, entry):
            p = np.exp(t["router_logits"] - t["router_logits"].max(-1, keepdims=True))
            expect = np.sort(np.argsort(-p, axis=-1, kind="stable")[..., :k_top], -1)
            got = np.sort(t["selected_experts"].astype(np.int64), -1)
            np.testing.assert_array_equal(got, expect)
            used |= set(got.ravel().tolist())
            shared_neighbours += int(np.all(got[:, 1:] == got[:, :-1], axis=-1).sum())
        if entry["id"].startswith(("moe-e512", "moe-e256")):
            assert len(used) < entry["config"]["num_experts"] // 2  # most experts receive no token
            assert shared_neighbours >= 1  # a token choosing the same experts as its neighbour


def test_the_exact_tie_case_ties_on_and_inside_the_boundary(fixtures_dir, manifest):
    entry = next(c for c in _sparse(manifest) if c["id"].startswith("moe-exact-tie"))
    k_top = entry["config"]["num_experts_per_tok"]
    boundary = inside = 0
    for _, w, t in _calls(fixtures_dir, entry):
        zero = np.flatnonzero(~np.any(w != 0, axis=1))
        assert len(zero) == 3
        l, sel = t["router_logits"][0], t["selected_experts"][0].astype(int)
        for tok in range(l.shape[0]):
            s = np.sort(l[tok])[::-1]
            chosen = sorted(set(sel[tok]) & set(zero.tolist()))
            if s[k_top - 1] == s[k_top]:  # the k boundary splits the tie of the zero rows
                boundary += 1
                assert chosen == sorted(zero.tolist())[:len(chosen)]  # the lowest indices
                assert np.all(l[tok, zero] == 0.0)
            elif len(chosen) == 3:
                inside += 1
    assert boundary >= 4 and inside >= 2


@pytest.mark.parametrize("profile", VERIFY_PROFILES)
def test_the_earned_h_norm_bounds_stay_within_the_margins_assumption(manifest, profile):
    table = load_table()
    for entry in _sparse(manifest):
        for mode in table.data["modes"]:
            b = table.bound("h_norm", profile, mode, entry["id"])
            assert b.source == f"case {recipe_of(entry['id'])}" and b.elem <= TAU_H


def test_no_perturbation_within_the_margin_flips_a_token(fixtures_dir, manifest):
    """h_norm moved by TAU_H·(|h| + rms) against each token's own decision (towards the (k+1)-th
    expert's row and away from the k-th's), the logits rounded to bf16: the selected set stays, save
    for the zero rows' exact tie, which no perturbation of h moves."""
    for entry in _sparse(manifest):
        k_top = entry["config"]["num_experts_per_tok"]
        for _, w, t in _calls(fixtures_dir, entry):
            w64 = np.asarray(w, dtype=np.float64)
            zero = ~np.any(w64 != 0, axis=1)
            h = t["h_norm"].reshape(-1, w64.shape[1])
            sel = t["selected_experts"].reshape(-1, k_top).astype(int)
            for i in range(h.shape[0]):
                order = np.argsort(-(w64 @ h[i]), kind="stable")
                a, b = order[k_top - 1], order[k_top]
                if zero[a] and zero[b]:
                    continue  # inside the exact tie: the rule decides, not the margin
                rms = np.sqrt(np.mean(h[i] ** 2))
                hp = h[i] + TAU_H * (np.abs(h[i]) + rms) * np.sign(w64[b] - w64[a])
                logits = w64 @ hp
                logits = np.asarray(round_to(logits, "bf16"), dtype=np.float64)  # router logits stored in bf16
                top = set(np.argsort(-logits, kind="stable")[:k_top].tolist())
                ties = set(np.flatnonzero(zero).tolist())
                assert top - ties == set(sel[i].tolist()) - ties, (entry["id"], i)


def test_the_builder_refuses_a_near_tie():
    spec = next(s for s in MOE_CASES if s.name == "moe-e256-k8")

    def near_tie(cfg: GDNConfig, seed: int):
        w = moe_weights(groups_of, scale=0.55)(cfg, seed)
        r = np.array(w[ROUTER], dtype=np.float64)
        r[:, :] = r[0]  # every expert reads like expert 0, but for a bf16-sized nudge: near ties everywhere
        r[1:, 1] += 2.0 ** -7
        w[ROUTER] = r.astype(np.float32)
        return w

    with pytest.raises(RuntimeError, match="not above the required margin"):
        build_case(replace(spec, weights=near_tie))


@pytest.mark.parametrize("profile", VERIFY_PROFILES)
def test_the_moe_mutants_are_killed_at_their_stage_on_the_sparse_fixtures(fixtures_dir, profile):
    """The kill matrix's sparse bug classes, run like ports over the committed cases with their tags:
    each caught, first at its own stage, in every case that can show it (routing_not_renormalised
    is the correct layer on the no-renorm case, so that one passes there)."""
    from gdncheck.conformance.meta.kill_matrix import kill
    from gdncheck.conformance.meta.moe_mutants import MOE_MUTANTS

    for mutant in MOE_MUTANTS:
        r = kill(mutant, profile, fixtures_dir)
        assert r.killed and r.first_stage == mutant.stage, (mutant.name, r.cell(), r.message)
        showable = r.cases - (1 if mutant.name == "routing_not_renormalised" else 0)
        assert r.cases_failed == showable and all(fd.stage == mutant.stage for fd in r.first_by_case.values()), \
            (mutant.name, r.cell())
