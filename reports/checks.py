"""What the report refuses in a verify summary before drawing anything, and what it redoes itself.

A summary is a file: it may have been edited, forged or damaged after verify wrote it. The report
(:func:`gdncheck.reports.model.load_summary`) therefore

- refuses a case id given twice (:func:`refuse_duplicate_ids`), before the schema check (which on a
  large file takes minutes): every case page is named by its id;
- refuses a headline the cases contradict (:func:`refuse_contradictions`): the totals are counted
  again from the cases, and the verdict and exit code may never be better than the cases allow (a
  failing case that is no known failure is never "conforms"; an unusable case is exit 2; a run that
  judged nothing of the port, or whose coverage is not met, never exit 0; a passing case holds no
  failing record);
- shows a repro line only as gdncheck writes one (:func:`checked_repros`: the words of
  ``gdncheck run`` / ``gdncheck verify`` and their options, quoted again); any other text in a
  summary's ``repro`` is withheld, never shown as a command to paste.

Each refusal is a :class:`~gdncheck.reports.model.ReportInputError`: exit 2, one line.
"""

from __future__ import annotations

from collections import Counter

from gdncheck.conformance.judge.messages import checked_repro
from gdncheck.untrusted import one_line

#: verify's exit code -> the verdicts it writes (fixtures: conformance/judge/records.py ``Summary.verdict``)
VERDICTS = {0: ("conforms",), 1: ("does not conform",), 2: ("inputs unusable", "nothing judged")}


def refuse_duplicate_ids(doc: dict, error) -> None:
    """``error(message)`` for a summary naming a case id more than once (verify writes each once)."""
    cases = doc.get("cases")
    if not isinstance(cases, list):
        return
    ids = Counter(c.get("id") for c in cases if isinstance(c, dict) and isinstance(c.get("id"), str))
    twice = [(cid, n) for cid, n in ids.items() if n > 1]
    if twice:
        cid, n = twice[0]
        raise error(f"expected each case once in a verify summary, found case id {one_line(cid, 120)!r} {n} times"
                    + (f" (and {len(twice) - 1} more id(s) repeated)" if len(twice) > 1 else "")
                    + ": not a summary verify wrote (it names each case once)")


def _counted(cases: list[dict]) -> dict:
    recs = [r for c in cases for r in c.get("records", [])]
    return {"cases": len(cases),
            "passed": sum(c["status"] == "pass" for c in cases),
            "failed": sum(c["status"] == "fail" for c in cases),
            "errors": sum(c["status"] == "error" for c in cases),
            "not_applicable": sum(c["status"] == "not_applicable" for c in cases),
            "records": len(recs),
            "records_failed": sum(r.get("verdict") == "fail" for r in recs),
            "records_missing": sum(r.get("verdict") == "missing" for r in recs)}


def _own_check(case: dict) -> bool:
    """A case answered by gdncheck's own config parser (the port never called): it judges no port."""
    return case.get("kind") == "error" and (case.get("error_check") or {}).get("raised_by") == "gdncheck"


def worst_exit(doc: dict) -> tuple[int, str]:
    """The best exit code the summary's cases allow, and why it is not better (verify's rules)."""
    cases = doc["cases"]
    errors = [c["id"] for c in cases if c["status"] == "error"]
    if errors:
        return 2, f"{len(errors)} case(s) unusable (e.g. {errors[0]})"
    if not [c for c in cases if c["status"] in ("pass", "fail") and not _own_check(c)]:
        return 2, "no case of the port judged"
    known = {k.get("case") for k in (doc.get("xfails") or {}).get("known_failures") or [] if isinstance(k, dict)}
    failing = [c["id"] for c in cases if c["status"] == "fail" and c["id"] not in known]
    if failing:
        return 1, f"{len(failing)} case(s) fail (e.g. {failing[0]})"
    if (doc.get("coverage") or {}).get("ok") is False:  # never a pass: how verify says so is its own rule
        return 1, "its coverage is not met (" + one_line("; ".join(doc["coverage"].get("problems") or []), 300) + ")"
    return 0, "every judged case passes"


def refuse_contradictions(doc: dict, error) -> None:
    """``error(message)`` for a summary whose headline (totals, verdict, exit code) its cases contradict."""
    for c in doc["cases"]:
        if c["status"] == "pass" and any(r.get("verdict") == "fail" for r in c.get("records", [])):
            raise error(f"case {one_line(c['id'], 120)!r} is 'pass' but holds a failing record: the summary "
                        f"contradicts itself (edited after verify wrote it?); rerun gdncheck verify")
    counted, claimed = _counted(doc["cases"]), doc.get("totals") or {}
    wrong = [k for k, v in counted.items() if claimed.get(k) != v]
    if wrong:
        k = wrong[0]
        raise error(f"the summary's totals say {k} {claimed.get(k)!r}, its cases count {counted[k]}: the summary "
                    f"contradicts itself (edited after verify wrote it?); rerun gdncheck verify")
    code, verdict = doc.get("exit_code"), doc.get("verdict")
    allowed, why = worst_exit(doc)
    if code not in VERDICTS or verdict not in VERDICTS[code]:
        raise error(f"the summary's verdict {one_line(verdict, 60)!r} is not that of its exit code {code!r} "
                    f"(expected one of {', '.join(repr(v) for vs in VERDICTS.values() for v in vs)} with its code)")
    if code < allowed:
        raise error(f"the summary says {verdict!r} (exit {code}), but its cases allow at best "
                    f"{VERDICTS[allowed][0]!r} (exit {allowed}): {why}; a headline its cases contradict is refused "
                    f"(rerun gdncheck verify)")


def checked_repros(doc: dict) -> int:
    """Every case's ``repro`` as gdncheck writes one (:func:`checked_repro`), or None; how many were
    withheld (a repro that is not a gdncheck command line: a pasted pipeline, another program)."""
    withheld = 0
    for c in doc["cases"]:
        if c.get("repro") is None:
            continue
        line = checked_repro(c["repro"])
        if line is None:
            withheld += 1
            c["repro"] = None
        else:
            c["repro"] = line
    return withheld
