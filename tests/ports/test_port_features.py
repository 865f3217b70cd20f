"""The Python port contract and the format's features (issue 42; FORMAT.md §2 `requires`, §7,
docs/plugins.md): a factory that declares the features it implements gets the cases needing more not
applicable, from the step that needs them, with the feature and its version named; a port written for
an older format that ignores a field it does not read fails, and verify names the feature added since
the version its outputs say it was written for."""

from __future__ import annotations

from pathlib import Path

import pytest

from gdncheck import features as F
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.reference_impl import reference_f64
from gdncheck.harness import LayerAdapter
from gdncheck.safetensors_io import SafetensorsFile, write_safetensors

CASES = ["mixed-batch", "spec-prefix-cache", "packed-mixed"]


def _reference(cfg, weights, *, profile, strict=False):
    return reference_f64(cfg, weights, strict=strict)


def factory_for(version):
    def factory(cfg, weights, *, profile, strict=False):
        return _reference(cfg, weights, profile=profile, strict=strict)
    factory.features = F.features_up_to(version)
    return factory


def _by_recipe(summary):
    return {c.id.split("_T")[0]: c for c in summary.cases}


def test_a_factory_declaring_format_1_1_gets_newer_cases_not_applicable(fixtures_dir, tmp_path):
    out = tmp_path / "out"
    run_impl(factory_for("1.1"), fixtures_dir, out, "f32", cases=CASES)
    by = _by_recipe(verify(fixtures_dir, out, "f32", cases=CASES))
    for recipe in ("mixed-batch", "spec-prefix-cache"):
        na = by[recipe].not_applicable
        assert by[recipe].status == "not_applicable", by[recipe].message
        assert na == {"step": 3, "op": "commit", "reason": "requires commit_snapshots (format 1.2)"}
        assert any(r.verdict == "pass" for r in by[recipe].records)  # the steps before the commit ran and pass
    assert by["packed-mixed"].status == "pass"


def test_features_on_the_implementation_and_several_missing_ones(fixtures_dir, tmp_path):
    def factory(cfg, weights, *, profile, strict=False):
        impl = _reference(cfg, weights, profile=profile, strict=strict)
        impl.features = F.features_up_to("1.0")  # declared by the object the factory returns
        return impl
    out = tmp_path / "out"
    run_impl(factory, fixtures_dir, out, "f32", cases=["mixed-batch"])
    (case,) = verify(fixtures_dir, out, "f32", cases=["mixed-batch"]).cases
    assert case.not_applicable == {"step": 2, "op": "forward_mixed",
                                   "reason": "requires mixed_batches (format 1.1), commit_snapshots (format 1.2)"}


def test_a_declared_feature_the_format_lacks_is_said_on_every_case(fixtures_dir, tmp_path):
    def factory(cfg, weights, *, profile, strict=False):
        return _reference(cfg, weights, profile=profile, strict=strict)
    factory.features = {"packed_calls", "comit_snapshots"}
    out = tmp_path / "out"
    run_impl(factory, fixtures_dir, out, "f32", cases=["packed-mixed"])
    (case,) = verify(fixtures_dir, out, "f32", cases=["packed-mixed"]).cases
    assert case.status == "fail" and "found 'comit_snapshots'" in case.message


class _Commit11(LayerAdapter):
    """A port written for format 1.1: its commit reads of_call and accepted and ignores snap_*."""

    def commit(self, spec, accepted, *snapshots) -> None:
        super().commit(spec, accepted)


def _port_1_1(cfg, weights, *, profile, strict=False):
    ref = _reference(cfg, weights, profile=profile, strict=strict)
    return _Commit11(ref.layer, "port of format 1.1", load_snapshot=ref._load, serving=ref._serving)


def _say_written_for(folder: Path, version: str) -> None:
    for path in folder.glob("*.safetensors"):
        f = SafetensorsFile(path)
        tensors = {name: f.read(name) for name in f}
        write_safetensors(path, tensors, {**f.metadata, "fixture_format_version": version},
                          {name: f.dtype_of(name) for name in f})


@pytest.mark.parametrize("written_for", [None, "1.1", "1.2"])
def test_verify_names_the_features_added_since_the_ports_version(fixtures_dir, tmp_path, written_for):
    out = tmp_path / "out"
    run_impl(_port_1_1, fixtures_dir, out, "f32", cases=["spec-prefix-cache"])
    if written_for:
        _say_written_for(out, written_for)
    (case,) = verify(fixtures_dir, out, "f32", cases=["spec-prefix-cache"]).cases
    assert case.status == "fail"  # its snapshot slots left as they were: a wrong answer
    said = ("the port says it was written for fixture format 1.1, and this case requires commit_snapshots "
            "(format 1.2), added since")
    assert (said in case.message) == (written_for == "1.1"), case.message


@pytest.mark.parametrize("value", ["latest", "1.2.0", ""])
def test_an_unreadable_written_for_version_makes_the_outputs_unusable(fixtures_dir, tmp_path, value):
    out = tmp_path / "out"
    run_impl(factory_for("1.2"), fixtures_dir, out, "f32", cases=["packed-mixed"])
    _say_written_for(out, value)
    s = verify(fixtures_dir, out, "f32", cases=["packed-mixed"])
    (case,) = s.cases
    assert case.status == "error" and s.exit_code == 2
    assert "metadata fixture_format_version a version" in case.problem and "\n" not in case.problem
