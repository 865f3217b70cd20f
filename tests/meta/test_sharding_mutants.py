"""The field's sharding bugs as mutants (issue 41 item 5; docs/meta.md, "Sharding faults"): each is caught
by run + verify alone, at its stage, naming its rank on its own case, by at least the goal in every profile
save the one the docs list below it with its reason, and by the margin and on the cases the docs record."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from gdncheck.conformance.meta.kill_matrix import GOAL, kill
from gdncheck.conformance.meta.sharding_mutants import SHARDING_MUTANTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "meta.md"
PROFILES = ("f32", "bf16", "f16")
#: (mutant, profile) the docs list below the goal, with the reason (none since g is judged by its own rule)
BELOW_GOAL: set[tuple[str, str]] = set()
CELL = re.compile(r"^(?P<stage>\w+) ×(?P<margin>[0-9.e+-]+|∞) \((?P<failed>\d+)/(?P<cases>\d+)\)$")


def documented() -> dict[tuple[str, str], str]:
    text = DOC.read_text(encoding="utf-8").split("## Sharding faults (issue 41)", 1)[1]
    cells = {}
    for line in text.splitlines():
        m = re.match(r"^\| `(\w+)` \(.*\) \| \w+ \(\d\) \| (.*) \|$", line)
        if m:
            cells.update({(m.group(1), p): c for p, c in zip(PROFILES, m.group(2).split(" | "))})
    return cells


def test_the_docs_hold_a_cell_for_every_sharding_mutant_in_every_profile():
    cells = documented()
    assert {(m.name, p) for m in SHARDING_MUTANTS for p in PROFILES} == set(cells)
    assert all(CELL.match(c) for c in cells.values()), cells


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mutant", SHARDING_MUTANTS, ids=[m.name for m in SHARDING_MUTANTS])
def test_a_sharding_mutant_is_caught_at_its_stage_and_rank(mutant, profile, fixtures_dir):
    doc = CELL.match(documented()[(mutant.name, profile)])
    r = kill(mutant, profile, fixtures_dir)
    print(f"{mutant.name} [{profile}]: {r.cell()} (documented: {doc.group(0)})\n  {r.message}\n  repro: {r.repro}")
    assert r.killed and r.first_stage == mutant.stage == doc["stage"], r.cell()
    assert (r.cases_failed, r.cases) == (int(doc["failed"]), int(doc["cases"])), r.cell()
    recipe, call = mutant.call
    own = next(c for c in r.summary.cases if c.id.startswith(recipe + "_"))
    if (mutant.name, profile) in BELOW_GOAL:
        assert 1 < r.stage_margin < GOAL, r.cell()
    else:
        assert r.stage_margin >= GOAL, r.cell()
        assert own.status == "fail" and own.message.startswith(f"rank {mutant.rank}, "), own.message
        assert (own.first_divergence.call, own.first_divergence.stage) == (call, mutant.stage)
    margin = math.inf if doc["margin"] == "∞" else float(doc["margin"])
    # the margins move with the CPU's rounding (bf16 and f16 most): the docs within a factor of 2 either way
    assert (margin == r.stage_margin == math.inf) or (r.stage_margin / 2 <= margin <= 2 * r.stage_margin), r.cell()
    assert r.repro.startswith(f"gdncheck run gdncheck.conformance.meta.sharding_mutants:{mutant.name} ")
