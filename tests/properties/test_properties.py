"""The property suite in CI: every property holds for the precision-emulating reference in every
profile and rounding placement (the evidence that the global bounds fit generated layers), and for
the Triton path (interpreted here, compiled on a GPU) with a lean number of examples; the suite
catches a mutant.

The same properties run against any implementation with::

    GDN_IMPL=triton GDN_PROFILE=bf16 python -m pytest tests/properties/test_env_subject.py
"""

from __future__ import annotations

import pytest

from gdncheck.conformance.properties import PROPERTIES
from gdncheck.conformance.properties.registry import subject_from_env
from gdncheck.conformance.properties.runner import format_result, run_property

NAMES = sorted(PROPERTIES)
PROFILES = ["f32", "bf16", "f16"]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("placement", ["hf", "fla", "fp32_once"])
def test_emulated_reference_holds_every_property(placement, profile):
    subject = subject_from_env(f"tests.properties.placements:{placement}", profile)
    results = [run_property(n, subject, max_examples=6, hypothesis_profile="ci", shrink=False) for n in NAMES]
    bad = [format_result(r) for r in results if r.status != "pass"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", NAMES)
def test_triton_path_holds(name):
    """One profile per property, rotating, so that every profile is covered across the suite."""
    profile = PROFILES[NAMES.index(name) % 3]
    r = run_property(name, subject_from_env("triton", profile), max_examples=2, hypothesis_profile="ci",
                     shrink=False)
    assert r.status == "pass", format_result(r)


@pytest.mark.parametrize("mutant,prop", [("head_grouping_tiled", "value_head_permutation"),
                                         ("snapshot_aliases_state", "snapshot_round_trip"),
                                         ("no_reset_on_mismatch", "seq_pos_mismatch_resets"),
                                         ("decay_after_write", "strong_decay_forgets")])
def test_properties_catch_mutants(mutant, prop):
    r = run_property(prop, subject_from_env(f"gdncheck.conformance.meta.mutants:{mutant}", "f32"), max_examples=20,
                     hypothesis_profile="ci", shrink=False)
    assert r.status == "fail", f"{prop} did not catch mutant {mutant}: {format_result(r)}"
    assert r.blob and "--replay" in r.replay
