"""The kill matrix: every mutant, in every profile, through the same ``run`` + ``verify`` path as a
port, and where verify first catches it.

    python -m gdncheck.conformance.meta [--profiles f32,bf16,f16] [--fixtures DIR] [--markdown]
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gdncheck.conformance.judge.records import FirstDivergence
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.manifest import DEFAULT_DIR
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.stages import stage_rank

from .moe_mutants import MOE_MUTANTS, tagged_cases
from .mutants import MUTANTS, Mutant
from .serving_mutants import SERVING_MUTANTS

#: Every mutant the matrix runs: the dense layer's, then the sparse block's and the serving patterns'
#: (run on their tagged cases).
CATALOGUE: tuple[Mutant, ...] = MUTANTS + MOE_MUTANTS + SERVING_MUTANTS


@dataclass
class KillResult:
    mutant: str
    profile: str
    killed: bool
    first_stage: str | None
    cases_failed: int
    cases: int
    first_by_case: dict[str, FirstDivergence] = field(default_factory=dict)
    message: str | None = None
    repro: str | None = None

    def cell(self) -> str:
        if not self.cases:
            return "no case"
        if not self.killed:
            return "survives"
        return f"{self.first_stage} ({self.cases_failed}/{self.cases})"


def kill(mutant: Mutant, profile: str, fixtures_dir=DEFAULT_DIR, out_dir=None, cases=None) -> KillResult:
    """Run ``mutant`` over the cases in ``profile`` and verify its outputs. A mutant with ``case_tags``
    (the sparse block's) runs on the cases carrying them by default; with none in the suite it is not
    run (``cases`` 0, cell "no case")."""
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    tags = getattr(mutant, "case_tags", ())
    if cases is None and tags:
        cases = tagged_cases(fixtures_dir, tags)
        if not cases:
            return KillResult(mutant.name, profile, False, None, 0, 0,
                              message=f"no case tagged {', '.join(tags)} in {fixtures_dir}")
    module = getattr(mutant, "module", "gdncheck.conformance.meta.mutants")
    with tempfile.TemporaryDirectory(prefix=f"gdncheck-mutant-{mutant.name}-") as tmp:
        out = Path(out_dir) if out_dir else Path(tmp)
        run_impl(mutant.factory, fixtures_dir, out, profile, cases=cases,
                 command=f"gdncheck run {module}:{mutant.name} --fixtures {fixtures_dir} "
                         f"--out {out} --profile {profile}")
        summary = verify(fixtures_dir, out, profile, cases=cases)
    failing = [c for c in summary.cases if c.status == "fail"]
    first_by_case = {c.id: c.first_divergence for c in failing}
    stages = [fd.stage for fd in first_by_case.values() if fd and fd.stage]
    first = min(stages, key=stage_rank) if stages else None
    earliest = next((c for c in failing if c.first_divergence and c.first_divergence.stage == first), None)
    return KillResult(mutant.name, profile, bool(failing), first, len(failing), len(summary.cases), first_by_case,
                      earliest.message if earliest else None, earliest.repro if earliest else None)


def matrix(profiles=VERIFY_PROFILES, fixtures_dir=DEFAULT_DIR, mutants=CATALOGUE) -> list[KillResult]:
    return [kill(m, p, fixtures_dir) for m in mutants for p in profiles]


def format_matrix(results: list[KillResult], profiles=VERIFY_PROFILES) -> str:
    """A markdown table: mutant (bug class), expected first stage, then the first stage caught per profile."""
    by = {(r.mutant, r.profile): r for r in results}
    lines = ["| mutant (bug class) | expected first stage | " + " | ".join(profiles) + " |",
             "|---|---|" + "---|" * len(profiles)]
    for m in CATALOGUE:
        if not any((m.name, p) in by for p in profiles):
            continue
        cells = [by[(m.name, p)].cell() if (m.name, p) in by else "-" for p in profiles]
        where = f" (first at call {m.call[1]} of {m.call[0]})" if m.call else ""
        lines.append(f"| `{m.name}` ({m.bug_class}) | {m.stage}{where} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
