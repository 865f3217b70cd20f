"""What the gate prints, and the JUnit XML and the report folder it writes.

:func:`gate_junit` is the JUnit document (docs/gate.md). :func:`format_result` is the compact table
(one row per profile, one for the properties), the cases not run and why, the first divergences and
the failing properties with their replay lines.
:func:`write_report` writes the report folder: ``summary.txt`` (that text), the HTML report of
each profile's verify summary (:func:`gdncheck.reports.write_report`) in ``REPORT/PROFILE/``, and an
``index.html`` that links them.
"""

from __future__ import annotations

from pathlib import Path

from markupsafe import Markup

from gdncheck.conformance.judge.records import FirstDivergence
from gdncheck.reports import write_report as html
from gdncheck.reports.junit import JUnit, add_verify_summary
from gdncheck.safetensors_io import write_bytes_atomic
from gdncheck.untrusted import safe_text

from .folders import REPORT_MARKER, fresh
from .plan import Skip

MAX_DIVERGENCES = 5  # per profile, on the console


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()


def format_table(doc: dict) -> str:
    head = ["profile", "cases", "pass", "fail", "unusable", "n/a", "tensors", "failed", "properties", "verdict"]
    rows = []
    props = (doc.get("properties") or {}).get("results", [])
    for p, v in (doc.get("profiles") or {}).items():
        t = v.get("totals") or {}
        pr = [r for r in props if r["profile"] == p]
        pcell = f"{sum(r['status'] == 'pass' for r in pr)}/{len(pr)}" if pr else "-"
        if any(r["status"] == "fail" for r in pr):
            pcell += f" ({sum(r['status'] == 'fail' for r in pr)} fail)"
        verdict = v["verdict"] if not any(r["status"] == "fail" for r in pr) else "does not conform"
        if v.get("known_failures"):
            n = len(v["known_failures"])
            verdict += f" ({n} known failure{'s' if n != 1 else ''})"
        rows.append([p, str(t.get("cases", 0)), str(t.get("passed", 0)), str(t.get("failed", 0)),
                     str(t.get("errors", 0)), str(t.get("not_applicable", 0)), str(t.get("records", 0)),
                     str(t.get("records_failed", 0)), pcell,
                     verdict])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join(_row(r, widths) for r in [head, *rows])


def format_result(doc: dict, *, verbose: bool = True) -> str:
    """The console text: every string that came from a port or a file is one line of visible
    characters (:func:`gdncheck.untrusted.safe_text`), so none can forge or hide a verdict line."""
    return "\n".join(safe_text(line) for line in _result_lines(doc, verbose))


def _result_lines(doc: dict, verbose: bool) -> list[str]:
    lines: list[str] = []
    if doc.get("reason") and doc["exit_code"] == 2 and not doc.get("profiles"):
        return [f"gdncheck gate: could not run: {doc['reason']}"]
    if doc.get("profiles"):
        lines.extend(format_table(doc).splitlines())
        for p, v in doc["profiles"].items():
            cov = v.get("coverage")
            if cov:
                lines.append(f"coverage {p}: {cov['judged']} of {cov['cases']} case(s) judged, {cov['not_applicable']} "
                             f"not applicable, {cov['tensors_judged']} tensor(s) judged"
                             + ("" if cov["ok"] else "; " + "; ".join(cov["problems"])))
    for note in doc.get("notes") or []:
        lines.append(f"note: {note}")
    for s in (doc.get("selection") or {}).get("skipped", []):
        lines.append(f"skipped {s['case']} ({', '.join(s['profiles'])}): {s['reason']}")
    for p, v in (doc.get("profiles") or {}).items():
        for f in v["failures"][:MAX_DIVERGENCES]:
            if f["status"] == "error":
                lines.append(f"UNUSABLE {p} {f['case']}: {f['message']}")
                continue
            lines.append(f"FAIL {p} {f['case']}: first divergence {FirstDivergence.from_json(f['first_divergence'])}")
            if verbose:
                lines += [f"     {f['message']}", f"     repro: {f['repro']}"]
                if f.get("likely_cause"):
                    lines.append(f"     likely cause: {f['likely_cause']}")
        if len(v["failures"]) > MAX_DIVERGENCES:
            lines.append(f"... and {len(v['failures']) - MAX_DIVERGENCES} more failing case(s) in {p}: {v['summary']}")
    for p, v in (doc.get("profiles") or {}).items():
        for k in v.get("not_applicable", []):
            lines.append(f"not applicable {p} {k['case']}: {k['reason']}")
        for k in v.get("known_failures", []):
            lines.append(f"known failure {p} {k['case']} ({', '.join(k['tensors'])}): {k['reason']}")
    for x in (doc.get("xfails") or {}).get("stale", []):
        lines.append(f"warning: stale known failure ({doc['xfails']['file']}:{x['line']}: {x['impl']} {x['profile']} "
                     f"{x['case']}): the case passes in {x['profile_run']} now; delete the entry")
    for x in (doc.get("xfails") or {}).get("unmatched", []):
        lines.append(f"warning: known failure ({doc['xfails']['file']}:{x['line']}: {x['impl']} {x['profile']} "
                     f"{x['case']}) matches no case of this run: {x['why']}")
    for x in (doc.get("xfails") or {}).get("refused", []):
        lines.append(f"known failure ({doc['xfails']['file']}:{x['line']}) does not excuse {x['profile_run']} "
                     f"{x['case']}: {x['why']} (the coverage rule)")
    for r in (doc.get("properties") or {}).get("results", []):
        if r["status"] == "fail":
            first = r["message"].splitlines()[0] if r["message"] else ""
            lines.append(f"FAIL property {r['name']} ({r['profile']}): {first}")
            if verbose:
                lines.extend(f"     {n}" for n in [*r["message"].splitlines()[1:], *r["notes"]])
                lines += [f"     blob: {r['blob']}", f"     replay: {r['replay']}"]
        elif r["status"] == "skip" and verbose:
            lines.append(f"skipped property {r['name']} ({r['profile']}): {r['message']}")
    return lines


def verdict_line(doc: dict) -> str:
    impl = doc.get("implementation") or {}
    sel = doc.get("selection") or {}
    timing = doc.get("timing") or {}
    where = f"{impl.get('spec')} on {impl.get('device', '?')}" + \
        (" (Triton interpreter)" if impl.get("interpreter") else "")
    parts = [f"gdncheck gate: {doc['verdict']} (exit {doc['exit_code']})", where]
    if sel:
        parts.append(f"{sel['run']} case(s) x {len(sel['profiles'])} profile(s)"
                     + (f", shard {sel['shard'][0]}/{sel['shard'][1]}" if sel.get("shard") else "")
                     + (f", {len(sel['skipped'])} skipped (listed above)" if sel.get("skipped") else ""))
    props = doc.get("properties") or {}
    if props.get("results"):
        t = props["totals"]
        parts.append(f"properties {t['pass']} pass, {t['fail']} fail, {t['skip']} skip "
                     f"({props['hypothesis_profile']}, {props['max_examples']} examples)")
    if timing.get("total_s") is not None:
        parts.append(f"{timing['total_s']:.0f} s")
    lines = ["; ".join(parts)]
    if doc.get("reason"):
        lines.append(f"reason: {doc['reason']}")
    outs = doc.get("outputs") or {}
    lines.append(f"summary: {outs.get('summary')}; junit: {', '.join(outs.get('junit') or [])}"
                 + (f"; report: {outs['report']}" if outs.get("report") else ""))
    return "\n".join(safe_text(line) for line in lines)


def html_report(summary_path: Path, out_dir: Path) -> list[Path]:
    """The HTML report of one verify summary (:func:`gdncheck.reports.write_report`); its index page."""
    return [Path(html(str(summary_path), out_dir))]


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:72rem;padding:0 1rem;
color:#1d2330;background:#fff}
h1{font-size:1.5rem;margin:0 0 .3rem}h2{font-size:1.1rem;margin:1.6rem 0 .5rem}
.meta{color:#5a6272;margin:0 0 1rem}
.badge{display:inline-block;padding:.15rem .6rem;border-radius:1rem;font-weight:600;color:#fff}
.conforms{background:#1f883d}.fail{background:#cf222e}.unusable{background:#9a6700}.none{background:#6e7781}
table{border-collapse:collapse;width:100%;margin:.3rem 0 1rem}
th,td{border:1px solid #d0d7de;padding:.35rem .6rem;text-align:right}
th{background:#f6f8fa}td:first-child,th:first-child,td.text{text-align:left}
td.verdict{color:#fff;font-weight:600;text-align:center}
ul.fail li{margin:.3rem 0}code{font-size:12px;background:#f6f8fa;padding:.1rem .3rem;border-radius:4px;
word-break:break-all}
details{margin-top:1.5rem}pre{background:#f6f8fa;padding:1rem;overflow:auto;font-size:12px}
"""


def _verdict_class(code: int | None) -> str:
    return {0: "conforms", 1: "fail", 2: "unusable"}.get(code, "none")


def index_page(doc: dict, text: str, pages: dict[str, Path], report_dir: Path) -> str:
    """REPORT/index.html: the verdict, a grid of profiles (cases, tensors, properties, verdict) linking
    each profile's report, the first divergences, failing properties, and the console text; rendered
    from ``reports/templates/gate.html.j2`` with the reports' Jinja environment (autoescaped)."""
    from gdncheck.reports.site import environment

    impl = doc.get("implementation") or {}
    sel = doc.get("selection") or {}
    props = (doc.get("properties") or {}).get("results", [])
    rows = []
    for name, v in (doc.get("profiles") or {}).items():
        t = v.get("totals") or {}
        pr = [r for r in props if r["profile"] == name]
        pfail = sum(r["status"] == "fail" for r in pr)
        pcell = f"{sum(r['status'] == 'pass' for r in pr)}/{len(pr)}" + (f" ({pfail} fail)" if pfail else "") \
            if pr else "-"
        code = max(v.get("exit_code", 0), 1 if pfail else 0)
        rows.append({"name": name, "href": pages[name].relative_to(report_dir).as_posix() if name in pages else None,
                     "cells": [str(t.get(k, 0)) for k in ("cases", "passed", "failed", "errors", "not_applicable",
                                                          "records", "records_failed")],
                     "properties": pcell, "cls": _verdict_class(code),
                     "verdict": v["verdict"] if not pfail else "does not conform"})
    failures = []
    for name, v in (doc.get("profiles") or {}).items():
        for f in v.get("failures", []):
            where = (str(FirstDivergence.from_json(f["first_divergence"])) if f.get("first_divergence")
                     else "inputs unusable")
            failures.append({"profile": name, "what": f["case"], "where": where, "message": f.get("message") or "",
                             "repro": f.get("repro")})
    for r in props:
        if r["status"] == "fail":
            first = r["message"].splitlines()[0] if r.get("message") else ""
            failures.append({"profile": r["profile"], "what": f"property {r['name']}", "where": first,
                             "message": "", "repro": r.get("replay")})
    where = f"{impl.get('spec')} on {impl.get('device', '?')}" + (" (Triton interpreter)" if impl.get("interpreter")
                                                                  else "")
    return environment().get_template("gate.html.j2").render(
        verdict=doc["verdict"], verdict_class=_verdict_class(doc.get("exit_code")), style=Markup(_STYLE),
        where=where, run=sel.get("run", 0), reason=doc.get("reason"), merged=doc.get("merged", []),
        cols=["profile", "cases", "pass", "fail", "unusable", "n/a", "tensors", "failed", "properties", "verdict"],
        rows=rows, failures=failures, skipped=sel.get("skipped", []), text=text)


def write_report(report_dir: Path, doc: dict, summaries: dict) -> list[Path]:
    """``summary.txt`` (the console text), each profile's HTML report in ``PROFILE/`` and an
    ``index.html`` that links them. A report that fails is a warning, never a lost verdict."""
    fresh(report_dir, REPORT_MARKER, "--report")  # the gate's own folder, replaced whole; anything else refused
    files, pages, problems = [], {}, []
    for p in summaries:
        try:
            made = html_report(Path(doc["profiles"][p]["summary"]), report_dir / p)
        except Exception as exc:  # noqa: BLE001 - a report failure must not hide the verdict
            problems.append(f"the HTML report of {p} failed: {type(exc).__name__}: {exc}")
            continue
        pages[p] = made[0]
        files.extend(made)
    doc.setdefault("notes", []).extend(problems)
    text = f"{verdict_line(doc)}\n\n{format_result(doc)}\n" + "".join(f"warning: {m}\n" for m in problems)
    files.insert(0, write_bytes_atomic(report_dir / "summary.txt", text.encode()))
    files.insert(1, write_bytes_atomic(report_dir / "index.html", index_page(doc, text, pages, report_dir).encode()))
    return files


def gate_junit(doc: dict, summaries: dict, known: dict, case_seconds: dict) -> JUnit:
    """The gate's JUnit document: fixtures check, every profile's cases by stage group (the verify
    summaries; ``known`` and ``case_seconds`` per profile), properties."""
    junit = JUnit("gdncheck gate")
    fx = doc.get("fixtures")
    if doc["exit_code"] == 2 and doc.get("reason") and not summaries:
        junit.case("gate", "gate", "setup", error=(doc["reason"], doc["reason"]))
    if fx:
        junit.case("fixtures", "fixtures", "checksums", output=f"{fx['cases']} case files match the manifest")
        if fx["rebuild"] == "not checked":
            junit.case("fixtures", "fixtures", "rebuild", skipped="not checked (a suite other than the committed one)")
        else:
            junit.case("fixtures", "fixtures", "rebuild", output=fx["rebuild"])
    skipped = [Skip(**s) for s in (doc.get("selection") or {}).get("skipped", [])]
    for p, summary in summaries.items():
        add_verify_summary(junit, summary, skipped=skipped, known=known.get(p), case_seconds=case_seconds.get(p))
    for p, v in (doc.get("profiles") or {}).items():
        if p not in summaries and v.get("verdict") == "nothing judged":
            junit.case(f"conformance.{p}", f"conformance.{p}", "coverage",
                       error=("nothing judged: every selected case was skipped", "nothing judged: every selected "
                              "case was skipped (a run that judged nothing never conforms)"))
    for r in (doc.get("properties") or {}).get("results", []):
        suite, cls = f"properties.{r['profile']}", f"properties.{r['profile']}.{r['chapter']}"
        if r["status"] == "fail":
            text = "\n".join([r["message"], *r["notes"], f"blob: {r['blob']}", f"replay: {r['replay']}"])
            junit.case(suite, cls, r["name"], seconds=r["seconds"],
                       failure=(r["message"].splitlines()[0] if r["message"] else "property failed", "property", text))
        elif r["status"] == "skip":
            junit.case(suite, cls, r["name"], seconds=r["seconds"], skipped=r["message"])
        else:
            junit.case(suite, cls, r["name"], seconds=r["seconds"], output=f"{r['examples']} example(s)")
    return junit
