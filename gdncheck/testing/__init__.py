"""The conformance suite from Python: one call for notebooks and other runners, and the pieces the
pytest plugin (:mod:`gdncheck.testing.plugin`) is made of.

    from gdncheck.testing import assert_conforms
    assert_conforms("myport:factory", "bf16")       # or a factory itself; raises NonConformance

Each call runs the implementation over the selected cases of a fixture suite (the committed default
suite unless ``fixtures`` is given) exactly as ``gdncheck run`` does, into a temporary folder unless
``out`` is given, then judges the outputs as ``gdncheck verify`` does. A failure carries verify's own
short text per case: the first divergence, its message and the repro line.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from gdncheck.conformance.judge.records import CaseReport, Summary
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.packaged import default_suite
from gdncheck.untrusted import one_line, safe_text

__all__ = ["NonConformance", "assert_conforms", "case_text", "check_conformance"]

#: failing cases a NonConformance message shows in full (the rest are counted)
SHOWN = 5


class NonConformance(AssertionError):
    """An implementation does not conform: its message is verify's text of each failing case."""

    def __init__(self, message: str, summary: Summary):
        super().__init__(message)
        self.summary = summary


def case_text(c: CaseReport) -> str:
    """verify's console text of one case (``gdncheck verify`` prints the same lines; a failing case's
    likely cause when it was diagnosed): each piece a port wrote on one line, its control characters
    made visible (:mod:`gdncheck.untrusted`)."""
    if c.status == "pass":
        return f"pass  {c.id}"
    if c.status == "error":
        return f"ERROR {one_line(c.id)}: {one_line(c.problem)}"
    if c.status == "not_applicable":
        return f"n/a   {one_line(c.id)}: {one_line(c.message)}"
    cause = f"\n      likely cause: {safe_text((c.diagnosis or {}).get('text'))}" if c.diagnosis else ""
    return (f"FAIL  {c.id}: first divergence {c.first_divergence}\n      {one_line(c.message)}\n"
            f"      repro: {safe_text(c.repro)}{cause}")


def check_conformance(impl: str | Callable, profile: str = "f32", *, fixtures: str | Path | None = None,
                      out: str | Path | None = None, cases: list[str] | None = None, tags: list[str] | None = None,
                      stage_isolated: bool = False, options: Mapping | None = None) -> Summary:
    """Run ``impl`` (``MODULE:CALLABLE``, a built-in name or a factory) over the selected cases in
    ``profile`` and verify its outputs; the verify summary (``summary.exit_code``: 0, 1 or 2)."""
    fixtures = Path(fixtures) if fixtures is not None else default_suite()
    with tempfile.TemporaryDirectory(prefix="gdncheck-") as tmp:
        target = Path(out) if out is not None else Path(tmp)
        run_impl(impl, fixtures, target, profile, cases=cases, tags=tags, options=options,
                 stage_isolated=stage_isolated)
        return verify(fixtures, target, profile, cases=cases, tags=tags, stage_isolated=stage_isolated)


def assert_conforms(impl: str | Callable, profile: str = "f32", **kwargs) -> Summary:
    """:func:`check_conformance`, raising :class:`NonConformance` unless every selected case
    conforms (not applicable cases count neither way); returns the summary when it does."""
    summary = check_conformance(impl, profile, **kwargs)
    bad = [c for c in summary.cases if c.status in ("fail", "error")]
    if summary.exit_code != 0 or bad:
        t = summary.totals()
        head = (f"{summary.implementation.get('name')} does not conform in profile {profile} ({summary.mode}): "
                f"{t['failed']} of {t['cases']} case(s) fail, {t['errors']} unusable")
        shown = [case_text(c) for c in bad[:SHOWN]]
        more = [f"... and {len(bad) - SHOWN} more case(s)"] if len(bad) > SHOWN else []
        raise NonConformance("\n".join([head, *shown, *more]), summary)
    return summary
