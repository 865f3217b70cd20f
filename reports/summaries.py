"""Short summaries of a verify summary: plain text for CI logs, Markdown for a CI job summary
(``$GITHUB_STEP_SUMMARY``).

Strings from a port's files are made harmless for each: control characters (ANSI escapes, line
breaks, carriage returns) are shown as escapes in the text (``\x1b``, ``\n``); in Markdown every
value is HTML-escaped and its Markdown punctuation backslash-escaped (:func:`md_escape`), through
the template's ``finalize`` hook, so no value can open a tag, a link or a table cell.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from gdncheck.untrusted import safe_text

from .model import build, fmt_num, load_summary

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]|~!<>])")  # not '#': it only counts at a line's start, and in &#x27;


def plain(value) -> str:
    """One line of visible text: control characters (escape sequences, line breaks, carriage returns)
    shown as escapes (:func:`gdncheck.untrusted.safe_text`, the one function every output uses)."""
    return safe_text(value)


class Md(str):
    """Markdown written by the template itself, passed through unescaped."""


def md_escape(value) -> str:
    """A value as inert Markdown text: HTML-escaped, Markdown punctuation backslash-escaped, one line."""
    if isinstance(value, Md):
        return value
    if value is None:
        return "—"
    text = html.escape(plain(value), quote=True)
    return _MD_SPECIAL.sub(r"\\\1", text)


def _pre(value) -> Md:
    """Inside ``<pre>``: HTML-escaped only (Markdown is not parsed there)."""
    if value is None:
        return Md("—")
    return Md(html.escape(plain(value), quote=True))


def _ratio(r) -> str:
    f = r.rank_figures  # a sharded record: its rank's error and the share's NMSE, each against its bound
    if f is not None:
        parts = [f"err {fmt_num(f['max_err'])} = ×{fmt_num(f['elem_ratio'])} the bound {fmt_num(f['elem_bound'])}"
                 if f["elem_ratio"] is not None else "",
                 f"NMSE {fmt_num(f['nmse'])} = ×{fmt_num(f['nmse_ratio'])} the bound {fmt_num(f['nmse_bound'])}"
                 if f["nmse_ratio"] is not None else ""]
        return ", ".join(p for p in parts if p)
    m, b = r.metrics or {}, r.bound or {}
    if m.get("max_err") is None or not b.get("elem"):
        return ""
    return f"err {fmt_num(m['max_err'])} = ×{fmt_num(m['max_err'] / b['elem'])} the bound {fmt_num(b['elem'])}"


def _first_records(view) -> dict[str, object]:
    return {c.id: next((r for r in c.records if r.first), None) for c in view.cases}


def text_summary(summary: str | Path | dict, *, report: str | Path | None = None, max_cases: int = 20) -> str:
    """A few lines for a CI log: the verdict, where cases first diverge, one line per failing case."""
    doc = load_summary(summary)
    view = build(doc)
    t = doc["totals"]
    imp = doc["implementation"]
    mode = doc["mode"] + (", end-to-end bounds (fused)" if doc.get("bounds") else "")
    lines = [plain(f"gdncheck: {doc['verdict'].upper()} — {t['failed']} of {t['cases']} cases fail, {t['errors']} "
                   f"unusable; {t['records_failed']} of {t['records']} tensors fail [{imp.get('name')}, profile "
                   f"{doc['profile']}, {mode}]")]
    if view.first_stages:
        lines.append(plain("first diverging stage: " + ", ".join(f"{s} ({n} case{'s' if n != 1 else ''})"
                                                                for s, n in view.first_stages)))
    firsts = _first_records(view)
    bad = [c for c in view.cases if c.status != "pass"]
    for c in bad[:max_cases]:
        if c.status == "error":
            lines.append(plain(f"ERROR {c.id}: {c.raw.get('problem')}"))
            continue
        if c.status == "not_applicable":
            lines.append(plain(f"n/a   {c.id}: {c.raw.get('message')}"))
            continue
        r = firsts.get(c.id)
        extra = f"; {_ratio(r)}" if r is not None and _ratio(r) else ""
        lines.append(plain(f"FAIL  {c.id}: {c.first_text or c.raw.get('message')}{extra}"))
        if c.raw.get("diagnosis"):
            lines.append(plain(f"      likely cause: {c.raw['diagnosis'].get('text')}"))
    if len(bad) > max_cases:
        lines.append(f"... and {len(bad) - max_cases} more failing, unusable or not applicable cases")
    if doc.get("coverage") and not doc["coverage"]["ok"]:
        lines.append(plain("coverage: " + "; ".join(doc["coverage"]["problems"])))
    if report is not None:
        lines.append(plain(f"report: {report}"))
    return "\n".join(lines) + "\n"


def markdown_environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(Path(__file__).with_name("templates"))), autoescape=False,
                      finalize=md_escape, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      keep_trailing_newline=True)
    env.filters["pre"] = _pre
    env.filters["num"] = lambda v: Md(md_escape(fmt_num(v)))
    env.filters["md"] = Md  # only for text the template builds from its own literals
    return env


def markdown_summary(summary: str | Path | dict, *, report: str | None = None, max_cases: int = 50) -> str:
    """Markdown for a CI job summary: verdict, facts, first diverging stages, a table of failing cases
    with their first divergence, and each one's message and repro in a collapsed block."""
    doc = load_summary(summary)
    view = build(doc)
    firsts = _first_records(view)
    bad = [c for c in view.cases if c.status != "pass"]
    rows = []
    for c in bad[:max_cases]:
        r = firsts.get(c.id)
        rows.append({"case": c, "where": c.first_text if c.status == "fail" else
                     c.raw.get("problem") or c.raw.get("message"),
                     "ratio": _ratio(r) if r is not None else "",
                     "message": c.raw.get("message") or c.raw.get("problem"), "repro": c.raw.get("repro"),
                     "cause": (c.raw.get("diagnosis") or {}).get("text") or ""})
    text = markdown_environment().get_template("summary.md.j2").render(
        s=doc, view=view, rows=rows, more=max(0, len(bad) - max_cases), report=report)
    return text
