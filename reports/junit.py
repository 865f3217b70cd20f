"""JUnit XML of a gate or verify run, in the shape CI publishers read (Jenkins, GitLab, the
``publish-unit-test-result`` and ``test-reporter`` GitHub actions, junitparser).

``<testsuites>`` holds one ``<testsuite>`` per profile (``conformance.PROFILE``) and one per
profile of the property suite (``properties.PROFILE``), plus ``fixtures`` for the fixture check.
A case gives one ``<testcase>`` per stage group it has records in (``classname`` =
``conformance.PROFILE.CASE``, ``name`` = the stage, or ``state``/``snapshot``), ``expected_error``
for an error case, and one ``<testcase name="case">`` with ``<error>`` when its inputs were
unusable, or ``<skipped>`` when the gate did not run it or the implementation reported it not
applicable (the reason is the message). A failing stage
carries ``<failure message=... type=REASON>`` with every failing record's message and the repro.
A stage whose tensors the implementation did not provide is ``<skipped>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from gdncheck.safetensors_io import write_bytes_atomic
from gdncheck.untrusted import safe_text

MAX_TEXT = 20000  # characters of failure text per testcase (CI pages choke on megabytes)


def _clip(text: str) -> str:
    """Text XML can hold and a CI page can show: control characters escaped (the one function every
    console and file output uses, :func:`gdncheck.untrusted.safe_text`), line breaks kept, clipped."""
    text = safe_text(text, keep_newlines=True)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"\n... ({len(text) - MAX_TEXT} characters more)"


class JUnit:
    """Collects test suites and writes one XML document."""

    def __init__(self, name: str = "gdncheck"):
        self.root = ET.Element("testsuites", name=name)
        self.suites: dict[str, ET.Element] = {}

    def suite(self, name: str) -> ET.Element:
        if name not in self.suites:
            self.suites[name] = ET.SubElement(self.root, "testsuite", name=name)
        return self.suites[name]

    def case(self, suite: str, classname: str, name: str, *, seconds: float = 0.0, failure: tuple[str, str, str]
             | None = None, error: tuple[str, str] | None = None, skipped: str | None = None,
             output: str | None = None) -> None:
        """One testcase; ``failure`` = (message, type, text), ``error`` = (message, text)."""
        tc = ET.SubElement(self.suite(suite), "testcase", classname=classname, name=name, time=f"{seconds:.3f}")
        if failure:
            el = ET.SubElement(tc, "failure", message=_clip(failure[0])[:2000], type=failure[1])
            el.text = _clip(failure[2])
        elif error:
            el = ET.SubElement(tc, "error", message=_clip(error[0])[:2000], type="error")
            el.text = _clip(error[1])
        elif skipped is not None:
            ET.SubElement(tc, "skipped", message=_clip(skipped)[:2000])
        if output:
            ET.SubElement(tc, "system-out").text = _clip(output)

    def _count(self) -> None:
        totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        total_time = 0.0
        for s in self.root:
            cases = list(s.iter("testcase"))
            counts = {"tests": len(cases),
                      "failures": sum(tc.find("failure") is not None for tc in cases),
                      "errors": sum(tc.find("error") is not None for tc in cases),
                      "skipped": sum(tc.find("skipped") is not None for tc in cases)}
            t = sum(float(tc.get("time", "0")) for tc in cases)
            for k, v in counts.items():
                s.set(k, str(v))
                totals[k] += v
            s.set("time", f"{t:.3f}")
            total_time += t
        for k, v in totals.items():
            self.root.set(k, str(v))
        self.root.set("time", f"{total_time:.3f}")

    def tostring(self) -> bytes:
        self._count()
        ET.indent(self.root)
        return b'<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(self.root, encoding="utf-8") + b"\n"

    def write(self, path: str | Path) -> Path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return write_bytes_atomic(path, self.tostring())


def stage_groups(records: Iterable) -> dict[str, list]:
    """Records by stage group: the stage (``seq_len`` records as ``state``), saved snapshots as ``snapshot``."""
    groups: dict[str, list] = {}
    for r in records:
        key = "snapshot" if r.op == "save" else (r.stage or "state")
        groups.setdefault(key, []).append(r)
    return groups


def add_verify_summary(junit: JUnit, summary, *, suite: str | None = None, case_seconds: dict | None = None,
                       skipped: Iterable = (), known: dict[str, str] | None = None) -> None:
    """The testcases of one verify :class:`~gdncheck.conformance.judge.records.Summary` (one profile).
    ``known``: case id -> reason, for known failures (their failing stages are ``<skipped>``)."""
    known = known or {}
    profile = summary.profile
    suite = suite or f"conformance.{profile}"
    case_seconds = case_seconds or {}
    for c in summary.cases:
        cls = f"conformance.{profile}.{c.id}"
        secs = case_seconds.get(c.id, 0.0)
        repro = f"\nrepro: {c.repro}" if c.repro else ""
        if c.diagnosis:  # the likely cause at the first divergence (advice, conformance/judge/diagnose.py)
            repro = f"\nlikely cause: {c.diagnosis.get('text')}{repro}"
        if c.status == "error":
            junit.case(suite, cls, "case", seconds=secs, error=(c.problem or "inputs unusable",
                                                                 f"{c.problem}{repro}"))
            continue
        if c.kind == "error":
            ec = c.error_check or {}
            failure = None
            if c.status == "fail":
                failure = (c.message or "wrong error", getattr(c.first_divergence, "reason", None) or "error_expected",
                           f"{c.message}{repro}")
            junit.case(suite, cls, "expected_error", seconds=secs, failure=failure,
                       output=f"expected {ec.get('expected')}, got {ec.get('actual')} ({ec.get('match')})")
            continue
        groups = stage_groups(c.records)
        if c.status == "not_applicable":
            na = c.not_applicable or {}
            junit.case(suite, cls, "case", seconds=secs,
                       skipped=f"not applicable: {na.get('reason') or c.message} (from step {na.get('step')})")
        if c.status == "fail" and not groups:  # raised before any record
            junit.case(suite, cls, "case", seconds=secs,
                       failure=(c.message or "failed", getattr(c.first_divergence, "reason", None) or "fail",
                                f"{c.message}{repro}"))
            continue
        share = secs / max(1, len(groups))
        for stage, recs in groups.items():
            bad = [r for r in recs if r.verdict == "fail"]
            if bad and c.id in known:
                junit.case(suite, cls, stage, seconds=share, skipped=f"known failure: {known[c.id]}",
                           output="\n".join(r.message or r.tensor for r in bad))
            elif bad:
                text = "\n".join(r.message or f"{r.tensor}: {r.reason}" for r in bad) + repro
                junit.case(suite, cls, stage, seconds=share, failure=(bad[0].message or bad[0].reason or "fail",
                                                                       bad[0].reason or "fail", text))
            elif all(r.verdict == "missing" for r in recs):
                junit.case(suite, cls, stage, seconds=share,
                           skipped="not provided by the implementation: " + ", ".join(sorted({r.tensor for r in recs})))
            else:
                n = sum(r.verdict == "pass" for r in recs)
                junit.case(suite, cls, stage, seconds=share, output=f"{n} tensor record(s) within bounds")
    for s in skipped:
        if profile in s.profiles:
            junit.case(suite, f"conformance.{profile}.{s.case}", "case", skipped=s.reason)
    cov = summary.coverage()
    text = summary.coverage_line()
    if cov["ok"]:
        junit.case(suite, f"conformance.{profile}", "coverage", output=text)
    else:
        junit.case(suite, f"conformance.{profile}", "coverage",
                   failure=("coverage: " + "; ".join(cov["problems"]), "coverage", text))
