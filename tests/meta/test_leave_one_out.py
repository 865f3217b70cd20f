"""The leave-one-class-out count (issue 42 item 2): the symptoms judged against each mutant's declared
truth (conformance/meta/truth.py), independently of the symptom code; the L2-norm eps dk× too large
no longer named "a scale per head"."""

from __future__ import annotations

import functools

from gdncheck.conformance.judge.diagnose import Diagnoser
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.meta.catalogue import ALL_MUTANTS, MutantCatalogue
from gdncheck.conformance.meta.heldout_mutants import HELDOUT_BY_NAME, HELDOUT_MUTANTS
from gdncheck.conformance.meta.kill_matrix import CATALOGUE, judge_symptoms
from gdncheck.conformance.meta.truth import TRUTH, judge_fact
from gdncheck.conformance.ports.run import run_impl


def test_every_mutant_declares_its_truth():
    assert {m.name for m in (*CATALOGUE, *HELDOUT_MUTANTS)} <= set(TRUTH)


def test_facts_are_judged_against_the_declared_truth():
    assert judge_fact("state_transposed", "relation:transpose") == "true"
    assert judge_fact("state_transposed", "relation:uniform_scale") == "wrong"
    assert judge_fact("state_transposed", "heads:all") == "unverified"
    # the right stage and one true specific fact; a generic one (every head) is not enough
    assert judge_symptoms("state_transposed", True, ["heads:all", "relation:transpose"]) == ("true", [])
    assert judge_symptoms("state_transposed", False, ["relation:transpose"]) == ("silent", [])
    assert judge_symptoms("scale_doubled", True, ["tokens:all"]) == ("silent", [])
    assert judge_symptoms("scale_doubled", True, ["relation:transpose", "relation:uniform_scale"]) == \
        ("wrong", ["relation:transpose"])
    # a special case of a true relation is true: a uniform scale of a bug that scales each head
    assert judge_fact("a_log_converted_twice", "relation:uniform_scale") == "true"
    assert judge_fact("a_log_converted_twice", "relation:sign") == "wrong"  # its scale is positive
    assert judge_fact("a_log_converted_twice", "relation:shift_late") == "wrong"
    # the kinds every mutant declares by default: a precision, a decay order or an eps fact where the bug has
    # none is wrong; non-finite values where the golden is finite are a measurement, generic
    assert judge_fact("bf16_recurrent_state", "precision:bf16") == "true"
    assert judge_fact("f16_recurrent_state", "precision:bf16") == "wrong"
    assert judge_fact("scale_doubled", "precision:bf16") == "wrong"
    assert judge_fact("decay_after_write", "order:decay_after_write") == "true"
    assert judge_fact("state_transposed", "order:decay_after_write") == "wrong"
    assert judge_fact("missing_l2_norm", "eps:small_norm") == "wrong"
    assert judge_fact("chunk_masked_exp", "nonfinite:decay_underflow") == "true"
    assert judge_fact("a_log_sign", "nonfinite:decay_underflow") == "wrong"
    assert judge_symptoms("a_log_sign", True, ["nonfinite:appear"]) == ("silent", [])


def _diagnosis(fixtures_dir, tmp_path, mutant, case, catalogue):
    run_impl(functools.partial(mutant.factory, placement="fp32_once"), fixtures_dir, tmp_path, "f32", cases=[case])
    s = verify(fixtures_dir, tmp_path, "f32", cases=[case],
               diagnose=Diagnoser(MutantCatalogue(fixtures_dir, mutants=catalogue)))
    return s.cases[0].diagnosis


def test_l2_eps_dk_times_is_no_scale_per_head(fixtures_dir, tmp_path):
    m = HELDOUT_BY_NAME["l2norm_eps_dk_times"]
    held = tuple(x for x in ALL_MUTANTS if x.bug_class != m.bug_class)
    d = _diagnosis(fixtures_dir, tmp_path / "held", m, "qk-eps", held)
    assert d["verdict"] == "none" and "scale per head" not in d["text"].split("symptoms")[0], d["text"]
    codes = {f["code"] for f in d["symptoms"]}
    assert codes & {"relation:per_head_scale", "relation:vector_scale"}, d["symptoms"]
    assert all(judge_fact(m.name, c) != "wrong" for c in codes), codes
    d = _diagnosis(fixtures_dir, tmp_path / "full", m, "qk-eps", ALL_MUTANTS)  # in the catalogue: named
    assert d["bug_class"] == m.bug_class and d["verdict"] in ("matches", "ambiguous"), d["text"]


def test_an_unknown_bug_prints_its_stage_and_a_true_fact(fixtures_dir, tmp_path, capsys):
    """Done-when of issue 42: a port with a bug of a class gdncheck does not know (the v segment's conv
    weights one tap late) prints, for its first case, the stage and a true fact (only the v channels),
    and names no class."""
    from gdncheck.cli import main

    out = tmp_path / "out"
    impl = "gdncheck.conformance.meta.heldout_mutants:conv_weight_v_shifted"
    assert main(["run", impl, "--fixtures", str(fixtures_dir), "--profile", "f32", "--case", "prefill-decode_T65",
                 "--out", str(out), "-q"]) == 0
    capsys.readouterr()
    code = main(["verify", "--fixtures", str(fixtures_dir), "--outputs", str(out), "--profile", "f32",
                 "--case", "prefill-decode_T65"])
    text = capsys.readouterr().out
    assert code == 1 and "stage conv1d, tensor qkv_conv" in text, text
    cause = next(line for line in text.splitlines() if line.startswith("      likely cause: "))
    assert "symptoms of qkv_conv: " in cause and "only in the v channels of the conv" in cause, cause
    assert cause.endswith("no known bug class matches"), cause
