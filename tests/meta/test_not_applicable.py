"""The not_applicable verdict: an implementation that cannot express a case says so with a reason; the
steps before are judged, the case is neither a pass nor a failure, and the exit code ignores it."""

from __future__ import annotations

from gdncheck.conformance.judge.records import validate_summary
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.meta.mutants import MUTANT_BY_NAME
from gdncheck.conformance.ports.implementations import reference
from gdncheck.conformance.ports.run import run_impl
from gdncheck.harness import NotApplicable
from gdncheck.safetensors_io import SafetensorsFile
from tests.helpers import default_case_id


def without_snapshot_files(factory):
    """``factory``'s implementation, but one that has no snapshot file format."""

    def make(*args, **kwargs):
        impl = factory(*args, **kwargs)

        def refuse(*_a, **_k):
            raise NotApplicable("no snapshot file format")

        impl.save_snapshot = refuse
        return impl

    return make


def never_strict(config, program):
    if any(s.get("strict") for s in program):
        raise NotApplicable("no strict mode")


def test_not_applicable_is_neither_pass_nor_fail(fixtures_dir, tmp_path):
    factory = without_snapshot_files(reference)
    factory.check_case = never_strict
    rep = run_impl(factory, fixtures_dir, tmp_path, "f64", cases=["snapshot-replay", "prefill_T1_", "error-seq-pos"])
    assert {c.id.split("_")[0]: c.status for c in rep.cases} == {  # in the manifest's order, whatever it is
        "snapshot-replay": "not_applicable", "prefill": "ran", "error-seq-pos-mismatch": "not_applicable"}
    meta = SafetensorsFile(tmp_path / f"{default_case_id('snapshot-replay')}.safetensors").metadata
    assert meta["not_applicable"] == "no snapshot file format" and meta["not_applicable_step"] == "3"
    s = verify(fixtures_dir, tmp_path, "f32", cases=["snapshot-replay", "prefill_T1_", "error-seq-pos"])
    by_id = {c.id.split("_")[0]: c for c in s.cases}
    snap, strict = by_id["snapshot-replay"], by_id["error-seq-pos-mismatch"]
    assert snap.status == "not_applicable" and snap.not_applicable == {"step": 3, "op": "save",
                                                                         "reason": "no snapshot file format"}
    assert {r.call for r in snap.records} == {0} and all(r.verdict == "pass" for r in snap.records)
    assert strict.status == "not_applicable" and strict.error_check is None and strict.not_applicable["step"] == 0
    assert s.exit_code == 0 and s.verdict() == "conforms"
    t = s.totals()
    assert (t["passed"], t["failed"], t["not_applicable"]) == (1, 0, 2)
    doc = s.to_json()
    validate_summary(doc)
    assert doc["totals"]["not_applicable"] == 2


def test_a_failure_before_the_step_it_cannot_express_is_a_failure(fixtures_dir, tmp_path):
    factory = without_snapshot_files(MUTANT_BY_NAME["norm_weight_plain"].factory)
    run_impl(factory, fixtures_dir, tmp_path, "f32", cases=["snapshot-replay"])
    s = verify(fixtures_dir, tmp_path, "f32", cases=["snapshot-replay"])
    (case,) = s.cases
    assert case.status == "fail" and case.first_divergence.tensor == "x_norm" and s.exit_code == 1
    assert case.not_applicable["step"] == 3  # still recorded


def test_a_port_declares_not_applicable_in_its_outputs(fixtures_dir, tmp_path):
    """Any port (not only Python plug-ins) writes the metadata of FORMAT.md §7."""
    from tests.fixtures.outputs import perfect_outputs

    perfect_outputs(fixtures_dir, "per-head-norm_T", tmp_path,  # _T: not the depth variants -gva2, -mha
                    alter=lambda t: [t.pop(k) for k in [k for k in t if not k.startswith("calls.0.")]],
                    meta={"not_applicable": "no per-head norm", "not_applicable_step": "2"})
    s = verify(fixtures_dir, tmp_path, "bf16", cases=["per-head-norm_T"])
    (case,) = s.cases
    assert case.status == "not_applicable" and case.not_applicable["op"] == "forward"
    assert "no per-head norm" in case.message and all(r.call == 0 for r in case.records)
    assert len(case.records) == 21 and all(r.verdict == "pass" for r in case.records)  # 20 tensors + seq_len


def only_dk_equal_dv(factory):
    """``factory``'s implementation as a port whose delta rule requires dk = dv (llama.cpp's ggml op):
    every case with dk != dv is not applicable from its first step."""

    def check(config, program):  # the case's Hugging Face config, before gdncheck parses it
        dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
        if dk != dv:
            raise NotApplicable(f"the delta rule needs dk = dv, found dk {dk}, dv {dv}")

    def make(*args, **kwargs):
        return factory(*args, **kwargs)

    make.check_case = check
    return make


def test_a_port_restricted_to_dk_equal_dv_is_judged_on_nearly_everything(fixtures_dir, manifest, tmp_path):
    """A dk = dv port (llama.cpp's delta rule) is judged on every forward case but the few tagged
    dk-ne-dv: the dense, serving and sparse cases have the dimension mix of real models. No released
    checkpoint has dk != dv, so those cases carry the optional feature dk_ne_dv: declaring them not
    applicable is allowed, saying why, and such a port conforms. Such a port with its value heads in
    the tiled order cannot hide: it fails cases with two key heads that enter with a state, the
    serving cases among them."""
    # not the sharded cases: judged rank by rank, they are not applicable to a port without the sharded
    # methods (this wrapper has none: tests/ports/test_sharded_run.py)
    forward = [c for c in manifest["cases"] if c["kind"] == "forward" and not c["id"].startswith("long-decode")
               and "sharded" not in c["tags"]]
    ids = [c["id"] for c in forward]
    ne = {c["id"] for c in forward if "dk-ne-dv" in c["tags"]}
    assert 0 < len(ne) <= 0.1 * len(forward)
    run_impl(only_dk_equal_dv(reference), fixtures_dir, tmp_path / "ok", "f32", cases=ids)
    s = verify(fixtures_dir, tmp_path / "ok", "f32", cases=ids)
    by = {c.id: c for c in s.cases}
    assert all(by[i].status == "pass" for i in ids if i not in ne)
    for i in ne:
        assert by[i].status == "not_applicable", (i, by[i].status)
        assert "the delta rule needs dk = dv, found dk" in by[i].message
    assert s.exit_code == 0 and s.coverage()["not_applicable_features"].get("dk_ne_dv") == len(ne)
    tiled = only_dk_equal_dv(MUTANT_BY_NAME["head_grouping_tiled"].factory)
    run_impl(tiled, fixtures_dir, tmp_path / "tiled", "f32", cases=ids)
    s = verify(fixtures_dir, tmp_path / "tiled", "f32", cases=ids)
    failed = {c.id.split("_")[0] for c in s.cases if c.status == "fail" and c.id not in ne}
    assert {"prefill-decode", "snapshot-replay", "packed-mixed", "spec-decode", "prefix-cache"} <= failed, failed
