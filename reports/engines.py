"""The cross-engine conformance matrix (``gdncheck engines``) as a Markdown page and an HTML view.

Both read the matrix document the command writes (``matrix.json``) and nothing else. The Markdown has two
generated blocks between markers: the stable one (what each engine passes, fails and cannot express,
every finding and its class: what a test compares with the committed docs/engines.md) and the one of
this run (versions, worst ratios, timings, where the summaries are). ``gdncheck engines --markdown FILE``
replaces only those blocks of a FILE that has them, so a hand-written header stays. The HTML comes from
``templates/engines.html.j2`` with autoescaping on: every string from an engine (a reason, a message) is
shown as text.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

STABLE_BEGIN = "<!-- BEGIN gdncheck engines: matrix (generated; counts and classes, compared by tests) -->"
STABLE_END = "<!-- END gdncheck engines: matrix -->"
RUN_BEGIN = "<!-- BEGIN gdncheck engines: this run (generated; versions, ratios, timings) -->"
RUN_END = "<!-- END gdncheck engines: this run -->"

CLASS_TEXT = {"deviation": "deviation", "convention": "convention", "missing_feature": "missing feature",
              "engine_crash": "engine crash", "unusable": "unusable"}


def repro_href(repro: str | None, link_dir: str | Path | None) -> str | None:
    """A repro script's link from a page in ``link_dir``: relative to it where the page lies in a checkout
    holding the script (the page's own: never one that climbs into another checkout, such as the one gdncheck
    runs from, which exists only on the machine that wrote the page), else the path from the repository root."""
    if not repro:
        return None
    if link_dir is None:
        return repro
    here = Path(link_dir).resolve()
    for root in (here, *here.parents):
        if (root / repro).is_file():
            return Path(os.path.relpath(root / repro, here)).as_posix()
    return repro


def _cell(text: Any) -> str:
    """Markdown table cell: one line, no bare pipe."""
    return " ".join(str("—" if text is None else text).split()).replace("|", "\\|")


def adjudication_text(f: dict) -> str:
    """One line for a finding's adjudication, from the summary (stable: no ratio digits beyond two)."""
    a = f.get("adjudication") or {}
    kind = a.get("kind")
    if kind in ("tensor", "routing"):
        if a.get("nan"):  # the ratio is over the finite elements only: NaN is said as NaN
            ratio = f"NaN in {a['nan']}" + (f" of {a['numel']} elements" if a.get("numel") else " element(s)")
        else:
            ratio = f"{a['ratio']:.2g}× bound ({a.get('measure')})" if isinstance(a.get("ratio"), float) else "no ratio"
        text = f"call {a.get('call')}, stage {a.get('stage')}, tensor {a.get('tensor')}: {ratio}"
        return text + (f"; likely cause: {a['likely_cause']}" if a.get("likely_cause") else "")
    if kind == "error_check":
        did = ("raised nothing" if a.get("actual") is None
               else f"raised {a.get('actual')} at step {a.get('actual_step')}")
        return f"expected {a.get('expected')} at step {a.get('step')}, {did}"
    if kind == "crash":
        return (f"{a.get('exception')} at step {a.get('step')}"
                + (f" (mapped to {a.get('code')}, accepted: {a.get('accepted_as')})" if a.get("accepted_as") else ""))
    if kind == "raised":
        return f"raised {a.get('code')} at step {a.get('step')} ({a.get('op')})"
    if kind == "routing_tie":
        return f"exact ties resolved to the {a.get('choice')} ({a.get('tokens')} token(s), {a.get('calls')} call(s))"
    if kind in ("not_applicable", "nothing_judged", "required_not_applicable"):
        return f"{kind.replace('_', ' ')} from step {a.get('step')} ({a.get('op')})"
    return kind or "—"


def machine_dependent(f: dict) -> bool:
    """A finding another machine may not see: a passing case's routing-tie convention (which of exactly tied
    experts a top-k keeps is left to a C++ library or a SIMD path). The stable block leaves it out; the run
    block lists it."""
    return f.get("class") == "convention" and f.get("status") == "pass" and \
        (f.get("adjudication") or {}).get("kind") == "routing_tie"


def stable_block(matrix: dict, link_dir: str | Path | None) -> str:
    lines = [STABLE_BEGIN, "", "| engine | how judged | profile | cases | pass | fail | n/a | findings | unexplained |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in matrix["engines"]:
        judged = e["judged"].replace("_", "-")
        if e["status"] != "ran":
            lines.append(f"| {e['name']} | {judged} | {', '.join(e['profiles'])} | {_cell(e['problem'])} "
                         f"| | | | | |")
            continue
        for p in e["profiles_run"]:
            r = e["results"][p]
            if r["status"] != "ran":
                lines.append(f"| {e['name']} | {judged} | {p} | {_cell(r['problem'])} | | | | | |")
                continue
            c = r["counts"]
            stable = [f for f in r.get("findings", []) if not machine_dependent(f)]
            by = ", ".join(f"{n} {CLASS_TEXT[k]}" for k in CLASS_TEXT
                           if (n := sum(f["class"] == k for f in stable))) or "none"
            lines.append(f"| {e['name']} | {judged} | {p} | {c['cases']} | {c['pass']} | {c['fail']} "
                         f"| {c['not_applicable']} | {by} | {r['unexplained']} |")
    lines += ["", "Findings (every case that is no clean pass, but for the not applicable ones, listed after):", "",
              "| engine | profile(s) | case | status | class | adjudication (float64) | explanation | repro |",
              "|---|---|---|---|---|---|---|---|"]
    na_rows: dict[tuple, list[str]] = {}
    rows: dict[tuple, list[str]] = {}
    for e in matrix["engines"]:
        for p in e.get("profiles_run", []):
            r = e["results"][p]
            for f in r.get("findings", []) if r["status"] == "ran" else []:
                if machine_dependent(f):  # in the run block: another machine may not see it
                    continue
                if f["status"] == "not_applicable" and not f["unexplained"]:
                    key = (e["name"], f["case"], f.get("detail"))
                    na_rows.setdefault(key, []).append(p)
                    continue
                expl = f.get("explanation") or ("**unexplained**: " + (f.get("mismatch") or "no FINDINGS entry"))
                href = repro_href(f.get("repro"), link_dir)
                repro = f"[{Path(f['repro']).name}]({href})" if href else "—"
                status = f["status"] + (f" (verify: {f['verify_status']})" if f.get("verify_status") else "")
                key = (e["name"], f["case"], status, f["class"], adjudication_text(f), expl, repro)
                rows.setdefault(key, []).append(p)
    for (name, case, status, cls, adj, expl, repro), profiles in rows.items():
        lines.append(f"| {name} | {', '.join(profiles)} | {_cell(case)} | {status.replace('_', ' ')} "
                     f"| {CLASS_TEXT[cls]} | {_cell(adj)} | {_cell(expl)} | {repro} |")
    if not rows:
        lines.append("| — | | | | | | | |")
    lines += ["", "Not applicable (class missing feature: what the engine cannot express, the reason as its adapter "
              "declares it):", "", "| engine | profile(s) | case | reason |", "|---|---|---|---|"]
    for (name, case, reason), profiles in na_rows.items():
        lines.append(f"| {name} | {', '.join(profiles)} | {_cell(case)} | {_cell(reason)} |")
    if not na_rows:
        lines.append("| — | | | |")
    lines += ["", STABLE_END]
    return "\n".join(lines)


def code_span(text: Any) -> str:
    """``text`` as one Markdown code span on one line, whatever backticks it holds (CommonMark: a fence of
    more backticks than its longest run, padded with a space where it starts or ends with one)."""
    text = " ".join(str(text).split())
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def conventions_text(result: dict) -> str:
    """The conventions a run showed (a routing tie resolved to the higher index, ...), for its table row."""
    if result.get("status") != "ran":
        return "—"
    parts = [f"{c['kind'].replace('_', ' ')}: {c['choice']} ({len(c['cases'])} case(s))"
             for c in result.get("conventions", [])]
    return "; ".join(parts) or "none"


def run_block(matrix: dict) -> str:
    lines = [RUN_BEGIN, "", f"Generated by {code_span(matrix['command'])} with gdncheck {matrix['tool']['version']} in "
             f"{matrix['seconds']:.0f} s; fixtures {code_span(matrix['fixtures']['suite'])} (manifest sha256 "
             f"{str(matrix['fixtures']['manifest_sha256'])[:12]}…).", "",
             "| engine | versions | profile | worst passing ratio (error / bound) | at | conventions | time |",
             "|---|---|---|---|---|---|---|"]
    for e in matrix["engines"]:
        versions = ", ".join(f"{k} {v}" for k, v in e.get("versions", {}).items() if v) or "—"
        if e["status"] != "ran":
            lines.append(f"| {e['name']} | {_cell(versions)} | — | — | — | — | — |")
            continue
        for p in e["profiles_run"]:
            r = e["results"][p]
            w = r.get("worst_ratio")
            at = f"{w['case']} call {w['call']} {w['stage']}/{w['tensor']}" if w else "—"
            ratio = f"{w['ratio']:.3g} ({w['measure']})" if w else "—"
            lines.append(f"| {e['name']} | {_cell(versions)} | {p} | {ratio} | {_cell(at)} "
                         f"| {_cell(conventions_text(r))} | {r.get('seconds', 0):.1f} s |")
    seen = [(e["name"], p, f) for e in matrix["engines"] if e["status"] == "ran" for p in e["profiles_run"]
            if e["results"][p]["status"] == "ran" for f in e["results"][p].get("findings", []) if machine_dependent(f)]
    lines += ["", "Conventions seen on this machine (a tie order left to a C++ library or a SIMD path: another "
              "machine may resolve the same ties otherwise, and conform just the same):", ""]
    lines += [f"- {name} {p}, {f['case']}: {adjudication_text(f)}" for name, p, f in seen] or ["- none"]
    lines += ["", RUN_END]
    return "\n".join(lines)


HEADER = """# Cross-engine conformance matrix

Written by `gdncheck engines` (docs/engines.md describes the command, the engines and the classes).
"""


def render_markdown(matrix: dict, link_dir: str | Path | None = None) -> str:
    return f"{HEADER}\n{stable_block(matrix, link_dir)}\n\n{run_block(matrix)}\n"


def marker_problem(text: str) -> str | None:
    """Why ``text`` is no page whose generated blocks this command may replace (None: it is one, or it is
    blank): each block's two marker lines once, BEGIN before END, the stable block required."""
    if not text.strip():
        return None
    found = []
    for begin, end, what in ((STABLE_BEGIN, STABLE_END, "matrix"), (RUN_BEGIN, RUN_END, "this run")):
        nb, ne = text.count(begin), text.count(end)
        if what == "this run" and nb == ne == 0:
            continue
        if nb != 1 or ne != 1:
            return (f"expected the generated block '{what}' between one BEGIN and one END marker line, found "
                    f"{nb} BEGIN and {ne} END")
        if text.index(end) < text.index(begin):
            return f"expected the generated block '{what}' BEGIN marker before its END marker, found them the other way"
        found.append((text.index(begin), text.index(end)))
    if len(found) == 2 and not (found[0][1] < found[1][0] or found[1][1] < found[0][0]):
        return "expected the generated blocks one after the other, found one inside the other"
    return None


def update_markdown(existing: str | None, matrix: dict, link_dir: str | Path | None = None) -> str:
    """``existing`` with its two generated blocks replaced (its other text kept), or the whole page when it
    is blank or absent. A page :func:`marker_problem` refuses is never given here (the command refuses it
    before anything runs: its text would be lost)."""
    if not existing or not existing.strip():
        return render_markdown(matrix, link_dir)
    problem = marker_problem(existing)
    if problem:
        raise ValueError(problem)
    text = _replace(existing, STABLE_BEGIN, STABLE_END, stable_block(matrix, link_dir))
    if RUN_BEGIN in text and RUN_END in text:
        return _replace(text, RUN_BEGIN, RUN_END, run_block(matrix))
    return text.rstrip("\n") + "\n\n" + run_block(matrix) + "\n"


def _replace(text: str, begin: str, end: str, block: str) -> str:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + block + tail


def stable_part(text: str) -> str | None:
    """The stable generated block of a page (markers included), or None when it has none."""
    if STABLE_BEGIN not in text or STABLE_END not in text:
        return None
    return STABLE_BEGIN + text.split(STABLE_BEGIN, 1)[1].split(STABLE_END, 1)[0] + STABLE_END


def render_html(matrix: dict, link_dir: str | Path | None = None) -> str:
    env = Environment(loader=FileSystemLoader(str(Path(__file__).with_name("templates"))), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["adjudication"] = adjudication_text
    env.filters["href"] = lambda repro: repro_href(repro, link_dir)
    env.filters["cls"] = lambda c: CLASS_TEXT.get(c, c)
    return env.get_template("engines.html.j2").render(m=matrix)
