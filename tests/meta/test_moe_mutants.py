"""The sparse block's mutants (conformance/meta/moe_mutants.py), tested on sparse layers directly: each,
run like a port through the harness, is first caught at its own stage, by at least ten times the bound,
in every profile, end to end and stage by stage; and through the kill matrix on the committed suite's
sparse cases.

The bound is earned here as ``gdncheck tolerances derive`` earns it (conformance/earn/derive.py): the
largest scaled error (the judge's metric) of the correct emulated layer over the derivation
placements, times the same margin, never below one ulp. The case keeps every token's routing off a
tie by more than four times the largest router-logit drift of those placements in bf16 (measured:
``routing_decided`` with ``logit_drift``), so the correct placements route as the reference does
and the bound is a rounding bound.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from gdncheck.config import GDNConfig
from gdncheck.conformance.earn.derive import MARGIN_ELEM
from gdncheck.conformance.earn.emulate import DERIVATION_PLACEMENTS, emulated
from gdncheck.conformance.judge.metrics import CaseStats, tensor_metrics
from gdncheck.conformance.meta import kill_matrix
from gdncheck.conformance.meta.moe_mutants import MOE_MUTANTS, tagged_cases
from gdncheck.fixtures.reference_impl import reference_f64
from gdncheck.harness import call_key, call_steps, execute, golden_inputs
from gdncheck.profiles import PROFILES, VERIFY_PROFILES
from gdncheck.stages import is_index_tensor, layer_stage_names, stage_of, stage_outputs, stage_rank, tensor_rank
from gdncheck.synthetic import make_inputs, make_weights
from tests.helpers import by_expert, moe_case, routing_decided

CFG = GDNConfig(hidden_size=32, intermediate_size=None, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8,
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
SPLITS = (0, 10, 11, 12)  # a prefill, then two decode steps
PROFILE_NAMES = ("f32", "bf16", "f16")


def _config(renormalised: bool) -> GDNConfig:
    return CFG if renormalised else CFG.replace(norm_topk_prob=False)


def _decided_case(cfg: GDNConfig):
    """A prefill + decode case whose every token is routed beyond any placement's reach (the first
    input seed that is; about one in eight is)."""
    # expert pre-activations of O(1), as in trained models: near 0 silu is nearly linear, and gate/up
    # swapped would hardly change the product there; a router flat enough that the top-2 of 8 experts
    # hold well under all the probability (so a missing renormalisation shows)
    w = make_weights(cfg, seed=2, std=0.1, router_std=0.2)
    calls = range(len(SPLITS) - 1)
    for seed in range(60):
        case = moe_case(cfg, w, make_inputs(cfg, 2, SPLITS[-1], seed=seed, outliers=0), SPLITS)
        gold = execute(reference_f64, case, profile="f64", capture_state_in=True)
        logits = [gold.outputs[call_key(k, "router_logits")] for k in calls]
        drift = max(float(np.abs(_end_to_end(emulated, case, "bf16", placement=p)[call_key(k, "router_logits")]
                                 - logits[k]).max()) for p in DERIVATION_PLACEMENTS for k in calls)
        if all(routing_decided(lk, cfg.num_experts_per_tok, "bf16", drift).all() for lk in logits):
            return case, {**gold.outputs, **gold.state_in}
    raise AssertionError("no input seed keeps every token off a routing tie")


@pytest.fixture(scope="module", params=[True, False], ids=["renormalised", "no-renorm"])
def sparse(request):
    cfg = _config(request.param)
    case, gold = _decided_case(cfg)
    stats = {n: CaseStats(n, [gold[call_key(s["call"], n)] for s in call_steps(case.program)])
             for n in {key.split(".", 2)[2] for key in gold if key.count(".") == 2 and not key.endswith("_in")}}
    return cfg, case, gold, stats


def _end_to_end(factory, case, profile, **options) -> dict:
    res = execute(factory, case, profile=profile, options=options)
    assert res.error is None, res.error
    return res.outputs


def _isolated(impl, case, gold) -> dict:
    out = {}
    for step in call_steps(case.program):
        k = step["call"]
        for stage in layer_stage_names("moe")[1:]:
            inputs = golden_inputs(gold, k, stage, "moe")
            if inputs is not None:
                result = impl.run_stage(stage, inputs)
                out.update({call_key(k, n): result[n] for n in stage_outputs(stage, "moe") if n in result})
    return out


def _errors(outputs: dict, gold: dict, stats: dict, profile: str) -> dict[str, float]:
    """Scaled elementwise error (the judge's) per ``calls.k.tensor`` key. The routing is compared as
    a set: selected experts exactly, routing weights by expert, each token's slots sorted by expert
    index (the slot order of nearly equal probabilities is no port's promise)."""
    outputs, gold = _by_expert(outputs), _by_expert(gold)
    errs = {}
    for key, value in outputs.items():
        name = key.split(".", 2)[2]
        if key not in gold or name == "seq_len":
            continue
        if is_index_tensor(name):
            errs[key] = 0.0 if np.array_equal(value, gold[key]) else np.inf
            continue
        errs[key] = tensor_metrics(value, gold[key], name, profile, stats[name]).max_err
    return errs


def _by_expert(arrays: dict) -> dict:
    out = dict(arrays)
    for key in arrays:
        if key.endswith(".selected_experts") and key.replace("selected_experts", "routing_weights") in arrays:
            weights = key.replace("selected_experts", "routing_weights")
            out[key], out[weights] = by_expert(arrays[key], arrays[weights])
    return out


def _bounds(cfg, case, gold, stats, profile, isolated: bool) -> dict[str, float]:
    """The derivation's bound per key: margin x the envelope of the correct placements, ≥ one ulp."""
    env: dict[str, float] = {}
    for placement in DERIVATION_PLACEMENTS:
        if isolated:
            outputs = _isolated(emulated(cfg, case.weights, profile=profile, placement=placement), case, gold)
        else:
            outputs = _end_to_end(emulated, case, profile, placement=placement)
        for key, e in _errors(outputs, gold, stats, profile).items():
            assert np.isfinite(e), f"{placement} {profile}: {key} differs: a correct placement must route alike"
            env[key] = max(env.get(key, 0.0), e)
    return {key: max(MARGIN_ELEM * e, PROFILES[profile].eps) for key, e in env.items()}


def _first_failure(errs: dict, bounds: dict) -> tuple[str, float]:
    failed = [key for key, e in errs.items() if e > bounds[key]]
    assert failed, "the mutant passes every bound"

    def where(key):
        k, name = key.split(".", 2)[1:]
        return int(k), stage_rank(stage_of(name)), tensor_rank(name)

    first = min(failed, key=where)
    return first, errs[first] / bounds[first]


@pytest.mark.parametrize("profile", PROFILE_NAMES)
@pytest.mark.parametrize("mutant", MOE_MUTANTS, ids=[m.name for m in MOE_MUTANTS])
def test_moe_mutant_is_caught_at_its_stage_by_ten_times_the_bound(sparse, mutant, profile):
    cfg, case, gold, stats = sparse
    if "no-renorm" in mutant.case_tags and cfg.norm_topk_prob or \
            mutant.name == "routing_not_renormalised" and not cfg.norm_topk_prob:
        # no bug on this case: it computes the correct layer's numbers (up to its float32 arithmetic)
        bounds = _bounds(cfg, case, gold, stats, profile, isolated=False)
        errs = _errors(_end_to_end(mutant.factory, case, profile), gold, stats, profile)
        assert all(e <= bounds[key] for key, e in errs.items()), f"{mutant.name} fails a case that cannot show it"
        return
    for isolated in (False, True):
        bounds = _bounds(cfg, case, gold, stats, profile, isolated)
        if isolated:
            outputs = _isolated(mutant.factory(cfg, case.weights, profile=profile), case, gold)
        else:
            outputs = _end_to_end(mutant.factory, case, profile)
        first, ratio = _first_failure(_errors(outputs, gold, stats, profile), bounds)
        mode = "stage-isolated" if isolated else "end to end"
        assert stage_of(first.split(".", 2)[2]) == mutant.stage, f"{mode}: first caught at {first}"
        assert first.startswith("calls.0."), f"{mode}: first caught at {first}, not in the first call"
        assert ratio >= 10, f"{mode}: {first} only {ratio:.1f} x its bound"


def test_the_kill_matrix_runs_them_on_tagged_cases(fixtures_dir, tmp_path):
    """Registered with the kill matrix, run on the cases with their tags (the committed suite's sparse
    cases: tests/fixtures/test_moe_fixtures.py); on a suite without a sparse case each is reported,
    not run."""
    assert set(MOE_MUTANTS) <= set(kill_matrix.CATALOGUE)
    # (two of the six sparse cases, without renormalisation, added for coverage depth: issue 44)
    assert len(tagged_cases(fixtures_dir, ("moe",))) == 6 and len(tagged_cases(fixtures_dir, ("moe", "no-renorm"))) == 3
    doc = json.loads((fixtures_dir / "manifest.json").read_text())
    doc["cases"] = [c for c in doc["cases"] if "moe" not in c["tags"]]
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    for c in doc["cases"]:
        shutil.copy(fixtures_dir / c["file"], tmp_path / c["file"])
    fixtures_dir = tmp_path
    assert tagged_cases(fixtures_dir, ("moe",)) == []
    r = kill_matrix.kill(MOE_MUTANTS[0], "bf16", fixtures_dir)
    assert (r.killed, r.cases, r.cell()) == (False, 0, "no case") and "no case tagged moe, no-renorm" in r.message
    table = kill_matrix.format_matrix([r], ("bf16",))
    assert "| `softmax_after_topk` (softmax after top-k instead of before) | routing | - | no case |" in table


@pytest.mark.parametrize("profile", VERIFY_PROFILES)
def test_the_moe_mutants_are_killed_at_their_stage_on_the_sparse_fixtures(fixtures_dir, profile):
    """The kill matrix's sparse bug classes, run like ports over the committed cases with their tags:
    each caught, first at its own stage, in every case that can show it (routing_not_renormalised
    is the correct layer on the no-renorm cases, so those pass there)."""
    from gdncheck.conformance.meta.kill_matrix import kill
    from gdncheck.conformance.meta.moe_mutants import MOE_MUTANTS

    from gdncheck.conformance.meta.moe_mutants import tagged_cases as tagged

    no_renorm = len(tagged(fixtures_dir, ("moe", "no-renorm")))
    for mutant in MOE_MUTANTS:
        r = kill(mutant, profile, fixtures_dir)
        assert r.killed and r.first_stage == mutant.stage, (mutant.name, r.cell(), r.message)
        showable = r.cases - (no_renorm if mutant.name == "routing_not_renormalised" else 0)
        assert r.cases_failed == showable and all(fd.stage == mutant.stage for fd in r.first_by_case.values()), \
            (mutant.name, r.cell())
