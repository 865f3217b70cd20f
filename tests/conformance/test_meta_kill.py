"""The meta test: each mutant (one known bug class each) goes through run + verify like a port, and
verify must catch it at the right first stage (and call, where the bug shows only later), in every
profile. Each test prints its cell of the kill matrix (pytest -s); `python -m gdncheck.conformance.meta`
prints the whole matrix over every case, and docs/meta.md records it."""

from __future__ import annotations

import pytest

from gdncheck.conformance.meta.kill_matrix import kill
from gdncheck.conformance.meta.mutants import MUTANTS

PROFILES = ("f32", "bf16", "f16")


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_killed_at_its_first_stage(mutant, profile, fixtures_dir, light_cases):
    cases = list(light_cases)
    if mutant.name == "bf16_recurrent_state":
        cases.append("long-decode")  # in a low-precision profile only a long memory shows it
    r = kill(mutant, profile, fixtures_dir, cases=cases)
    print(f"{mutant.name} [{profile}]: {r.cell()}\n  {r.message}\n  repro: {r.repro}")
    assert r.killed, f"{mutant.name} survives in {profile}"
    assert r.first_stage == mutant.stage, f"{mutant.name}: first caught at {r.first_stage}, expected {mutant.stage}"
    if mutant.call:
        recipe, call = mutant.call
        fd = next(fd for cid, fd in r.first_by_case.items() if cid.startswith(recipe))
        assert (fd.call, fd.stage) == (call, mutant.stage), fd
    assert r.repro.startswith(f"gdncheck run gdncheck.conformance.meta.mutants:{mutant.name} ")
    assert "but should be" in r.message or "but should raise" in r.message


def test_the_documented_matrix_names_every_mutant():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "meta.md").read_text()
    for m in MUTANTS:
        assert f"`{m.name}`" in doc and m.stage in doc
